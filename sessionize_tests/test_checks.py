"""Each asset check fails on the violation it is for."""

from __future__ import annotations

from datetime import date, datetime, timedelta

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
    raw = spark.createDataFrame([(D,), (D,), (D,)], "received_date date")
    events = spark.createDataFrame([(D,), (D,)], "received_date date")
    rejected = spark.createDataFrame(
        [(D, "events"), (D, "ingest")], "received_date date, origin string"
    )
    assert unaccounted_lines(raw, events, rejected).passed
    assert unaccounted_lines(raw, events.limit(1), rejected).violations == 1


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
