"""The SPEC's invariants: each returns the offending rows (`Violations`), `evaluate` counts them.

Pure functions of DataFrames (Spark queries), or of Arrow tables for the lifecycle's few rows
(checked on the driver), so each rule is unit-tested on a few rows; which rows a check hands
them (the whole table, or what a run wrote) is decided in `scope.py`. The rules a check step
runs are counted together, in one Spark job (`evaluate`): a passing step costs that job.
"""

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, timedelta
from functools import reduce

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from sessionize_assets.transforms.lifecycle_states import STATES
from sessionize_assets.transforms.validation import DEDUP

_SAMPLE = 5
# The `sessions` columns the sessions rules read (`overlapping_sessions`, `malformed_sessions`,
# `quarantine_mismatch`): a check selects these before it caches or compares rows, so the
# attributes (SPEC §3b) are never read for it.
SESSION_CHECK_COLUMNS = (
    "session_id",
    "user_id",
    "session_date",
    "session_start",
    "session_end",
    "duration_seconds",
    "event_count",
    "is_quarantined",
)


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


@dataclass(frozen=True)
class Violations:
    """The offending rows of one rule, not yet computed: `describe` is each row's line in the
    sample (a string column), `dates` the array of partition dates it is on."""

    rows: DataFrame
    describe: Column
    dates: Column

    def finding(self) -> Finding:
        """This rule alone (`evaluate` counts several rules in one job)."""
        return evaluate({"rule": self})["rule"]


def evaluate(rules: Mapping[str, Violations]) -> dict[str, Finding]:
    """Each rule's `Finding`, counted together: one Spark job when every rule holds, and one
    more for the sample and the dates of the rules that do not."""
    names = sorted(rules)
    tagged = reduce(
        DataFrame.unionByName,
        [
            rules[name].rows.select(
                F.lit(name).alias("rule"),
                rules[name].describe.cast("string").alias("line"),
                rules[name].dates.cast("array<date>").alias("dates"),
            )
            for name in names
        ],
    )
    counts = {
        r["rule"]: r["n"] for r in tagged.groupBy("rule").agg(F.count("*").alias("n")).collect()
    }
    failed = sorted(name for name in names if counts.get(name))
    samples: dict[str, list[str]] = {name: [] for name in failed}
    dates: dict[str, set[date]] = {name: set() for name in failed}
    if failed:
        first = Window.partitionBy("rule").orderBy("line")
        bad = tagged.where(F.col("rule").isin(failed))
        shown = (
            bad.withColumn("_n", F.row_number().over(first))
            .where(F.col("_n") <= _SAMPLE)
            .select(
                "rule", F.lit(True).alias("shown"), "line", F.lit(None).cast("date").alias("day")
            )
        )
        held = bad.select(
            "rule",
            F.lit(False).alias("shown"),
            F.lit(None).cast("string").alias("line"),
            F.explode("dates").alias("day"),
        ).distinct()
        for row in shown.unionByName(held).collect():
            if row["shown"]:
                samples[row["rule"]].append(row["line"])
            elif row["day"] is not None:
                dates[row["rule"]].add(row["day"])
    return {
        name: Finding(
            counts.get(name, 0), sorted(samples.get(name, [])), sorted(dates.get(name, ()))
        )
        for name in names
    }


def _text(*columns: str) -> list[Column]:
    """Dates and timestamps as text (format_string would print their internal numbers)."""
    return [F.col(name).cast("string") for name in columns]


def duplicate_event_ids(events: DataFrame) -> Violations:
    bad = (
        events.groupBy("event_id")
        .agg(F.count(F.lit(1)).alias("count"), F.collect_set("event_date").alias("dates"))
        .where(F.col("count") > 1)
    )
    return Violations(
        bad, describe=F.format_string("%s x%d", "event_id", "count"), dates=F.col("dates")
    )


def overlapping_sessions(sessions: DataFrame, *, dates: list[date] | None = None) -> Violations:
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
    return Violations(
        bad,
        describe=F.format_string("%s: %s..%s", "user_id", *_text("session_start", "session_end")),
        dates=F.array("session_date", "next_date"),
    )


def malformed_sessions(sessions: DataFrame, *, max_length: timedelta) -> Violations:
    longest = max_length.total_seconds()
    bad = sessions.where(
        (F.col("session_start") > F.col("session_end"))
        | (F.col("event_count") <= 0)
        | (F.col("duration_seconds") > F.lit(longest))
        | (F.to_date("session_start") != F.col("session_date"))
    )
    return Violations(
        bad,
        describe=F.format_string(
            "%s: %s..%s n=%d", "session_id", *_text("session_start", "session_end"), "event_count"
        ),
        dates=F.array("session_date"),
    )


def quarantine_mismatch(sessions: DataFrame, quarantine: DataFrame) -> Violations:
    flagged = sessions.where("is_quarantined").select("session_id", "session_date")
    listed = quarantine.select("session_id", "session_date")
    bad = flagged.exceptAll(listed).unionByName(listed.exceptAll(flagged))
    return Violations(bad, describe=F.col("session_id"), dates=F.array("session_date"))


def unaccounted_lines(raw: DataFrame, events: DataFrame, rejected: DataFrame) -> Violations:
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
    return Violations(
        bad,
        describe=F.format_string(
            "%s -> %s: raw %d != %d + %d",
            *_text("received_date", "event_date"),
            "raw",
            "events",
            "duplicates",
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
