"""Each asset check fails on the violation it is for."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import date, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from sessionize_assets.checks.rules import (
    SESSION_CHECK_COLUMNS,
    Finding,
    duplicate_event_ids,
    duplicate_event_ids_rows,
    evaluate,
    malformed_sessions,
    malformed_sessions_rows,
    overlapping_sessions,
    overlapping_sessions_rows,
    quarantine_mismatch,
    quarantine_mismatch_rows,
    snapshot_off_intervals,
    unaccounted_lines,
    unaccounted_lines_rows,
    unbalanced_snapshot,
)
from sessionize_assets.lake.placement import DEFAULT_DRIVER_WRITE_BYTES
from sessionize_assets.lake.tables import SESSIONS
from sessionize_assets.transforms.lifecycle_states import STATES

D = date(2026, 1, 5)


# A session row's SPEC §3b attributes, §3c stitched user and where its attributes were
# picked from, which no check reads: no pages, no campaign, no stitched user, no picks.
NO_ATTRIBUTES = (0, 0, *(None,) * 10, "Direct", False, None, None, None, *(None,) * 4)
assert len(NO_ATTRIBUTES) == len(SESSIONS.schema) - 9


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
            *NO_ATTRIBUTES,
        )
        for sid, user, start, end, count, quarantined in rows
    ]
    return spark.createDataFrame(data, SESSIONS.schema)


# A rule counted by Spark's job, or on the driver for Arrow rows (`rules.*_rows`).
ENGINES = pytest.mark.parametrize("engine", ["spark", "driver"])


@ENGINES
def test_duplicate_event_ids(spark, engine):
    other = D + timedelta(days=2)
    events = spark.createDataFrame(
        [("a", D), ("b", D), ("a", other)], "event_id string, event_date date"
    )

    def duplicated(frame) -> Finding:
        if engine == "spark":
            return duplicate_event_ids(frame).finding()
        return duplicate_event_ids_rows(frame.toArrow())

    finding = duplicated(events)
    assert finding.violations == 1 and finding.sample == ["a x2"]
    assert finding.dates == [D, other]  # both copies' dates are recomputed to heal it
    assert duplicated(events.where("event_date = DATE'2026-01-05'")).passed


def overlapping(frame, engine) -> Finding:
    if engine == "spark":
        return overlapping_sessions(frame).finding()
    return overlapping_sessions_rows(frame.toArrow())


def malformed(frame, engine, max_length) -> Finding:
    if engine == "spark":
        return malformed_sessions(frame, max_length=max_length).finding()
    return malformed_sessions_rows(frame.toArrow(), max_length=max_length)


def mismatched(sessions, quarantine, engine) -> Finding:
    if engine == "spark":
        return quarantine_mismatch(sessions, quarantine).finding()
    return quarantine_mismatch_rows(sessions.toArrow(), quarantine.toArrow())


@ENGINES
def test_overlapping_sessions(spark, engine):
    ok = session(
        spark, [("s1", "u", (8, 0), (9, 0), 2, False), ("s2", "u", (10, 0), (11, 0), 2, False)]
    )
    assert overlapping(ok, engine).passed
    bad = session(
        spark, [("s1", "u", (8, 0), (9, 0), 2, False), ("s2", "u", (8, 30), (11, 0), 2, False)]
    )
    finding = overlapping(bad, engine)
    assert finding.violations == 1 and finding.dates == [D]
    assert finding.sample == ["u: 2026-01-05 08:00:00..2026-01-05 09:00:00"]
    # Starting at the very moment the one before ends is overlapping it too; another user's
    # session is not.
    touching = session(
        spark,
        [
            ("s1", "u", (8, 0), (9, 0), 2, False),
            ("s2", "u", (9, 0), (9, 30), 2, False),
            ("s3", "v", (8, 30), (9, 30), 2, False),
        ],
    )
    assert overlapping(touching, engine).sample == ["u: 2026-01-05 08:00:00..2026-01-05 09:00:00"]


def test_overlapping_sessions_on_some_dates_include_the_day_before(spark):
    """Scoped to a date, a session from the day before that runs into it still counts."""
    before = D - timedelta(days=1)
    evening = (
        "s0", "u", before, datetime(2026, 1, 4, 23, 0), datetime(2026, 1, 5, 0, 40),
        6000.0, 3, 1, False, *NO_ATTRIBUTES,
    )  # fmt: skip
    sessions = session(spark, [("s1", "u", (0, 30), (1, 0), 2, False)]).unionByName(
        spark.createDataFrame([evening], SESSIONS.schema)
    )
    on_day = overlapping_sessions(sessions, dates=[D]).finding()
    assert on_day.violations == 1 and on_day.dates == [before, D]
    assert overlapping_sessions(sessions, dates=[before]).finding().violations == 1
    assert overlapping_sessions(sessions, dates=[D + timedelta(days=2)]).finding().passed


@ENGINES
def test_malformed_sessions(spark, engine):
    good = session(spark, [("s1", "u", (8, 0), (9, 0), 2, False)])
    assert malformed(good, engine, timedelta(hours=24)).passed
    too_long = malformed(good, engine, timedelta(minutes=30))
    assert too_long.sample == ["s1: 2026-01-05 08:00:00..2026-01-05 09:00:00 n=2"]
    empty = session(spark, [("s1", "u", (8, 0), (9, 0), 0, False)])
    assert malformed(empty, engine, timedelta(hours=24)).violations == 1


@ENGINES
def test_quarantine_mismatch(spark, engine):
    sessions = session(spark, [("s1", "u", (8, 0), (9, 0), 2, True)])
    listed = sessions.select("session_id", "session_date")
    assert mismatched(sessions, listed, engine).passed
    missing = mismatched(sessions, listed.limit(0), engine)
    assert missing.violations == 1 and missing.dates == [D]


_MINUTES = st.integers(0, 3 * 24 * 60)


# Spark's rules take a few seconds an example: each example holds many sessions of a few users.
@examples(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["s1", "s2", "s3", "s4", "s5", "s6"]),  # repeated: written twice
            st.sampled_from(["u", "v", "w"]),
            _MINUTES,
            st.integers(-30, 3 * 60),  # minutes to its end: some end before they start
            st.integers(0, 999_999),  # microseconds, which the sample prints
            st.integers(-1, 3),  # events
            st.booleans(),  # the session date is its start's, or the day after
            st.booleans(),  # flagged
        ),
        max_size=24,
    ),
    listed=st.lists(st.tuples(st.sampled_from(["s1", "s2", "s7"]), st.booleans()), max_size=6),
)
def test_the_sessions_rules_find_the_same_on_the_driver_as_in_spark(spark, rows, listed):
    """The sessions rules on Arrow rows (a small run's checks) find what Spark's find: the
    count, the sample's text and the dates, for sessions that overlap, run backwards or too
    long, sit on the wrong date, are flagged without a quarantine row or listed unflagged."""
    start = datetime(2026, 1, 4)
    data = []
    for sid, user, minute, length, micros, count, own_date, flagged in rows:
        begin = start + timedelta(minutes=minute, microseconds=micros)
        end = begin + timedelta(minutes=length)
        day = begin.date() if own_date else begin.date() + timedelta(days=1)
        seconds = (end - begin).total_seconds()
        data.append((sid, user, day, begin, end, seconds, count, flagged))
    schema = SESSIONS.schema
    sessions = spark.createDataFrame(
        data, StructType([schema[name] for name in SESSION_CHECK_COLUMNS])
    )
    arrow = pa.table(
        {
            name: pa.array([row[i] for row in data], type_)
            for i, (name, type_) in enumerate(
                zip(SESSION_CHECK_COLUMNS, ARROW_CHECK_TYPES, strict=True)
            )
        }
    )
    listed_rows = [(sid, D if on_d else D + timedelta(days=1)) for sid, on_d in listed]
    quarantine = spark.createDataFrame(listed_rows, "session_id string, session_date date")
    max_length = timedelta(hours=2)
    in_spark = evaluate(
        {
            "overlap": overlapping_sessions(sessions),
            "malformed": malformed_sessions(sessions, max_length=max_length),
            "quarantine": quarantine_mismatch(sessions, quarantine),
        }
    )
    assert in_spark == {
        "overlap": overlapping_sessions_rows(arrow),
        "malformed": malformed_sessions_rows(arrow, max_length=max_length),
        "quarantine": quarantine_mismatch_rows(
            arrow,
            pa.table(
                {
                    "session_id": pa.array([sid for sid, _ in listed_rows], pa.string()),
                    "session_date": pa.array([day for _, day in listed_rows], pa.date32()),
                }
            ),
        ),
    }


# The types delta-rs reads `SESSION_CHECK_COLUMNS` with (timestamps in UTC).
ARROW_CHECK_TYPES = (
    pa.string(),
    pa.string(),
    pa.date32(),
    pa.timestamp("us", tz="UTC"),
    pa.timestamp("us", tz="UTC"),
    pa.float64(),
    pa.int64(),
    pa.bool_(),
)


@ENGINES
def test_unaccounted_lines(spark, engine):
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

    def unaccounted(events) -> Finding:
        if engine == "spark":
            return unaccounted_lines(raw, events, rejected).finding()
        return unaccounted_lines_rows(raw.toArrow(), events.toArrow(), rejected.toArrow())

    assert unaccounted(events).passed
    assert unaccounted(events.limit(2)).violations == 1
    short = unaccounted(events.where(F.col("event_date") == D))
    assert short.sample == [f"{D} -> {late}: raw 1 != 0 + 0"]
    # Per event date: one date's extra row does not hide another's missing one.
    moved = events.where(F.col("event_date") == D).unionByName(
        spark.createDataFrame([(D, D)], "received_date date, event_date date")
    )
    finding = unaccounted(moved)
    assert finding.violations == 2 and finding.dates == [late, D]


def test_unbalanced_snapshot():
    day1 = {"new": (2, 2, 0)}
    day2 = {"new": (1, 1, 2), "active": (2, 2, 0)}

    def snapshot(days, *, without=None):
        rows = [
            {
                "snapshot_date": D + timedelta(days=i),
                "state": state,
                "users": u,
                "entered": e,
                "exited": x,
            }
            for i, figures in enumerate(days)
            for state in STATES
            if state != without
            for u, e, x in [figures.get(state, (0, 0, 0))]
        ]
        return pa.Table.from_pylist(rows)

    assert unbalanced_snapshot(snapshot([day1, day2])).passed
    wrong = {"new": (1, 1, 2), "active": (2, 1, 0)}  # one entry missing
    assert unbalanced_snapshot(snapshot([day1, wrong])).sample == [f"{D + timedelta(1)}: active"]
    assert unbalanced_snapshot(snapshot([day1, day2], without="churned")).violations == 2
    skipped = snapshot([day1, {}, {"new": (2, 0, 0)}]).filter(
        pc.not_equal(pc.field("snapshot_date"), D + timedelta(1))
    )
    # A missing day: every state's next row has no day before it.
    assert unbalanced_snapshot(skipped).sample == sorted(f"{D + timedelta(2)}: {s}" for s in STATES)


def test_snapshot_off_intervals():
    day = pa.Table.from_pylist(
        [{"state": s, "users": n} for s, n in zip(STATES, (1, 2, 0, 0, 0), strict=True)]
    )
    current = pa.Table.from_pylist([{"state": s} for s in ("new", "active", "active")])
    assert snapshot_off_intervals(day, current).passed
    off = snapshot_off_intervals(day, current.slice(1))
    assert off.sample == ["new: 1 users, 0 current stretches"]


def checks_job(settings, checks: dict[str, str]):
    """A job of these asset checks (name -> asset) of the project's definitions."""
    from dagster import AssetCheckKey, AssetKey, AssetSelection, Definitions, define_asset_job

    from sessionize_assets.definitions import build_definitions

    selection = AssetSelection.checks(
        *(AssetCheckKey(AssetKey(asset), name) for name, asset in checks.items())
    )
    return Definitions.merge(
        build_definitions(settings, spark_ui=False),
        Definitions(jobs=[define_asset_job("checks", selection=selection)]),
    ).resolve_job_def("checks")


def test_a_partition_run_checks_its_partitions_and_a_check_run_alone_the_whole_table(
    spark, settings, store
):
    """With a materialization a check pays for the run's partitions; alone, for the table."""
    from dagster import instance_for_test

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
    job = checks_job(settings, {"unique_event_ids": "events"})

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


def _passed_in_run(job, *, run_id: str, first: date, last: date) -> bool:
    """Whether the job's one check passes in the run `run_id` over the dates first..last."""
    from dagster import instance_for_test

    from sessionize_assets.partitions import RANGE_END, RANGE_START

    span = {RANGE_START: first.isoformat(), RANGE_END: last.isoformat()}
    with instance_for_test() as instance:
        result = job.execute_in_process(
            instance=instance, raise_on_error=False, tags=span, run_id=run_id
        )
    (evaluation,) = result.get_asset_check_evaluations()
    return evaluation.passed


# A small run's writes are read on the driver, a large one's by Spark
# (`Settings.driver_write_bytes`): the same checks, either way.
PLACEMENTS = pytest.mark.parametrize(
    "driver_write_bytes", [DEFAULT_DRIVER_WRITE_BYTES, 0], ids=["on-the-driver", "by-spark"]
)


@PLACEMENTS
def test_checks_in_a_run_read_what_it_wrote_and_catch_what_it_broke(
    spark, settings, store, driver_write_bytes
):
    """In a materialization run each check reads the rows the run wrote and their neighbours
    (found by key), so a violation the run made fails it, and one elsewhere is not read."""
    from dagster import instance_for_test

    from sessionize_assets.lake.tables import EVENTS, SESSION_QUARANTINE
    from sessionize_assets.partitions import RANGE_END, RANGE_START

    day, before, far = D, D - timedelta(days=1), D + timedelta(days=5)
    checks = {
        "unique_event_ids": "events",
        "no_overlapping_sessions": "sessions",
        "sessions_well_formed": "sessions",
        "quarantine_matches_flag": "session_quarantine",
    }
    job = checks_job(replace(settings, driver_write_bytes=driver_write_bytes), checks)
    span = {RANGE_START: before.isoformat(), RANGE_END: far.isoformat()}

    def failed(*commits) -> set[str]:
        """Checks that fail in a run whose writes are `commits`."""
        run_id = str(uuid.uuid4())
        for commit in commits:
            commit({"dagster_run_id": run_id})
        with instance_for_test() as instance:
            result = job.execute_in_process(
                instance=instance, raise_on_error=False, tags=span, run_id=run_id
            )
        evaluations = result.get_asset_check_evaluations()
        assert {e.check_name for e in evaluations} == set(checks)
        return {e.check_name for e in evaluations if not e.passed}

    def row(sid, user, day, start, hours, flagged=False):
        at = datetime(day.year, day.month, day.day, *start)
        return (
            sid, user, day, at, at + timedelta(hours=hours), hours * 3600.0, 2, 1, flagged,
            *NO_ATTRIBUTES,
        )  # fmt: skip

    def sessions(*rows):
        return spark.createDataFrame(list(rows), SESSIONS.schema)

    def quarantined(sid, user, day):
        at = datetime(day.year, day.month, day.day, 1)
        cap = at + timedelta(hours=24)
        row = (sid, user, day, at, cap, cap, 1, "exceeds_max_session_length")
        return spark.createDataFrame([row], SESSION_QUARANTINE.schema)

    def events(*ids):
        at = datetime(day.year, day.month, day.day, 12)
        common = {"user_id": "u", "event_ts": at, "event_date": day, "received_at": at}
        rows = [{"event_id": i, "received_date": day, "source_file": "f", **common} for i in ids]
        return spark.createDataFrame(rows, EVENTS.schema)

    # History: u's evening session runs past midnight; w's two sessions far away overlap (an
    # old violation that no run below writes near); a bot session and its quarantine row.
    store.replace_partitions(
        SESSIONS,
        sessions(
            row("s0", "u", before, (23, 0), 2),
            row("b1", "bot", day, (1, 0), 20, flagged=True),
            row("w1", "w", far, (8, 0), 2),
            row("w2", "w", far, (9, 0), 2),
        ),
        partitions=[before, day, far],
    )
    store.replace_partitions(SESSION_QUARANTINE, quarantined("b1", "bot", day), partitions=[day])
    store.replace_partitions(EVENTS, events("a"), partitions=[day])

    def add(spec, frame):
        return lambda tags: store.rewrite(spec, add=lambda: frame, commit_metadata=tags)

    harmless = add(
        SESSIONS, sessions(row("v0", "v", day, (6, 0), 1), row("v1", "v", day, (8, 0), 1))
    )
    assert failed(harmless, add(EVENTS, events("b"))) == set()

    def write_v1_twice(tags):
        """Rewrites v's file (v1 is copied over as it was) and adds v1 again."""
        store.rewrite(
            SESSIONS,
            partitions=[day],
            drop=F.col("session_id") == "v0",
            add=lambda: sessions(row("v1", "v", day, (8, 0), 1)),
            commit_metadata=tags,
        )

    # The checks read what the run changed, not the rows it copied over: a copy it wrote
    # twice is still one it changed.
    assert failed(write_v1_twice) == {"no_overlapping_sessions"}
    # u's new session starts before the evening session of the day before has ended.
    assert failed(add(SESSIONS, sessions(row("s1", "u", day, (0, 30), 1)))) == {
        "no_overlapping_sessions"
    }
    assert failed(add(SESSIONS, sessions(row("x1", "x", day, (8, 0), 30)))) == {
        "sessions_well_formed"
    }
    assert failed(add(SESSIONS, sessions(row("y1", "y", day, (8, 0), 1, flagged=True)))) == {
        "quarantine_matches_flag"
    }

    def unlist_bot(tags):
        store.rewrite(
            SESSION_QUARANTINE,
            partitions=[day],
            drop=F.col("session_id") == "b1",
            add=lambda: quarantined("b1", "bot", day).limit(0),
            commit_metadata=tags,
        )

    harmless = add(SESSIONS, sessions(row("v2", "v", far, (8, 0), 1)))
    assert failed(harmless, unlist_bot) == {"quarantine_matches_flag"}
    harmless = add(SESSIONS, sessions(row("v3", "v", far, (12, 0), 1)))
    assert failed(harmless, add(EVENTS, events("a"))) == {"unique_event_ids"}


@pytest.mark.parametrize(
    "driver_write_bytes",
    [DEFAULT_DRIVER_WRITE_BYTES, 0],
    ids=["ids-on-the-driver", "every-id-read"],
)
def test_unique_event_ids_in_a_run_finds_a_copy_of_an_added_id_on_another_date(
    spark, settings, store, driver_write_bytes
):
    """The ids a run added are looked up in the files that can hold a copy the id index has of
    them (on the copy's date, holding its batch): an id already in `events` on another date, or
    in an older file of the same batch (delivered again), fails the run's check; a run whose
    files outgrow the driver has every id of `events` read, and fails it too."""

    from sessionize_assets.lake.tables import EVENT_IDS, EVENTS

    first, later = D, D + timedelta(days=3)

    def events(event_id, day):
        at = datetime(day.year, day.month, day.day, 12)
        row = {"event_id": event_id, "user_id": "u", "event_ts": at, "event_date": day,
               "received_at": at, "received_date": day, "source_file": "f"}  # fmt: skip
        return spark.createDataFrame([row], EVENTS.schema)

    # "a" was accepted on `first`; its copy stamped on `later` is in another batch.
    index = spark.createDataFrame(
        [(event_id, day, day) for event_id, day in (("a", first), ("a", later), ("b", later))],
        "event_id string, event_date date, received_date date",
    ).select(F.xxhash64("event_id").alias("id_hash"), "*")
    store.replace_partitions(EVENT_IDS, index, partitions=[first, later])
    store.replace_partitions(EVENTS, events("a", first), partitions=[first])
    placed = replace(settings, driver_write_bytes=driver_write_bytes)
    job = checks_job(placed, {"unique_event_ids": "events"})

    def passed_after(event_id: str) -> bool:
        run_id = str(uuid.uuid4())
        store.rewrite(
            EVENTS, add=lambda: events(event_id, later), commit_metadata={"dagster_run_id": run_id}
        )
        return _passed_in_run(job, run_id=run_id, first=later, last=later)

    assert passed_after("b")
    assert not passed_after("a")  # the run wrote `later` only; the other copy is on `first`
    assert not passed_after("b")  # the same batch's copy again, beside the first run's file


def test_every_line_accounted_in_a_run_counts_the_inputs_it_read_or_changed(spark, settings, store):
    """An events run's check counts the inputs (batch, event date) its manifest commit says it
    read, and those whose events or duplicate rejections it changed: a line it read and lost
    fails it, and so does an event of another batch it removed without rejecting it. An
    input it neither read nor changed is not read (the check alone still finds it)."""
    from dagster import instance_for_test

    from sessionize_assets.lake.tables import EVENTS, RAW_EVENTS, REJECTED_EVENTS
    from sessionize_assets.pipeline.manifests import record_absorbed
    from sessionize_assets.transforms.validation import DEDUP

    old, new, lost = D, D + timedelta(days=1), D + timedelta(days=2)  # batches
    late, far = D - timedelta(days=1), D - timedelta(days=9)  # event dates
    job = checks_job(settings, {"every_line_accounted": "events"})

    def event(event_id, day, batch):
        at = datetime(day.year, day.month, day.day, 12)
        return {"event_id": event_id, "user_id": "u", "event_ts": at, "event_date": day,
                "received_at": at, "received_date": batch, "source_file": "f"}  # fmt: skip

    def events(*rows):
        return spark.createDataFrame(list(rows), EVENTS.schema)

    def raw(*rows):
        lines = [
            {"message_id": r["event_id"], "raw_line": "{}"}
            | {k: v for k, v in r.items() if k != "event_id"}
            for r in rows
        ]
        return spark.createDataFrame(lines, RAW_EVENTS.schema)

    def duplicate(row):
        rejection = {"raw_line": "{}", "reason": "duplicate", "message_id": row["event_id"],
                     "received_date": row["received_date"], "source_file": "f",
                     "origin": DEDUP, "event_date": row["event_date"]}  # fmt: skip
        return spark.createDataFrame([rejection], REJECTED_EVENTS.schema)

    # History: batch `old`'s a1 (on D) and a2 (late) are events; its x9 (far) is in no table,
    # an old violation that no run below reads.
    a1, a2, x9 = event("a1", D, old), event("a2", late, old), event("x9", far, old)
    store.replace_partitions(RAW_EVENTS, raw(a1, a2, x9), partitions=[old])
    store.replace_partitions(EVENTS, events(a1, a2), partitions=[D, late])
    b1, c1 = event("b1", D, new), event("c1", D, lost)
    store.replace_partitions(RAW_EVENTS, raw(b1), partitions=[new])
    store.replace_partitions(RAW_EVENTS, raw(c1), partitions=[lost])

    def passed(*commits, read) -> bool:
        """Whether the check passes in a run that made `commits` and read `read`."""
        run_id = str(uuid.uuid4())
        tags = {"dagster_run_id": run_id}
        for commit in commits:
            commit(tags)
        absorbed = {day: {(day, batch): 0} for day, batch in read}
        record_absorbed(store, absorbed=absorbed, events_version=None, run_id=run_id, read=read)
        return _passed_in_run(job, run_id=run_id, first=far, last=lost)

    def add(spec, frame):
        return lambda tags: store.rewrite(spec, add=lambda: frame, commit_metadata=tags)

    def remove_a1(tags):
        store.rewrite(
            EVENTS,
            partitions=[D],
            drop=F.col("event_id") == "a1",
            add=lambda: events().limit(0),
            commit_metadata=tags,
        )

    assert passed(add(EVENTS, events(b1)), read=[(D, new)])
    # c1 was read and is neither an event nor a rejection.
    assert not passed(read=[(D, lost)])
    # a1, of batch `old`, removed from events: that input's count changed.
    assert not passed(remove_a1, read=[(D, new)])
    # ... and rejected as a duplicate: it adds up again.
    assert passed(add(REJECTED_EVENTS, duplicate(a1)), read=[(D, new)])
    with instance_for_test() as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False)
    (evaluation,) = result.get_asset_check_evaluations()
    assert sorted(evaluation.metadata["dates"].value) == [far.isoformat(), D.isoformat()]


def test_a_failed_check_fails_its_run_and_replay_names_it(spark, settings, store):
    """The invariant checks are blocking: a failed one fails its run, which replay names."""
    from dagster import instance_for_test

    from sessionize_assets.lake.tables import EVENTS
    from sessionize_assets.replay.results import failed_checks, run_succeeded

    at = datetime(2026, 1, 5, 12)
    row = {"event_id": "a", "user_id": "u", "event_ts": at, "event_date": D,
           "received_at": at, "received_date": D, "source_file": "f"}  # fmt: skip
    store.replace_partitions(
        EVENTS, spark.createDataFrame([row, row], EVENTS.schema), partitions=[D]
    )
    job = checks_job(settings, {"unique_event_ids": "events"})
    with instance_for_test() as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False)
    assert not result.success and not run_succeeded(result)
    assert failed_checks(result) == "check events:unique_event_ids failed (1 violations)"
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.metadata["dates"].value == [D.isoformat()]
    assert evaluation.metadata["spark_jobs"].value >= 2  # the count, then the sample
