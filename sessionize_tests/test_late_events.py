"""The five ways a late event changes sessions (SPEC §3), and a late first page event's
attributes (§3b): the incremental tables always equal a full recompute."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from sessionize_assets.lake.delta_spark.store import DeltaSparkStore
from sessionize_assets.lake.tables import (
    SESSION_QUARANTINE,
    SESSIONS,
    SESSIONS_FILE_ROWS,
)
from sessionize_assets.pipeline import sessions as sessions_pipeline
from sessionize_assets.pipeline import sessions_events
from sessionize_assets.transforms.sessions import sessions_with_quarantine
from sessionize_tests.conftest import make_settings
from sessionize_tests.harness import Pipeline, day
from sessionize_tests.table_rows import table_rows

# Minutes of batches in all: started first (conftest.py).
pytestmark = pytest.mark.slow


def _every(user: str, first: str, last: str, minutes: int) -> list[tuple]:
    """`user`'s events from `first` to `last` ('YYYY-MM-DD HH:MM'), `minutes` apart."""
    start, end = datetime.fromisoformat(first), datetime.fromisoformat(last)
    count = int((end - start) / timedelta(minutes=minutes)) + 1
    return [
        (f"{user}-{i}", user, (start + i * timedelta(minutes=minutes)).isoformat(sep=" "))
        for i in range(count)
    ]


def test_only_late_events_away_from_every_old_chain_skip_the_history(
    spark, tmp_path, additions_at_any_size
):
    """A user's late events more than the gap from each of their old chains, or all within
    the gap of one old session (merged into it from its row), have their pairs updated from
    the old rows and the added events; any other pair is recomputed from `events`: an event
    near a quarantined chain's end (which the session's own end, its last included event,
    does not show), and a new day's."""
    pipeline = Pipeline(spark, make_settings(tmp_path, max_session_length=timedelta(hours=2)))
    pipeline.land(
        day(0),
        [
            ("iso-a", "iso", "2026-01-10 08:00"),
            ("iso-b", "iso", "2026-01-10 12:00"),
            ("near-a", "near", "2026-01-10 08:00"),
            ("near-b", "near", "2026-01-10 08:10"),
            *_every("bot", "2026-01-10 00:00", "2026-01-10 03:00", 20),  # capped at 02:00
            *_every("oldbot", "2026-01-10 00:00", "2026-01-10 03:00", 20),
            ("newbot-a", "newbot", "2026-01-10 08:00"),
            ("mid-a", "mid", "2026-01-10 20:00"),
        ],
    )
    pipeline.process(day(0))
    pipeline.land(day(1), [("mid-b", "mid", "2026-01-11 03:00")])
    pipeline.process(day(1))
    quarantined = _quarantine_rows(pipeline, "oldbot")
    assert len(quarantined) == 1
    pipeline.land(
        day(5),
        [
            ("iso-now", "iso", "2026-01-15 09:00"),  # on time: its new day is computed whole
            ("iso-c", "iso", "2026-01-10 10:00"),
            ("iso-d", "iso", "2026-01-10 10:20"),
            ("near-c", "near", "2026-01-10 08:35"),  # 25 minutes after its session's end
            ("bot-late", "bot", "2026-01-10 03:25"),  # 25 minutes after its chain's end
            ("oldbot-late", "oldbot", "2026-01-10 06:00"),  # its quarantined chain kept whole
            # A chain of added events alone, past the cap: quarantined from the additions.
            *_every("newbot", "2026-01-10 14:00", "2026-01-10 17:00", 20),
            ("mid-c", "mid", "2026-01-10 23:50"),  # with the next: across midnight
            ("mid-d", "mid", "2026-01-11 00:15"),
        ],
    )
    run = pipeline.process(day(5))
    # iso's, oldbot's, newbot's, mid's and near's pairs of 01-09 .. 01-11 (and mid's 01-12)
    # from their old rows and added events (near's session merged with its event); bot's and
    # iso's new day from their events.
    assert (run.sessions.users_from_additions, run.sessions.users_recomputed) == (5, 2)
    assert run.sessions.pairs_from_additions == 16
    assert run.sessions.inserted == 5  # iso's two, oldbot's, newbot's and mid's new sessions
    assert _quarantine_rows(pipeline, "oldbot") == quarantined
    pipeline.assert_equals_full_recompute()


def _quarantine_rows(pipeline: Pipeline, user: str) -> list[tuple]:
    return sorted(
        (r.session_id, r.session_start, r.capped_at, r.chain_end, r.excluded_events)
        for r in table_rows(pipeline.store, SESSION_QUARANTINE)
        if r.user_id == user
    )


def test_late_event_merges_two_sessions(pipeline, pair_placement):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00"), ("b", "u", "2026-01-10 10:50")])
    pipeline.process(day(0))
    assert [s[1] for s in pipeline.sessions()] == ["2026-01-10 10:00:00", "2026-01-10 10:50:00"]

    pipeline.land(day(3), [("c", "u", "2026-01-10 10:25")])
    run = pipeline.process(day(3))

    assert pipeline.sessions() == [("u", "2026-01-10 10:00:00", "2026-01-10 10:50:00", 3, 1, False)]
    pipeline.assert_equals_full_recompute()
    assert (run.sessions.users_recomputed, run.sessions.users_from_additions) == (1, 0)
    assert pipeline.changes("run-2") == [
        ("added", "2026-01-10 10:00:00", 3),
        ("removed", "2026-01-10 10:00:00", 1),
        ("removed", "2026-01-10 10:50:00", 1),
    ]


def test_a_run_that_keeps_more_events_than_the_driver_builds_reads_them_again_in_spark(
    pipeline, monkeypatch
):
    """EVENTS_BUILT_ON_DRIVER 2: the first batch's two events are built on the driver; the
    late batch's run reads three (its touched pair's), too many, and Spark reads and builds
    them instead. Both equal the full recompute."""
    monkeypatch.setattr(sessions_events, "EVENTS_BUILT_ON_DRIVER", 2)
    spark_passes = []

    def spark_pass(*args, **kwargs):
        spark_passes.append(kwargs["session_dates"])
        return sessions_with_quarantine(*args, **kwargs)

    monkeypatch.setattr(sessions_pipeline, "sessions_with_quarantine", spark_pass)
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00"), ("b", "u", "2026-01-10 10:50")])
    pipeline.process(day(0))
    assert spark_passes == []
    pipeline.land(day(3), [("c", "u", "2026-01-10 10:25")])
    run = pipeline.process(day(3))
    assert len(spark_passes) == 1 and run.sessions.events_read == 3
    assert pipeline.sessions() == [("u", "2026-01-10 10:00:00", "2026-01-10 10:50:00", 3, 1, False)]
    pipeline.assert_equals_full_recompute()


# The late first page event of the attributes case: an ad's landing page, from Google.
AD_LANDING = "https://shop.example/sale?utm_source=ads&utm_medium=CPC"


def _assert_landed_from_the_ad(session) -> None:
    """The session's attributes once the ad's page event (AD_LANDING) came in late, before
    the page and the cart it had."""
    assert (session.landing_page_url, session.referrer_host, session.utm_source) == (
        AD_LANDING,
        "google.de",
        "ads",
    )
    assert session.channel == "Paid Search"
    assert (session.page_views, session.exit_page_url) == (3, "https://shop.example/cart")


def page(url: str, referrer: str | None = None) -> dict:
    """A page view's message fields."""
    return {"type": "page", "properties": {"url": url, "referrer": referrer}}


def test_a_late_first_page_event_changes_the_landing_page_and_channel(pipeline):
    """SPEC §3b: the batch that delivers a session's new first page event gives the session
    that page's landing URL, referrer, campaign and channel."""
    pipeline.land(
        day(0),
        [
            ("b", "u", "2026-01-10 10:10", page("https://shop.example/p", "https://t.co/x")),
            ("c", "u", "2026-01-10 10:12", page("https://shop.example/cart")),
        ],
    )
    pipeline.process(day(0))
    before = pipeline.store.read(SESSIONS).collect()
    assert [(r.landing_page_url, r.referrer_host, r.channel) for r in before] == [
        ("https://shop.example/p", "t.co", "Organic Social")
    ]
    pipeline.land(
        day(2), [("a", "u", "2026-01-10 10:00", page(AD_LANDING, "https://www.google.de/"))]
    )
    pipeline.process(day(2))
    (after,) = pipeline.store.read(SESSIONS).collect()
    _assert_landed_from_the_ad(after)
    pipeline.assert_equals_full_recompute()


def test_late_event_inside_a_session_only_extends_its_count(pipeline):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00"), ("b", "u", "2026-01-10 10:20")])
    pipeline.process(day(0))
    pipeline.land(day(1), [("c", "u", "2026-01-10 10:10")])
    pipeline.process(day(1))
    assert pipeline.sessions() == [("u", "2026-01-10 10:00:00", "2026-01-10 10:20:00", 3, 1, False)]
    pipeline.assert_equals_full_recompute()


def test_late_event_creates_a_session_between_two_and_renumbers(pipeline, additions_at_any_size):
    pipeline.land(day(0), [("a", "u", "2026-01-10 08:00"), ("b", "u", "2026-01-10 12:00")])
    pipeline.process(day(0))
    pipeline.land(day(2), [("c", "u", "2026-01-10 10:00")])
    run = pipeline.process(day(2))
    assert [(s[1][11:16], s[4]) for s in pipeline.sessions()] == [
        ("08:00", 1),
        ("10:00", 2),
        ("12:00", 3),
    ]
    pipeline.assert_equals_full_recompute()
    # Two hours from each of its neighbours: a session of its own, from the old rows and the
    # added event, without reading the user's events.
    assert (run.sessions.users_from_additions, run.sessions.users_recomputed) == (1, 0)


def test_late_event_joins_the_previous_days_session_across_midnight(pipeline):
    pipeline.land(day(0), [("a", "u", "2026-01-10 23:50")])
    pipeline.land(day(1), [("b", "u", "2026-01-11 00:30")], name="b.jsonl")
    pipeline.process(day(0))
    pipeline.process(day(1))
    assert len(pipeline.sessions()) == 2

    pipeline.land(day(5), [("c", "u", "2026-01-11 00:10")])
    pipeline.process(day(5))

    assert pipeline.sessions() == [("u", "2026-01-10 23:50:00", "2026-01-11 00:30:00", 3, 1, False)]
    pipeline.assert_equals_full_recompute()


def test_late_event_pulls_the_next_days_session_in(pipeline):
    pipeline.land(day(0), [("a", "u", "2026-01-10 23:00")])
    pipeline.land(day(1), [("b", "u", "2026-01-11 00:20")])
    pipeline.process(day(0))
    pipeline.process(day(1))
    assert [s[1][:10] for s in pipeline.sessions()] == ["2026-01-10", "2026-01-11"]

    pipeline.land(day(4), [("c", "u", "2026-01-10 23:55")])
    pipeline.process(day(4))

    assert pipeline.sessions() == [
        ("u", "2026-01-10 23:00:00", "2026-01-10 23:00:00", 1, 1, False),
        ("u", "2026-01-10 23:55:00", "2026-01-11 00:20:00", 2, 2, False),
    ]
    pipeline.assert_equals_full_recompute()


def _three_files_of_users(pipeline) -> set[str]:
    """2026-01-10 with a session for each of 1,010 users: three user-range sessions files
    (`user-00000` .. `user-01009`), processed; its files."""
    users = 2 * SESSIONS_FILE_ROWS + 10
    pipeline.land(
        day(0),
        [(f"m{i}", f"user-{i:05d}", f"2026-01-10 {8 + i % 10:02d}:00") for i in range(users)],
    )
    pipeline.process(day(0))
    files = set(pipeline.store.live_files(SESSIONS))
    assert len(files) == 3
    return files


def test_a_late_event_rewrites_only_its_users_file(pipeline):
    before = _three_files_of_users(pipeline)
    pipeline.land(day(2), [("late", "user-00003", "2026-01-10 11:10")])
    run = pipeline.process(day(2))
    # One user, on the session days an event on 01-10 can decide: 01-08 .. 01-11.
    assert run.sessions.users_recomputed == 1 and run.sessions.pairs_recomputed == 4
    assert (run.sessions.inserted, run.sessions.replaced, run.sessions.removed) == (0, 1, 0)
    assert run.sessions.files_rewritten == 1 and run.sessions.files_total == 3
    assert run.sessions.files_searched == 1  # the one holding the user's session
    assert len(before & set(pipeline.store.live_files(SESSIONS))) == 2  # the others kept
    assert run.events.new_events == 1 and run.events.rows_written == 1  # appended, not rewritten
    pipeline.assert_equals_full_recompute()


def test_a_late_session_of_a_user_new_to_its_day_searches_no_file(pipeline):
    """The files a rewrite searches are those holding an old row of a changed pair, found
    when the change is computed: a user's first session of a day (the common late event
    of a long history) adds a file and reads none, though the user's id is within a file's
    range of ids on that day."""
    before = _three_files_of_users(pipeline)
    pipeline.land(day(2), [("late", "user-00003x", "2026-01-10 11:10")])
    run = pipeline.process(day(2))
    assert (run.sessions.inserted, run.sessions.replaced, run.sessions.removed) == (1, 0, 0)
    assert run.sessions.files_searched == 0 and run.sessions.files_rewritten == 0
    assert before < set(pipeline.store.live_files(SESSIONS))  # one file added, none replaced
    pipeline.assert_equals_full_recompute()


# The five cases above run on the embedded store, one lake each. On the delta-spark backend
# (Delta Spark's MERGE and overwrite write every change) they run together: one user each, in
# the same three batches, which bring every case its late event at once. Each ends as it does
# alone, and the lake equals the full recompute.
ON_DELTA_SPARK = pytest.mark.parametrize(
    "pipeline", [DeltaSparkStore], ids=["delta-spark"], indirect=True
)


@ON_DELTA_SPARK
def test_the_five_cases_at_once_on_the_delta_spark_backend(
    pipeline: Pipeline, additions_at_any_size: None
):
    pipeline.land(
        day(0),
        [
            ("merge-a", "merge", "2026-01-10 10:00"),
            ("merge-b", "merge", "2026-01-10 10:50"),
            (
                "page-b",
                "page",
                "2026-01-10 10:10",
                page("https://shop.example/p", "https://t.co/x"),
            ),
            ("page-c", "page", "2026-01-10 10:12", page("https://shop.example/cart")),
            ("between-a", "between", "2026-01-10 08:00"),
            ("between-b", "between", "2026-01-10 12:00"),
            ("midnight-a", "midnight", "2026-01-10 23:50"),
            ("pull-a", "pull", "2026-01-10 23:00"),
        ],
    )
    pipeline.land(
        day(1),
        [("midnight-b", "midnight", "2026-01-11 00:30"), ("pull-b", "pull", "2026-01-11 00:20")],
    )
    pipeline.process(day(0))
    pipeline.process(day(1))

    def sessions(user: str) -> list[tuple]:
        return [s for s in pipeline.sessions() if s[0] == user]

    def attributes(user: str):
        (row,) = [r for r in pipeline.store.read(SESSIONS).collect() if r.user_id == user]
        return row

    assert [s[1] for s in sessions("merge")] == ["2026-01-10 10:00:00", "2026-01-10 10:50:00"]
    before = attributes("page")
    assert (before.landing_page_url, before.referrer_host, before.channel) == (
        "https://shop.example/p",
        "t.co",
        "Organic Social",
    )
    assert len(sessions("midnight")) == 2
    assert [s[1][:10] for s in sessions("pull")] == ["2026-01-10", "2026-01-11"]

    pipeline.land(
        day(2),
        [
            ("merge-c", "merge", "2026-01-10 10:25"),
            ("page-a", "page", "2026-01-10 10:00", page(AD_LANDING, "https://www.google.de/")),
            ("between-c", "between", "2026-01-10 10:00"),
            ("midnight-c", "midnight", "2026-01-11 00:10"),
            ("pull-c", "pull", "2026-01-10 23:55"),
        ],
    )
    run = pipeline.process(day(2))

    assert sessions("merge") == [
        ("merge", "2026-01-10 10:00:00", "2026-01-10 10:50:00", 3, 1, False)
    ]
    # Updated from their old rows and added events: "between" gained a session of its own,
    # more than the gap from its others; "page"'s and "pull"'s events each joined one old
    # session (merged from its row: a new landing page, a start on the day before). "merge"
    # and "midnight", whose events join two sessions, recomputed from their events.
    assert (run.sessions.users_recomputed, run.sessions.users_from_additions) == (2, 3)
    assert pipeline.changes("run-3", user="merge") == [
        ("added", "2026-01-10 10:00:00", 3),
        ("removed", "2026-01-10 10:00:00", 1),
        ("removed", "2026-01-10 10:50:00", 1),
    ]
    after = attributes("page")
    _assert_landed_from_the_ad(after)
    assert [(s[1][11:16], s[4]) for s in sessions("between")] == [
        ("08:00", 1),
        ("10:00", 2),
        ("12:00", 3),
    ]
    assert sessions("midnight") == [
        ("midnight", "2026-01-10 23:50:00", "2026-01-11 00:30:00", 3, 1, False)
    ]
    assert sessions("pull") == [
        ("pull", "2026-01-10 23:00:00", "2026-01-10 23:00:00", 1, 1, False),
        ("pull", "2026-01-10 23:55:00", "2026-01-11 00:20:00", 2, 2, False),
    ]
    pipeline.assert_equals_full_recompute()
