"""Late data, batch by batch: the incremental tables always equal a full recompute."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import date, datetime, timedelta

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_assets.lake.store import WriteConflictError
from sessionize_assets.lake.tables import (
    EVENTS,
    REJECTED_EVENTS,
    SESSION_CHANGES,
    SESSIONS,
    USER_LIFECYCLE_SNAPSHOT,
    USER_LIFECYCLE_STATE,
)
from sessionize_assets.partitions import session_dates_for
from sessionize_assets.pipeline.events import update_events
from sessionize_assets.pipeline.identities import update_identities
from sessionize_assets.pipeline.ingest import ingest_batches
from sessionize_assets.pipeline.landing import fingerprint
from sessionize_assets.pipeline.lifecycle.update import update_lifecycle
from sessionize_assets.pipeline.sessions import update_sessions
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_tests.driver import process_batch
from sessionize_tests.full_recompute import intervals
from sessionize_tests.harness import Killed, KilledBeforeCommitTo, Pipeline, day

# Minutes of batches in all: started first (conftest.py).
pytestmark = pytest.mark.slow


def test_a_run_killed_between_the_sessions_commit_and_its_log_is_logged_by_the_next(
    pipeline, spark
):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00"), ("b", "u", "2026-01-10 10:50")])
    pipeline.process(day(0))
    pipeline.land(day(3), [("c", "u", "2026-01-10 10:25")])
    killed = KilledBeforeCommitTo(pipeline.store, "session_changes")
    with pytest.raises(Killed):
        process_batch(killed, spark, settings=pipeline.settings, received=day(3), run_id="k")
    merged = pipeline.store.version(SESSIONS)

    run = pipeline.process(day(3))  # the retry: its rows compare equal, the log says otherwise

    assert run.sessions.versions_logged_late == [merged]
    assert pipeline.changes("run-2") == [
        ("added", "2026-01-10 10:00:00", 3),
        ("removed", "2026-01-10 10:00:00", 1),
        ("removed", "2026-01-10 10:50:00", 1),
    ]
    pipeline.assert_equals_full_recompute()
    assert pipeline.process(day(3)).sessions.versions_logged_late == []


def test_duplicates_across_batches_whatever_the_order(pipeline, pair_placement):
    pipeline.land(day(0), [("x", "u", "2026-01-10 10:00"), ("y", "u", "2026-01-10 10:05")])
    pipeline.land(day(2), [("x", "u", "2026-01-10 10:00"), ("z", "v", "2026-01-12 09:00")])
    pipeline.process(day(2))  # the later batch first: its copy of x wins for now
    pipeline.process(day(0))  # the earlier batch arrives: its copy wins, day(2)'s is rejected
    pipeline.assert_equals_full_recompute()
    dup = pipeline.store.read(REJECTED_EVENTS).where("reason = 'duplicate'").collect()
    assert [(r.message_id, r.received_date) for r in dup] == [("x", day(2))]
    assert json.loads(dup[0].raw_line)["messageId"] == "x"


def test_batches_in_any_order_converge(pipeline, pair_placement):
    batches = {
        day(0): [("a", "u", "2026-01-10 10:00"), ("b", "v", "2026-01-10 23:45")],
        day(1): [("c", "v", "2026-01-11 00:05"), ("d", "u", "2026-01-10 10:40")],
        day(3): [("e", "u", "2026-01-10 10:20"), ("f", "v", "2026-01-11 00:35")],
    }
    for received, events in batches.items():
        pipeline.land(received, events)
    for received in (day(3), day(0), day(1)):
        pipeline.process(received)
    pipeline.assert_equals_full_recompute()


def test_redelivered_batch_replaces_what_it_brought(pipeline, pair_placement):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00"), ("b", "u", "2026-01-10 10:20")])
    pipeline.land(day(1), [("c", "u", "2026-01-10 10:40"), ("d", "u", "2026-01-11 09:00")])
    pipeline.process(day(0))
    pipeline.process(day(1))
    pipeline.assert_equals_full_recompute()

    # Re-delivered: "c" is gone, "e" is new, and the batch no longer touches 2026-01-11.
    pipeline.land(day(1), [("e", "u", "2026-01-10 10:10")], name="redelivered.jsonl")
    run = pipeline.process(day(1))

    assert run.events.recomputed == [day(0), day(1)]
    pipeline.assert_equals_full_recompute()
    assert pipeline.sessions() == [("u", "2026-01-10 10:00:00", "2026-01-10 10:20:00", 3, 1, False)]


def test_reprocessing_without_new_data_changes_nothing(pipeline):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00")])
    pipeline.process(day(0))
    version = pipeline.store.version(SESSIONS)
    run = pipeline.process(day(0))  # same files again: same rows, new raw version
    pipeline.assert_equals_full_recompute()
    assert run.sessions.inserted == run.sessions.removed == 0
    assert pipeline.store.version(SESSIONS) >= version


def test_quarantine_follows_late_bot_events(pipeline, pair_placement):
    start = datetime(2026, 1, 10, 0, 0)
    bot = [
        (f"b{i}", "bot", (start + timedelta(minutes=25 * i)).isoformat(sep=" "))
        for i in range(0, 62)
    ]
    pipeline.land(day(0), [e for e in bot if e[2] < "2026-01-11"])
    pipeline.process(day(0))
    assert not any(s[5] for s in pipeline.sessions())
    pipeline.land(day(2), [e for e in bot if e[2] >= "2026-01-11"])
    pipeline.process(day(2))
    pipeline.assert_equals_full_recompute()
    assert any(s[5] for s in pipeline.sessions())


def test_late_session_corrects_the_lifecycle_from_its_day_on(pipeline):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00"), ("w", "w", "2026-01-10 11:00")])
    pipeline.process(day(0))
    pipeline.land(day(3), [("b", "u", "2026-01-13 10:00"), ("c", "v", "2026-01-13 11:00")])
    pipeline.process(day(3))
    assert pipeline.lifecycle(day(1)) == {"inactive": (2, 2, 0), "new": (0, 0, 2)}
    before = intervals(pipeline.store)
    version = pipeline.store.version(USER_LIFECYCLE_SNAPSHOT)

    # Received on day 4, happened on day 1: u turns active on day 1, days 2..4 move with it.
    pipeline.land(day(4), [("d", "u", "2026-01-11 12:00")])
    run = pipeline.process(day(4))

    report = run.lifecycle
    assert report is not None
    # u from its late day, and the users whose current stretch runs out on day 4 (v: new on
    # day 3); w stays inactive and is not restated.
    assert report.users_restated == 2
    assert report.users_changed == 2
    after = intervals(pipeline.store)
    assert before - after == {
        ("u", "inactive", day(1), day(2)),
        ("u", "active", day(3), None),
        ("v", "new", day(3), None),
    }
    assert after - before == {
        ("u", "active", day(1), day(1)),
        ("u", "inactive", day(2), day(2)),
        ("u", "active", day(3), day(3)),
        ("u", "inactive", day(4), None),
        ("v", "new", day(3), day(3)),
        ("v", "inactive", day(4), None),
    }
    assert (report.intervals_removed, report.intervals_added) == (3, 6)
    # The snapshot: the days whose counts move, and the new day. Day 3 counts the same (u is
    # still active, having entered it from inactive), so it is not written; day 0 is kept.
    assert report.days == [day(1), day(2), day(4)]
    assert pipeline.lifecycle(day(1)) == {
        "active": (1, 1, 0),
        "inactive": (1, 1, 0),
        "new": (0, 0, 2),
    }
    assert pipeline.lifecycle(day(2)) == {"inactive": (2, 1, 0), "active": (0, 0, 1)}
    assert pipeline.lifecycle(day(0)) == {"new": (2, 2, 0)}
    assert pipeline.store.version(USER_LIFECYCLE_SNAPSHOT) == (version or 0) + 1  # one commit
    pipeline.assert_equals_full_recompute()
    # docs/lifecycle.md's query for one day's states, run by delta-rs on the table as it is.
    table = DeltaTable(pipeline.store.uri(USER_LIFECYCLE_STATE))
    got = (
        QueryBuilder()
        .register("user_lifecycle_state", table)
        .execute(
            "SELECT user_id, state, valid_from AS state_since, "
            "DATE '2026-01-12' - valid_from + 1 AS days_in_state "
            "FROM user_lifecycle_state WHERE DATE '2026-01-12' BETWEEN valid_from AND valid_to"
        )
        .read_all()
    )
    assert sorted(tuple(r.values()) for r in pa.table(got).to_pylist()) == [
        ("u", "inactive", day(2), 1),
        ("w", "inactive", day(1), 2),
    ]


def test_days_after_a_late_users_moves_keep_the_other_users_counts(pipeline):
    """A late new user moves `users` on every later day, also on days with no move of theirs:
    those days are written from their old counts (found by the property test)."""
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00")])
    pipeline.process(day(0))
    pipeline.land(day(3), [("b", "u", "2026-01-13 10:00")])
    pipeline.process(day(3))
    # w's first and only session is on day 1: new on 1, inactive from 2 (moves on 1 and 2).
    pipeline.land(day(4), [("c", "w", "2026-01-11 09:00")])
    run = pipeline.process(day(4))

    assert run.lifecycle is not None and run.lifecycle.days == [day(1), day(2), day(3), day(4)]
    assert pipeline.lifecycle(day(3)) == {"active": (1, 1, 0), "inactive": (1, 0, 1)}
    pipeline.assert_equals_full_recompute()


def test_a_batch_that_touches_no_user_writes_no_interval_rows(pipeline):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00")])
    pipeline.process(day(0))
    # 35 days on, u is churned; a batch of nothing but a copy of an old event moves no one.
    for offset in (35, 36):
        pipeline.land(day(offset), [("a", "u", "2026-01-10 10:00")])
    pipeline.process(day(35))
    rows = pipeline.store.read(USER_LIFECYCLE_STATE).count()
    run = pipeline.process(day(36))

    report = run.lifecycle
    assert report is not None
    assert (report.users_restated, report.users_changed) == (0, 0)
    assert (report.intervals_added, report.intervals_removed, report.state_rows_written) == (
        0,
        0,
        0,
    )
    assert pipeline.store.read(USER_LIFECYCLE_STATE).count() == rows
    assert report.days == [day(36)]  # the new day's five rows, and nothing else
    assert pipeline.lifecycle(day(36)) == {"churned": (1, 0, 0)}
    pipeline.assert_equals_full_recompute()


def test_full_refresh_rebuilds_from_raw_and_logs_no_change(pipeline, spark, settings):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00"), ("b", "v", "2026-01-10 23:50")])
    pipeline.land(day(1), [("a", "u", "2026-01-10 10:00"), ("c", "v", "2026-01-11 00:10")])
    pipeline.process(day(1))
    pipeline.process(day(0))
    logged = pipeline.store.read(SESSION_CHANGES).count()

    dates = [day(-1), day(0), day(1), day(2)]
    events = update_events(
        pipeline.store, lambda: spark, event_dates=dates, run_id="rb", full_refresh=True
    )
    sessions = update_sessions(
        pipeline.store,
        lambda: spark,
        session_dates=dates,
        settings=settings,
        run_id="rb",
        full_refresh=True,
    )

    assert events.recomputed == dates and sessions.recomputed == dates
    assert (sessions.inserted, sessions.replaced, sessions.removed) == (0, 0, 0)
    assert pipeline.store.read(SESSION_CHANGES).count() == logged
    pipeline.assert_equals_full_recompute()


def test_a_new_gap_recomputes_the_sessions_whole(pipeline, spark, settings):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00"), ("b", "u", "2026-01-10 10:45")])
    pipeline.process(day(0))
    assert len(pipeline.sessions()) == 2

    pipeline.settings = settings.with_overrides(session_gap=timedelta(hours=1))
    run = update_sessions(
        pipeline.store,
        lambda: spark,
        session_dates=[day(0)],
        settings=pipeline.settings,
        run_id="new-gap",
    )

    assert run.recomputed == [day(0)]
    assert [(s[1], s[3]) for s in pipeline.sessions()] == [("2026-01-10 10:00:00", 2)]
    again = update_sessions(
        pipeline.store,
        lambda: spark,
        session_dates=[day(0)],
        settings=pipeline.settings,
        run_id="x",
    )
    assert again.updated == []  # absorbed: nothing left to do


def test_a_new_gap_keeps_the_sessions_it_does_not_change(pipeline, spark, settings):
    """Recomputing a date whole rewrites the pairs that changed and keeps the others."""
    pipeline.land(
        day(0),
        [
            ("a", "u", "2026-01-10 10:00"),
            ("b", "u", "2026-01-10 10:45"),
            ("c", "v", "2026-01-10 12:00"),
        ],
    )
    pipeline.process(day(0))
    assert len(pipeline.sessions()) == 3

    pipeline.settings = settings.with_overrides(session_gap=timedelta(hours=1))
    run = update_sessions(
        pipeline.store,
        lambda: spark,
        session_dates=[day(0)],
        settings=pipeline.settings,
        run_id="gap",
    )

    assert run.recomputed == [day(0)]
    assert (run.inserted, run.replaced, run.removed) == (0, 1, 1)  # u's two merge; v's stays
    assert len(pipeline.sessions()) == 2
    pipeline.summarise(run_id="gap")
    pipeline.assert_equals_full_recompute()


def test_two_events_runs_launched_at_once_on_overlapping_dates_end_as_a_full_recompute(
    spark, settings
):
    """Each run's commits are made against the versions it read: the one that commits second
    over a shared date fails with WriteConflictError and commits nothing of that table, and the
    run asked for next (the sensor's) brings every table to the full recompute."""
    p = Pipeline(spark, settings)
    p.land(day(0), [("a1", "u1", f"{day(0)} 08:00"), ("b1", "u2", f"{day(0)} 09:00")])
    p.process(day(0))
    # Late copies for day(-1) and day(0), a duplicate of a1, and day(1)'s own events.
    p.land(
        day(1),
        [
            ("c1", "u1", f"{day(-1)} 23:50"),
            ("a1", "u1", f"{day(0)} 08:00"),
            ("d1", "u2", f"{day(0)} 09:10"),
            ("e1", "u1", f"{day(1)} 07:00"),
        ],
    )
    landing = LandingZoneResource(landing_dir=str(settings.landing_dir))
    ingest_batches(
        p.store,
        landing.read_lines(spark, [day(1)]),
        fingerprints={day(1): fingerprint(day(1), landing.batch_files(day(1)))},
        settings=settings,
        run_id="ingest",
    )
    outcomes: dict[str, str] = {}

    def run(name: str, dates: list[date]) -> None:
        store = EmbeddedDeltaStore(spark=spark, lake=settings.lake_dir)
        try:
            update_events(store, lambda: spark, event_dates=dates, run_id=name)
            outcomes[name] = "committed"
        except WriteConflictError:
            outcomes[name] = "conflict"

    runs = [
        threading.Thread(target=run, args=("first", [day(-1), day(0)])),
        threading.Thread(target=run, args=("second", [day(0), day(1)])),
    ]
    for thread in runs:
        thread.start()
    for thread in runs:
        thread.join()
    assert set(outcomes.values()) <= {"committed", "conflict"} and len(outcomes) == 2

    # What the sensors ask for next: the dates the manifests say are behind, then sessions.
    dates = [day(-1), day(0), day(1)]
    update_events(p.store, lambda: spark, event_dates=dates, run_id="next")
    update_sessions(
        p.store,
        lambda: spark,
        session_dates=session_dates_for(dates, settings),
        settings=settings,
        run_id="next",
    )
    update_lifecycle(p.store, through=day(1), settings=settings, run_id="next")
    p.summarise(run_id="next")
    p.assert_equals_full_recompute()


def test_two_sessions_runs_that_both_found_no_sessions_table_do_not_both_append(spark, settings):
    """Both runs read `sessions` before it existed and derived the same new sessions of a
    shared date: the second append is a conflict (appends are checked too), not a copy of
    every session, and the run asked for next brings the tables to the full recompute."""
    p = Pipeline(spark, settings)
    p.land(day(0), [("a", "u", f"{day(0)} 08:00"), ("b", "v", f"{day(0)} 23:50")])
    p.land(day(1), [("c", "v", f"{day(1)} 00:10")])
    for received in (day(0), day(1)):
        landing = LandingZoneResource(landing_dir=str(settings.landing_dir))
        ingest_batches(
            p.store,
            landing.read_lines(spark, [received]),
            fingerprints={received: fingerprint(received, landing.batch_files(received))},
            settings=settings,
            run_id="ingest",
        )
    update_events(p.store, lambda: spark, event_dates=[day(0), day(1)], run_id="events")
    update_identities(p.store, run_id="events")  # as the events run does
    both_read = threading.Barrier(2, timeout=120)

    class ReadTogether(EmbeddedDeltaStore):
        """The real store; each run waits for the other after reading `sessions`' version."""

        def read_version(self, spec):
            version = super().read_version(spec)
            if spec == SESSIONS:
                both_read.wait()
            return version

    outcomes: dict[str, str] = {}

    def run(name: str, dates: list[date]) -> None:
        store = ReadTogether(spark=spark, lake=settings.lake_dir)
        try:
            update_sessions(
                store, lambda: spark, session_dates=dates, settings=settings, run_id=name
            )
            outcomes[name] = "committed"
        except WriteConflictError:
            outcomes[name] = "conflict"

    runs = [
        threading.Thread(target=run, args=("first", [day(0)])),
        threading.Thread(target=run, args=("second", [day(0), day(1)])),
    ]
    for thread in runs:
        thread.start()
    for thread in runs:
        thread.join()
    assert sorted(outcomes.values()) == ["committed", "conflict"]
    ids = [r.session_id for r in p.store.read(SESSIONS).collect()]
    assert len(ids) == len(set(ids))

    update_sessions(
        p.store, lambda: spark, session_dates=[day(0), day(1)], settings=settings, run_id="next"
    )
    update_lifecycle(p.store, through=day(1), settings=settings, run_id="next")
    p.summarise(run_id="next")
    p.assert_equals_full_recompute()


def test_a_failed_check_marks_its_dates_and_their_next_runs_heal_them(pipeline):
    """A copy of a session and of an event (what unserialized writers leave) fail the
    blocking checks; the checks mark the dates, the sensors' plans then hold them, and the
    recompute derives them from their inputs again."""
    from dagster import instance_for_test

    from sessionize_assets.lake.tables import BATCH_EVENT_DATES, EVENTS_MANIFEST, SESSIONS_MANIFEST
    from sessionize_assets.partitions import RANGE_END, RANGE_START
    from sessionize_assets.pipeline.manifests import (
        event_dates_behind,
        session_dates_behind,
    )
    from sessionize_tests.test_checks import checks_job

    pipeline.land(day(0), [("a", "u", f"{day(0)} 08:00"), ("b", "u", f"{day(0)} 08:10")])
    pipeline.process(day(0))
    store = pipeline.store
    run_id = str(uuid.uuid4())  # an unserialized writer's run
    copy_of_session = store.read(SESSIONS).limit(1)
    copy_of_event = store.read(EVENTS).limit(1)
    for spec, frame in ((SESSIONS, copy_of_session), (EVENTS, copy_of_event)):
        store.rewrite(spec, add=lambda f=frame: f, commit_metadata={"dagster_run_id": run_id})

    job = checks_job(
        pipeline.settings, {"unique_event_ids": "events", "no_overlapping_sessions": "sessions"}
    )
    with instance_for_test() as instance:
        result = job.execute_in_process(
            instance=instance,
            raise_on_error=False,
            run_id=run_id,
            tags={RANGE_START: day(0).isoformat(), RANGE_END: day(0).isoformat()},
        )
    assert not result.success
    assert {e.check_name for e in result.get_asset_check_evaluations() if not e.passed} == {
        "unique_event_ids",
        "no_overlapping_sessions",
    }
    behind = event_dates_behind(
        store.read_arrow(BATCH_EVENT_DATES), store.read_arrow(EVENTS_MANIFEST)
    )
    assert list(behind) == [day(0)] and behind[day(0)].needs_recompute
    stale = session_dates_behind(
        store.read_arrow(EVENTS_MANIFEST),
        store.read_arrow(SESSIONS_MANIFEST),
        settings=pipeline.settings,
    )
    assert day(0) in stale

    events = update_events(store, lambda: pipeline.spark, event_dates=list(behind), run_id="heal")
    assert events.recomputed == [day(0)]
    stale = session_dates_behind(
        store.read_arrow(EVENTS_MANIFEST),
        store.read_arrow(SESSIONS_MANIFEST),
        settings=pipeline.settings,
    )
    update_sessions(
        store,
        lambda: pipeline.spark,
        session_dates=list(stale),
        settings=pipeline.settings,
        run_id="heal",
    )
    pipeline.assert_equals_full_recompute()
    assert store.read(SESSIONS).count() == 1 and store.read(EVENTS).count() == 2
