"""The SPEC's invariants: each returns the offending rows (a `Finding`).

Pure functions of DataFrames (Spark queries), or of Arrow tables for the lifecycle's few rows
(checked on the driver), so each rule is unit-tested on a few rows; which rows a check hands
them (the whole table, or what a run wrote) is decided in `scope.py`.
"""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from sessionize_assets.transforms.lifecycle import STATES
from sessionize_assets.transforms.validation import DEDUP

_SAMPLE = 5


@dataclass(frozen=True)
class Finding:
    """Offending rows (none means the invariant holds), a few of them to show, and the
    partitions they are in (what a recompute must heal)."""

    violations: int
    sample: list[str]
    dates: list[date] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.violations == 0


def _finding(bad: DataFrame, describe: Callable[[object], str], *, dates: Column) -> Finding:
    """The rows of `bad`; `dates` is an array of the partition dates of each (read only when
    there are violations: a passing check costs one job)."""
    bad = bad.cache()
    try:
        violations = bad.count()
        if not violations:
            return Finding(0, [])
        sample = [describe(r) for r in bad.limit(_SAMPLE).collect()]
        held = bad.select(F.explode(dates).alias("day")).distinct().collect()
        return Finding(violations, sample, sorted(r.day for r in held if r.day is not None))
    finally:
        bad.unpersist()


def duplicate_event_ids(events: DataFrame) -> Finding:
    bad = (
        events.groupBy("event_id")
        .agg(F.count(F.lit(1)).alias("count"), F.collect_set("event_date").alias("dates"))
        .where(F.col("count") > 1)
    )
    return _finding(bad, lambda r: f"{r.event_id} x{r['count']}", dates=F.col("dates"))


def overlapping_sessions(sessions: DataFrame, *, dates: list[date] | None = None) -> Finding:
    """Sessions that overlap the user's next one; with `dates`, pairs with a session on them.

    `sessions` must then also hold the dates around `dates` a session can reach into.
    """
    following = Window.partitionBy("user_id").orderBy("session_start", "session_id")
    bad = (
        sessions.withColumn("next_start", F.lead("session_start").over(following))
        .withColumn("next_date", F.lead("session_date").over(following))
        .where(F.col("next_start") <= F.col("session_end"))
    )
    if dates is not None:
        bad = bad.where(F.col("session_date").isin(dates) | F.col("next_date").isin(dates))
    return _finding(
        bad,
        lambda r: f"{r.user_id}: {r.session_start}..{r.session_end}",
        dates=F.array("session_date", "next_date"),
    )


def malformed_sessions(sessions: DataFrame, *, max_length: timedelta) -> Finding:
    longest = max_length.total_seconds()
    bad = sessions.where(
        (F.col("session_start") > F.col("session_end"))
        | (F.col("event_count") <= 0)
        | (F.col("duration_seconds") > F.lit(longest))
        | (F.to_date("session_start") != F.col("session_date"))
    )
    return _finding(
        bad,
        lambda r: f"{r.session_id}: {r.session_start}..{r.session_end} n={r.event_count}",
        dates=F.array("session_date"),
    )


def quarantine_mismatch(sessions: DataFrame, quarantine: DataFrame) -> Finding:
    flagged = sessions.where("is_quarantined").select("session_id", "session_date")
    listed = quarantine.select("session_id", "session_date")
    bad = flagged.exceptAll(listed).unionByName(listed.exceptAll(flagged))
    return _finding(bad, lambda r: str(r.session_id), dates=F.array("session_date"))


def unaccounted_lines(raw: DataFrame, events: DataFrame, rejected: DataFrame) -> Finding:
    """Per batch and event date: every valid raw row is an event or a cross-batch duplicate,
    exactly once."""
    key = ["received_date", "event_date"]

    def rows(frame: DataFrame, name: str) -> DataFrame:
        return frame.groupBy(*key).agg(F.count(F.lit(1)).alias(name))

    per_input = (
        rows(raw, "raw")
        .join(rows(events, "events"), key, "full")
        .join(rows(rejected.where(F.col("origin") == DEDUP), "duplicates"), key, "full")
        .fillna(0)
    )
    bad = per_input.where(F.col("raw") != F.col("events") + F.col("duplicates"))
    return _finding(
        bad,
        lambda r: (
            f"{r.received_date} -> {r.event_date}: raw {r.raw} != {r.events} + {r.duplicates}"
        ),
        dates=F.array("event_date"),
    )


def unbalanced_snapshot(snapshot: pa.Table) -> Finding:
    """An accumulating snapshot balances: each state's users are the day before's plus entries
    minus exits (nobody before the first day), and every day has all five states once.

    Five rows a day: checked on the driver from the Arrow rows, no Spark job.
    """
    bad: set[str] = set()
    before: dict[str, dict] = {}  # each state's row of the day before
    states_of: dict[date, list[str]] = {}
    for row in sorted(snapshot.to_pylist(), key=lambda r: (r["state"], r["snapshot_date"])):
        state, day = row["state"], row["snapshot_date"]
        states_of.setdefault(day, []).append(state)
        if state not in STATES:
            continue
        last = before.get(state)
        users = last["users"] if last else 0
        skipped = last is not None and (day - last["snapshot_date"]).days != 1
        if row["users"] != users + row["entered"] - row["exited"] or skipped:
            bad.add(f"{day}: {state}")
        before[state] = row
    for day, states in states_of.items():
        if sorted(states) != sorted(STATES):
            bad.add(f"{day}: incomplete day")
    return Finding(len(bad), sorted(bad)[:_SAMPLE])


def snapshot_off_intervals(snapshot_day: pa.Table, current: pa.Table) -> Finding:
    """The snapshot's last day counts, per state, the users whose current stretch is in it.

    `snapshot_day` holds that day's rows, `current` the open-ended interval rows (one per
    user): both small, checked on the driver.
    """
    stretches = Counter(current.column("state").to_pylist())
    users = {r["state"]: r["users"] for r in snapshot_day.to_pylist()}
    bad = [
        f"{state}: {users.get(state, 0)} users, {stretches.get(state, 0)} current stretches"
        for state in sorted({*users, *stretches})
        if users.get(state, 0) != stretches.get(state, 0)
    ]
    return Finding(len(bad), bad[:_SAMPLE])
