"""SPEC §3 rules on the pure session transform, in both engines: Spark's pass, and the driver's
over Arrow rows (`transforms/sessions_rows.py`, what a small run computes with)."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from sessionize_assets.lake.tables import EVENTS
from sessionize_assets.transforms.attributes import event_attributes
from sessionize_assets.transforms.sessions import (
    SESSION_EVENT_COLUMNS,
    build_sessions,
    split_quarantine,
)
from sessionize_assets.transforms.sessions_rows import sessions_with_quarantine_rows

CONVERSIONS = ("Order Completed",)
GAP = timedelta(minutes=30)
MAX = timedelta(hours=24)
DAY = date(2026, 1, 5)

pytestmark = pytest.mark.parametrize("engine", ["spark", "driver"])


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def with_event_columns(df):
    """`df` with the rest of `SESSION_EVENT_COLUMNS` as nulls of their `events` types."""
    types = {f.name: f.dataType for f in EVENTS.schema}
    missing = [c for c in SESSION_EVENT_COLUMNS if c not in df.columns]
    return df.select("*", *(F.lit(None).cast(types[c]).alias(c) for c in missing))


def built(spark, engine, events, **options):
    """The sessions and quarantine rows of an events frame, by `engine`, ordered; the driver's
    rows read back through Spark, as its own are collected."""
    if engine == "spark":
        sessions, quarantine = build_sessions(events, **options)
    else:
        rows = sessions_with_quarantine_rows(events.toArrow(), **options)
        sessions, quarantine = split_quarantine(spark.createDataFrame(rows))
    return tuple(
        sorted(frame.collect(), key=lambda r: (r.user_id, r.session_start))
        for frame in (sessions, quarantine)
    )


def sessions_of(spark, engine, events, *, dates=None, gap=GAP, max_length=MAX):
    df = spark.createDataFrame(
        [(f"e{i}" if len(e) == 2 else e[2], e[0], at(e[1])) for i, e in enumerate(events)],
        "event_id string, user_id string, event_ts timestamp",
    )
    return built(
        spark,
        engine,
        with_event_columns(df),
        gap=gap,
        max_length=max_length,
        conversion_events=CONVERSIONS,
        session_dates=dates,
    )


def test_gap_of_exactly_g_stays_in_the_session(spark, engine):
    rows, _ = sessions_of(
        spark,
        engine,
        [("u", "2026-01-05 10:00:00"), ("u", "2026-01-05 10:30:00"), ("u", "2026-01-05 11:00:01")],
    )
    assert [(r.event_count, r.session_start, r.session_end) for r in rows] == [
        (2, at("2026-01-05 10:00:00"), at("2026-01-05 10:30:00")),
        (1, at("2026-01-05 11:00:01"), at("2026-01-05 11:00:01")),
    ]


def test_a_microsecond_past_the_gap_starts_a_new_session(spark, engine):
    rows, _ = sessions_of(
        spark, engine, [("u", "2026-01-05 10:00:00"), ("u", "2026-01-05 10:30:00.000001")]
    )
    assert len(rows) == 2


def test_identical_timestamps_count_once_each(spark, engine):
    rows, _ = sessions_of(
        spark,
        engine,
        [("u", "2026-01-05 10:00:00", "b"), ("u", "2026-01-05 10:00:00", "a")],
    )
    assert len(rows) == 1 and rows[0].event_count == 2 and rows[0].duration_seconds == 0.0


def test_sessions_span_midnight_and_belong_to_their_start_date(spark, engine):
    rows, _ = sessions_of(
        spark,
        engine,
        [("u", "2026-01-05 23:50:00"), ("u", "2026-01-06 00:15:00"), ("u", "2026-01-06 00:40:00")],
    )
    assert len(rows) == 1
    assert rows[0].session_date == DAY and rows[0].event_count == 3
    assert rows[0].duration_seconds == 50 * 60


def test_session_number_ranks_a_users_sessions_within_the_day(spark, engine):
    rows, _ = sessions_of(
        spark,
        engine,
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


def test_session_id_is_deterministic_and_depends_on_user_and_start(spark, engine):
    events = [("u", "2026-01-05 08:00:00"), ("v", "2026-01-05 08:00:00")]
    first, _ = sessions_of(spark, engine, events)
    again, _ = sessions_of(spark, engine, list(reversed(events)))
    assert [r.session_id for r in first] == [r.session_id for r in again]
    assert first[0].session_id != first[1].session_id


def test_bot_past_the_maximum_length_is_quarantined(spark, engine):
    start = at("2026-01-05 00:00:00")
    bot = [("bot", (start + timedelta(minutes=20 * i)).isoformat(sep=" ")) for i in range(80)]
    # 80 events 20 min apart: 26h20m of activity; then a pause, then a normal session.
    bot.append(("bot", "2026-01-06 03:00:00"))
    rows, quarantine = sessions_of(spark, engine, bot)

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


def test_an_event_exactly_at_the_cap_is_included(spark, engine):
    rows, quarantine = sessions_of(
        spark,
        engine,
        [("u", "2026-01-05 10:00:00"), ("u", "2026-01-05 10:20:00")],
        max_length=timedelta(minutes=20),
    )
    assert rows[0].event_count == 2 and not rows[0].is_quarantined and quarantine == []


def test_only_requested_dates_are_returned(spark, engine):
    rows, _ = sessions_of(
        spark,
        engine,
        [("u", "2026-01-04 10:00:00"), ("u", "2026-01-05 10:00:00"), ("u", "2026-01-06 10:00:00")],
        dates=[DAY],
    )
    assert [r.session_date for r in rows] == [DAY]


@pytest.mark.parametrize("gap_minutes", [10, 60])
def test_gap_is_a_parameter(spark, engine, gap_minutes):
    rows, _ = sessions_of(
        spark,
        engine,
        [("u", "2026-01-05 10:00:00"), ("u", "2026-01-05 10:40:00")],
        gap=timedelta(minutes=gap_minutes),
    )
    assert len(rows) == (2 if gap_minutes < 40 else 1)


# -- SPEC §3b: the attributes, picked among a session's included events ------------------------


def attributed_sessions(spark, engine, events, *, max_length=MAX, conversions=CONVERSIONS):
    """Sessions of events given as (id, time, type, name, properties, context), one user."""
    rows = []
    for event_id, ts, event_type, name, properties, context in events:
        a = event_attributes(properties, context)
        rows.append(
            (
                event_id,
                "u",
                at(ts),
                event_type,
                name,
                a.page_url,
                a.page_path,
                a.page_referrer,
                a.page_host,
                a.referrer_host,
                a.campaign,
                a.url_campaign,
                a.device_type,
                a.os_name,
            )
        )
    types = {f.name: f.dataType for f in EVENTS.schema}
    schema = StructType(
        [
            StructField(name, types[name])
            for name in SESSION_EVENT_COLUMNS
            if name not in ("user_id", "event_ts", "event_id", "event_date")
        ]
    )
    df = spark.createDataFrame(
        rows,
        StructType(
            [
                StructField("event_id", StringType()),
                StructField("user_id", StringType()),
                StructField("event_ts", TimestampType()),
                *schema.fields,
            ]
        ),
    ).withColumn("event_date", F.to_date("event_ts"))
    sessions, _ = built(
        spark, engine, df, gap=GAP, max_length=max_length, conversion_events=conversions
    )
    return sessions


def page(url=None, referrer=None, **context):
    return {"url": url, "referrer": referrer}, context


def test_landing_exit_referrer_and_campaign_come_from_the_page_events(spark, engine):
    landing = page("https://www.shop.example/a?utm_source=news&utm_medium=Email", "https://t.co/x")
    (session,) = attributed_sessions(
        spark,
        engine,
        [
            ("e1", "2026-01-05 10:00:00", "track", "Clicked", {}, {"os": {"name": "iOS"}}),
            ("e2", "2026-01-05 10:01:00", "page", None, *landing),
            ("e3", "2026-01-05 10:02:00", "screen", None, {}, {}),
            ("e4", "2026-01-05 10:03:00", "page", None, *page("https://shop.example/b")),
            ("e5", "2026-01-05 10:04:00", "track", "Order Completed", {}, {}),
        ],
    )
    assert (session.page_views, session.conversions, session.is_engaged) == (3, 1, True)
    assert session.landing_page_url == "https://www.shop.example/a?utm_source=news&utm_medium=Email"
    assert session.exit_page_url == "https://shop.example/b"
    assert (session.referrer, session.referrer_host) == ("https://t.co/x", "t.co")
    assert (session.utm_source, session.utm_medium, session.utm_campaign) == ("news", "Email", None)
    assert session.channel == "Email"  # the medium decides before the social referrer
    assert (session.device_type, session.os_name) == (None, "iOS")  # the first event's


def test_a_campaign_object_wins_over_the_landing_urls_parameters_from_any_event(spark, engine):
    (session,) = attributed_sessions(
        spark,
        engine,
        [
            (
                "e1",
                "2026-01-05 10:00:00",
                "page",
                None,
                *page("https://shop.example/?utm_medium=cpc"),
            ),
            ("e2", "2026-01-05 10:00:05", "track", "x", {}, {"campaign": {"name": "spring"}}),
            ("e3", "2026-01-05 10:00:06", "track", "y", {}, {"campaign": {"medium": "email"}}),
        ],
    )
    assert (session.utm_medium, session.utm_campaign) == (None, "spring")
    assert session.channel == "Direct" and not session.is_engaged  # 6 s, 1 page view


def test_an_internal_referrer_is_no_referrer_and_a_search_host_is_organic_search(spark, engine):
    internal, search = attributed_sessions(
        spark,
        engine,
        [
            (
                "e1",
                "2026-01-05 10:00:00",
                "page",
                None,
                *page("https://shop.example/", "https://www.shop.example/"),
            ),
            (
                "e2",
                "2026-01-05 12:00:00",
                "page",
                None,
                *page("https://shop.example/", "https://www.google.de/"),
            ),
        ],
    )
    assert (internal.referrer_host, internal.channel) == ("shop.example", "Direct")
    assert (search.referrer_host, search.channel) == ("google.de", "Organic Search")


def test_events_past_the_cap_count_for_nothing(spark, engine):
    (session,) = attributed_sessions(
        spark,
        engine,
        [
            ("e1", "2026-01-05 10:00:00", "track", "x", {}, {"userAgent": "Mozilla"}),
            ("e2", "2026-01-05 10:00:05", "page", None, *page("https://shop.example/in")),
            ("e3", "2026-01-05 10:00:20", "page", None, *page("https://shop.example/out")),
            ("e4", "2026-01-05 10:00:30", "track", "Order Completed", {}, {}),
        ],
        max_length=timedelta(seconds=10),
    )
    assert session.is_quarantined and session.event_count == 2
    assert (session.page_views, session.conversions) == (1, 0)
    assert session.landing_page_url == session.exit_page_url == "https://shop.example/in"
    assert session.device_type == "web" and not session.is_engaged  # 5 s


def test_a_session_without_page_events_has_no_pages_and_ties_break_on_the_event_id(spark, engine):
    (session,) = attributed_sessions(
        spark,
        engine,
        [
            ("b", "2026-01-05 10:00:00", "track", "Signed Up", {}, {"device": {"type": "ios"}}),
            ("a", "2026-01-05 10:00:00", "track", "Signed Up", {}, {"device": {"type": "android"}}),
        ],
        conversions=("Signed Up",),
    )
    assert session.landing_page_url is None and session.exit_page_url is None
    assert session.channel == "Direct" and session.conversions == 2 and session.is_engaged
    assert session.device_type == "android"
