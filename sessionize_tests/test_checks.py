"""Each asset check fails on the violation it is for."""

from __future__ import annotations

import uuid
from datetime import date, datetime, timedelta

from pyspark.sql import functions as F

from sessionize_assets.checks import (
    duplicate_event_ids,
    malformed_sessions,
    overlapping_sessions,
    quarantine_mismatch,
    unaccounted_lines,
    unbalanced_snapshot,
)
from sessionize_assets.lake.tables import SESSIONS, USER_LIFECYCLE_SNAPSHOT
from sessionize_assets.transforms.lifecycle import STATES

D = date(2026, 1, 5)


def session(spark, rows):
    data = [
        (
            sid,
            user,
            D,
            datetime(2026, 1, 5, *start),
            datetime(2026, 1, 5, *end),
            float((datetime(2026, 1, 5, *end) - datetime(2026, 1, 5, *start)).total_seconds()),
            count,
            1,
            quarantined,
        )
        for sid, user, start, end, count, quarantined in rows
    ]
    return spark.createDataFrame(data, SESSIONS.schema)


def test_duplicate_event_ids(spark):
    events = spark.createDataFrame([("a",), ("b",), ("a",)], "event_id string")
    finding = duplicate_event_ids(events)
    assert finding.violations == 1 and finding.sample == ["a x2"]
    assert duplicate_event_ids(events.distinct()).passed


def test_overlapping_sessions(spark):
    ok = session(
        spark, [("s1", "u", (8, 0), (9, 0), 2, False), ("s2", "u", (10, 0), (11, 0), 2, False)]
    )
    assert overlapping_sessions(ok).passed
    bad = session(
        spark, [("s1", "u", (8, 0), (9, 0), 2, False), ("s2", "u", (8, 30), (11, 0), 2, False)]
    )
    assert overlapping_sessions(bad).violations == 1


def test_overlapping_sessions_on_some_dates_include_the_day_before(spark):
    """Scoped to a date, a session from the day before that runs into it still counts."""
    before = D - timedelta(days=1)
    evening = (
        "s0", "u", before, datetime(2026, 1, 4, 23, 0), datetime(2026, 1, 5, 0, 40),
        6000.0, 3, 1, False,
    )  # fmt: skip
    sessions = session(spark, [("s1", "u", (0, 30), (1, 0), 2, False)]).unionByName(
        spark.createDataFrame([evening], SESSIONS.schema)
    )
    assert overlapping_sessions(sessions, dates=[D]).violations == 1
    assert overlapping_sessions(sessions, dates=[before]).violations == 1
    assert overlapping_sessions(sessions, dates=[D + timedelta(days=2)]).passed


def test_malformed_sessions(spark):
    good = session(spark, [("s1", "u", (8, 0), (9, 0), 2, False)])
    assert malformed_sessions(good, max_length=timedelta(hours=24)).passed
    assert malformed_sessions(good, max_length=timedelta(minutes=30)).violations == 1
    empty = session(spark, [("s1", "u", (8, 0), (9, 0), 0, False)])
    assert malformed_sessions(empty, max_length=timedelta(hours=24)).violations == 1


def test_quarantine_mismatch(spark):
    sessions = session(spark, [("s1", "u", (8, 0), (9, 0), 2, True)])
    listed = spark.createDataFrame([("s1",)], "session_id string")
    assert quarantine_mismatch(sessions, listed).passed
    assert quarantine_mismatch(sessions, listed.limit(0)).violations == 1


def test_unaccounted_lines(spark):
    late = D - timedelta(days=3)
    raw = spark.createDataFrame(
        [(D, D), (D, D), (D, D), (D, late)], "received_date date, event_date date"
    )
    events = spark.createDataFrame(
        [(D, D), (D, D), (D, late)], "received_date date, event_date date"
    )
    rejected = spark.createDataFrame(
        [(D, "events", D), (D, "ingest", None)],
        "received_date date, origin string, event_date date",
    )
    assert unaccounted_lines(raw, events, rejected).passed
    assert unaccounted_lines(raw, events.limit(2), rejected).violations == 1
    # Per event date: one date's extra row does not hide another's missing one.
    moved = events.where(F.col("event_date") == D).unionByName(
        spark.createDataFrame([(D, D)], "received_date date, event_date date")
    )
    finding = unaccounted_lines(raw, moved, rejected)
    assert finding.violations == 2


def test_unbalanced_snapshot(spark):
    day1 = {"new": (2, 2, 0)}
    day2 = {"new": (1, 1, 2), "active": (2, 2, 0)}

    def snapshot(days):
        rows = [
            (D + timedelta(days=i), state, *figures.get(state, (0, 0, 0)))
            for i, figures in enumerate(days)
            for state in STATES
        ]
        return spark.createDataFrame(rows, USER_LIFECYCLE_SNAPSHOT.schema)

    assert unbalanced_snapshot(snapshot([day1, day2])).passed
    wrong = {"new": (1, 1, 2), "active": (2, 1, 0)}  # one entry missing
    assert unbalanced_snapshot(snapshot([day1, wrong])).sample == [f"{D + timedelta(1)}: active"]
    assert unbalanced_snapshot(snapshot([day1, day2]).where("state != 'churned'")).violations == 2


def test_a_partition_run_checks_its_partitions_and_a_check_run_alone_the_whole_table(
    spark, settings, store
):
    """With a materialization a check pays for the run's partitions; alone, for the table."""
    from dagster import (
        AssetCheckKey,
        AssetKey,
        AssetSelection,
        Definitions,
        define_asset_job,
        instance_for_test,
    )

    from sessionize_assets.definitions import build_definitions
    from sessionize_assets.lake.tables import EVENTS
    from sessionize_assets.partitions import PARTITION_TAG, RANGE_END, RANGE_START

    clean, dirty = D, D + timedelta(days=1)

    def event(event_id, day):
        at = datetime(day.year, day.month, day.day, 12)
        return {"event_id": event_id, "user_id": "u", "event_ts": at, "event_date": day,
                "received_at": at, "received_date": day, "source_file": "f.jsonl"}  # fmt: skip

    rows = [event("a", clean), event("b", dirty), event("b", dirty)]
    store.replace_partitions(
        EVENTS, spark.createDataFrame(rows, EVENTS.schema), partitions=[clean, dirty]
    )
    defs = build_definitions(settings, spark_ui=False)
    check = AssetSelection.checks(AssetCheckKey(AssetKey("events"), "unique_event_ids"))
    job = Definitions.merge(
        defs, Definitions(jobs=[define_asset_job("unique_ids", selection=check)])
    ).resolve_job_def("unique_ids")

    def passed(**run) -> bool:
        with instance_for_test() as instance:
            result = job.execute_in_process(instance=instance, raise_on_error=False, **run)
        (evaluation,) = result.get_asset_check_evaluations()
        return evaluation.passed

    span = {RANGE_START: clean.isoformat(), RANGE_END: dirty.isoformat()}
    assert passed(tags={PARTITION_TAG: clean.isoformat()})
    assert not passed(tags={PARTITION_TAG: dirty.isoformat()})
    assert not passed(tags=span)
    assert not passed()
    # A run that wrote to `events` checks what it wrote, not the whole span of its range.
    run_id = str(uuid.uuid4())
    store.replace_partitions(
        EVENTS,
        spark.createDataFrame([event("a", clean), event("c", clean)], EVENTS.schema),
        partitions=[clean],
        commit_metadata={"dagster_run_id": run_id},
    )
    assert passed(tags=span, run_id=run_id)
