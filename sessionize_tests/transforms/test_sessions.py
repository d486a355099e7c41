"""SPEC §3 rules on the pure session transform."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import pytest

from sessionize_assets.transforms.sessions import build_sessions

GAP = timedelta(minutes=30)
MAX = timedelta(hours=24)
DAY = date(2026, 1, 5)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def sessions_of(spark, events, *, dates=None, gap=GAP, max_length=MAX):
    df = spark.createDataFrame(
        [(f"e{i}" if len(e) == 2 else e[2], e[0], at(e[1])) for i, e in enumerate(events)],
        "event_id string, user_id string, event_ts timestamp",
    )
    sessions, quarantine = build_sessions(df, gap=gap, max_length=max_length, session_dates=dates)
    rows = sorted(sessions.collect(), key=lambda r: (r.user_id, r.session_start))
    return rows, sorted(quarantine.collect(), key=lambda r: (r.user_id, r.session_start))


def test_gap_of_exactly_g_stays_in_the_session(spark):
    rows, _ = sessions_of(
        spark,
        [("u", "2026-01-05 10:00:00"), ("u", "2026-01-05 10:30:00"), ("u", "2026-01-05 11:00:01")],
    )
    assert [(r.event_count, r.session_start, r.session_end) for r in rows] == [
        (2, at("2026-01-05 10:00:00"), at("2026-01-05 10:30:00")),
        (1, at("2026-01-05 11:00:01"), at("2026-01-05 11:00:01")),
    ]


def test_a_microsecond_past_the_gap_starts_a_new_session(spark):
    rows, _ = sessions_of(
        spark, [("u", "2026-01-05 10:00:00"), ("u", "2026-01-05 10:30:00.000001")]
    )
    assert len(rows) == 2


def test_identical_timestamps_count_once_each(spark):
    rows, _ = sessions_of(
        spark,
        [("u", "2026-01-05 10:00:00", "b"), ("u", "2026-01-05 10:00:00", "a")],
    )
    assert len(rows) == 1 and rows[0].event_count == 2 and rows[0].duration_seconds == 0.0


def test_sessions_span_midnight_and_belong_to_their_start_date(spark):
    rows, _ = sessions_of(
        spark,
        [("u", "2026-01-05 23:50:00"), ("u", "2026-01-06 00:15:00"), ("u", "2026-01-06 00:40:00")],
    )
    assert len(rows) == 1
    assert rows[0].session_date == DAY and rows[0].event_count == 3
    assert rows[0].duration_seconds == 50 * 60


def test_session_number_ranks_a_users_sessions_within_the_day(spark):
    rows, _ = sessions_of(
        spark,
        [
            ("u", "2026-01-05 08:00:00"),
            ("u", "2026-01-05 12:00:00"),
            ("u", "2026-01-05 18:00:00"),
            ("u", "2026-01-06 01:00:00"),
            ("v", "2026-01-05 09:00:00"),
        ],
    )
    assert [(r.user_id, str(r.session_date), r.session_number) for r in rows] == [
        ("u", "2026-01-05", 1),
        ("u", "2026-01-05", 2),
        ("u", "2026-01-05", 3),
        ("u", "2026-01-06", 1),
        ("v", "2026-01-05", 1),
    ]


def test_session_id_is_deterministic_and_depends_on_user_and_start(spark):
    events = [("u", "2026-01-05 08:00:00"), ("v", "2026-01-05 08:00:00")]
    first, _ = sessions_of(spark, events)
    again, _ = sessions_of(spark, list(reversed(events)))
    assert [r.session_id for r in first] == [r.session_id for r in again]
    assert first[0].session_id != first[1].session_id


def test_bot_past_the_maximum_length_is_quarantined(spark):
    start = at("2026-01-05 00:00:00")
    bot = [("bot", (start + timedelta(minutes=20 * i)).isoformat(sep=" ")) for i in range(80)]
    # 80 events 20 min apart: 26h20m of activity; then a pause, then a normal session.
    bot.append(("bot", "2026-01-06 03:00:00"))
    rows, quarantine = sessions_of(spark, bot)

    capped, after = rows
    assert capped.is_quarantined and capped.session_start == start
    assert capped.event_count == 73  # 00:00 .. 24:00 inclusive, every 20 minutes
    assert capped.session_end == at("2026-01-06 00:00:00")
    # Events past the cap belong to no session; the chain only ends at the pause.
    assert not after.is_quarantined and after.session_start == at("2026-01-06 03:00:00")
    assert len(quarantine) == 1
    q = quarantine[0]
    assert q.session_id == capped.session_id and q.capped_at == at("2026-01-06 00:00:00")
    assert q.excluded_events == 7 and q.chain_end == at("2026-01-06 02:20:00")


def test_an_event_exactly_at_the_cap_is_included(spark):
    rows, quarantine = sessions_of(
        spark,
        [("u", "2026-01-05 10:00:00"), ("u", "2026-01-05 10:20:00")],
        max_length=timedelta(minutes=20),
    )
    assert rows[0].event_count == 2 and not rows[0].is_quarantined and quarantine == []


def test_only_requested_dates_are_returned(spark):
    rows, _ = sessions_of(
        spark,
        [("u", "2026-01-04 10:00:00"), ("u", "2026-01-05 10:00:00"), ("u", "2026-01-06 10:00:00")],
        dates=[DAY],
    )
    assert [r.session_date for r in rows] == [DAY]


@pytest.mark.parametrize("gap_minutes", [10, 60])
def test_gap_is_a_parameter(spark, gap_minutes):
    rows, _ = sessions_of(
        spark,
        [("u", "2026-01-05 10:00:00"), ("u", "2026-01-05 10:40:00")],
        gap=timedelta(minutes=gap_minutes),
    )
    assert len(rows) == (2 if gap_minutes < 40 else 1)
