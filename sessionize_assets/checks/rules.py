"""The SPEC's invariants: each returns the offending rows (`Violations`), `evaluate` counts them.

Pure functions of DataFrames (Spark queries), so each rule is unit-tested on a few rows; which
rows a check hands them (the whole table, or what a run wrote) is decided in `scope.py`. The
rules a check step runs are counted together, in one Spark job (`evaluate`): a passing step
costs that job. Rows already on the driver (a small run's writes, the lifecycle's few rows) are
checked there, with Arrow, by the same rules written for Arrow tables (`*_rows`, each a
`Finding` at once): no Spark job, and the rows are not handed to Spark for one.
"""

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from sessionize_assets.transforms.lifecycle_states import STATES
from sessionize_assets.transforms.row_sets import rows_less
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


def evaluate(rules: Mapping[str, Violations | Finding]) -> dict[str, Finding]:
    """Each rule's `Finding`: those of Spark's rows counted together, one Spark job when every
    rule holds, and one more for the sample and the dates of the rules that do not; those
    checked on the driver (a `Finding` already) as they are. No job when all are."""
    found = {name: rule for name, rule in rules.items() if isinstance(rule, Finding)}
    queried = {name: rule for name, rule in rules.items() if isinstance(rule, Violations)}
    return {**found, **_counted(queried)} if queried else found


def _counted(rules: Mapping[str, Violations]) -> dict[str, Finding]:
    """The Spark rules' findings, counted in one job (and one more when some fail)."""
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


def _timestamp_text(value: datetime) -> str:
    """A timestamp as Spark's `CAST(... AS STRING)` prints it in UTC (`_text`): seconds, then
    the fraction without its trailing zeros."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    text = value.strftime("%Y-%m-%d %H:%M:%S")
    return f"{text}.{value.microsecond:06d}".rstrip("0") if value.microsecond else text


def _found(lines: list[str], dates: Iterable[date | None]) -> Finding:
    """A driver rule's `Finding`: as `evaluate` makes one, the first lines in text order."""
    return Finding(
        len(lines), sorted(lines)[:_SAMPLE], sorted({day for day in dates if day is not None})
    )


def _kept(table: pa.Table, mask: pa.ChunkedArray | pa.Array) -> pa.Table:
    """The rows where `mask` is true (null, as in SQL's WHERE, is not)."""
    return table.filter(pc.fill_null(mask, False))


def duplicate_event_ids(events: DataFrame) -> Violations:
    bad = (
        events.groupBy("event_id")
        .agg(F.count(F.lit(1)).alias("count"), F.collect_set("event_date").alias("dates"))
        .where(F.col("count") > 1)
    )
    return Violations(
        bad, describe=F.format_string("%s x%d", "event_id", "count"), dates=F.col("dates")
    )


def duplicate_event_ids_rows(events: pa.Table) -> Finding:
    """`duplicate_event_ids` of Arrow rows (`event_id`, `event_date`), on the driver."""
    grouped = events.group_by("event_id").aggregate([([], "count_all"), ("event_date", "distinct")])
    bad = _kept(grouped, pc.greater(grouped.column("count_all"), 1)).to_pylist()
    return _found(
        [f"{row['event_id']} x{row['count_all']}" for row in bad],
        [day for row in bad for day in row["event_date_distinct"]],
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


def overlapping_sessions_rows(sessions: pa.Table) -> Finding:
    """`overlapping_sessions` (without `dates`) of Arrow rows, on the driver: each user's
    sessions in (session_start, session_id) order, a session whose next one starts before it
    ends."""
    ordered = sessions.sort_by(
        [(name, "ascending") for name in ("user_id", "session_start", "session_id")]
    )
    if ordered.num_rows < 2:
        return _found([], [])
    last = ordered.num_rows - 1
    column = ordered.column
    bad = _kept(
        ordered.slice(0, last).append_column("next_date", column("session_date").slice(1)),
        pc.and_kleene(
            pc.equal(column("user_id").slice(1), column("user_id").slice(0, last)),
            pc.less_equal(column("session_start").slice(1), column("session_end").slice(0, last)),
        ),
    ).to_pylist()
    return _found(
        [
            f"{row['user_id']}: {_timestamp_text(row['session_start'])}.."
            f"{_timestamp_text(row['session_end'])}"
            for row in bad
        ],
        [day for row in bad for day in (row["session_date"], row["next_date"])],
    )


def malformed_sessions_rows(sessions: pa.Table, *, max_length: timedelta) -> Finding:
    """`malformed_sessions` of Arrow rows, on the driver."""
    start, end = sessions.column("session_start"), sessions.column("session_end")
    tests = (
        pc.greater(start, end),
        pc.less_equal(sessions.column("event_count"), 0),
        pc.greater(sessions.column("duration_seconds"), max_length.total_seconds()),
        pc.not_equal(pc.cast(start, pa.date32()), sessions.column("session_date")),
    )
    bad = _kept(sessions, reduce(pc.or_kleene, tests)).to_pylist()
    return _found(
        [
            f"{row['session_id']}: {_timestamp_text(row['session_start'])}.."
            f"{_timestamp_text(row['session_end'])} n={row['event_count']}"
            for row in bad
        ],
        [row["session_date"] for row in bad],
    )


def quarantine_mismatch(sessions: DataFrame, quarantine: DataFrame) -> Violations:
    flagged = sessions.where("is_quarantined").select("session_id", "session_date")
    listed = quarantine.select("session_id", "session_date")
    bad = flagged.exceptAll(listed).unionByName(listed.exceptAll(flagged))
    return Violations(bad, describe=F.col("session_id"), dates=F.array("session_date"))


def quarantine_mismatch_rows(sessions: pa.Table, quarantine: pa.Table) -> Finding:
    """`quarantine_mismatch` of Arrow rows, on the driver: the flagged sessions and the
    quarantine rows each less the other, as multisets (`transforms.row_sets.rows_less`)."""
    key = ["session_id", "session_date"]
    flagged = _kept(sessions, sessions.column("is_quarantined")).select(key)
    listed = quarantine.select(key).cast(flagged.schema)
    bad = pa.concat_tables([rows_less(flagged, listed), rows_less(listed, flagged)]).to_pylist()
    return _found([row["session_id"] for row in bad], [row["session_date"] for row in bad])


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


def unaccounted_lines_rows(raw: pa.Table, events: pa.Table, rejected: pa.Table) -> Finding:
    """`unaccounted_lines` of Arrow rows, on the driver: `raw` and `events` hold
    `received_date` and `event_date`, `rejected` those and `origin`."""
    key = ("received_date", "event_date")

    def counts(rows: pa.Table) -> Counter[tuple]:
        grouped = rows.group_by(list(key)).aggregate([([], "count_all")])
        inputs = zip(*(grouped.column(name).to_pylist() for name in key), strict=True)
        return Counter(dict(zip(inputs, grouped.column("count_all").to_pylist(), strict=True)))

    duplicates = _kept(rejected, pc.equal(rejected.column("origin"), DEDUP))
    lines, kept, copies = counts(raw), counts(events), counts(duplicates)
    bad = [
        (received, day)
        for received, day in {*lines, *kept, *copies}
        if lines[received, day] != kept[received, day] + copies[received, day]
    ]
    return _found(
        [
            f"{received} -> {day}: raw {lines[received, day]} != "
            f"{kept[received, day]} + {copies[received, day]}"
            for received, day in bad
        ],
        [day for _, day in bad],
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
