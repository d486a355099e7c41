"""Asset checks: the SPEC's invariants, verified on the Delta tables as they are.

A check that runs with a materialization checks the partitions that run wrote to (the Delta
log says which: commits carry the run id), so a daily batch pays for what it changed, not for
the history or the whole span of its range run. Run on its own (the UI's "Execute checks" on
an asset), a check has no partitions and checks the whole table.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    MetadataValue,
    asset_check,
)
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from sessionize_assets.lake.store import DeltaStore, TableSpec
from sessionize_assets.lake.tables import (
    EVENTS,
    RAW_EVENTS,
    REJECTED_EVENTS,
    SESSION_QUARANTINE,
    SESSIONS,
    USER_LIFECYCLE_SNAPSHOT,
)
from sessionize_assets.partitions import days_around, days_between
from sessionize_assets.pipeline.manifests import batch_inputs
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.lifecycle import STATES
from sessionize_assets.transforms.validation import DEDUP

_SAMPLE = 5


@dataclass(frozen=True)
class Finding:
    """Offending rows (none means the invariant holds) and a few of them to show."""

    violations: int
    sample: list[str]

    @property
    def passed(self) -> bool:
        return self.violations == 0


def _finding(bad: DataFrame, describe: Callable[[object], str]) -> Finding:
    bad = bad.cache()
    try:
        return Finding(bad.count(), [describe(r) for r in bad.limit(_SAMPLE).collect()])
    finally:
        bad.unpersist()


def duplicate_event_ids(events: DataFrame) -> Finding:
    bad = events.groupBy("event_id").count().where(F.col("count") > 1)
    return _finding(bad, lambda r: f"{r.event_id} x{r['count']}")


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
    return _finding(bad, lambda r: f"{r.user_id}: {r.session_start}..{r.session_end}")


def malformed_sessions(sessions: DataFrame, *, max_length: timedelta) -> Finding:
    longest = max_length.total_seconds()
    bad = sessions.where(
        (F.col("session_start") > F.col("session_end"))
        | (F.col("event_count") <= 0)
        | (F.col("duration_seconds") > F.lit(longest))
        | (F.to_date("session_start") != F.col("session_date"))
    )
    return _finding(
        bad, lambda r: f"{r.session_id}: {r.session_start}..{r.session_end} n={r.event_count}"
    )


def quarantine_mismatch(sessions: DataFrame, quarantine: DataFrame) -> Finding:
    flagged = sessions.where("is_quarantined").select("session_id")
    listed = quarantine.select("session_id")
    bad = flagged.exceptAll(listed).unionByName(listed.exceptAll(flagged))
    return _finding(bad, lambda r: str(r.session_id))


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
    )


def unbalanced_snapshot(snapshot: DataFrame) -> Finding:
    """An accumulating snapshot balances: each state's users are the day before's plus entries
    minus exits (nobody before the first day), and every day has all five states once."""
    by_day = Window.partitionBy("state").orderBy("snapshot_date")
    before = F.coalesce(F.lag("users").over(by_day), F.lit(0))
    gap = F.datediff("snapshot_date", F.lag("snapshot_date").over(by_day))
    unbalanced = (
        snapshot.where(F.col("state").isin(*STATES))
        .withColumn("_bad", (F.col("users") != before + F.col("entered") - F.col("exited")))
        .withColumn("_gap", gap)
        .where(F.col("_bad") | (F.col("_gap") != 1))
    )
    incomplete = (
        snapshot.groupBy("snapshot_date")
        .agg(F.count(F.lit(1)).alias("rows"), F.countDistinct("state").alias("states"))
        .where((F.col("rows") != len(STATES)) | (F.col("states") != len(STATES)))
        .select("snapshot_date", F.lit("incomplete day").alias("state"))
    )
    bad = unbalanced.select("snapshot_date", "state").unionByName(incomplete)
    return _finding(bad, lambda r: f"{r.snapshot_date}: {r.state}")


def _result(finding: Finding, what: str) -> AssetCheckResult:
    return AssetCheckResult(
        passed=finding.passed,
        metadata={
            "violations": finding.violations,
            "sample": MetadataValue.json(finding.sample),
            "what": what,
        },
    )


# A run commits to a table a few times, so its commits are among the table's latest ones.
_RECENT_COMMITS = 50


def _written_dates(
    store: DeltaStore, specs: tuple[TableSpec, ...], run_id: str
) -> set[date] | None:
    """Partitions in which this run's commits to these tables added or removed files.

    From the Delta log (commits carry the run id): proportional to what the run wrote. None
    when the files of such a commit are no longer known.
    """
    dates: set[date] = set()
    for spec in specs:
        for commit in store.history(spec, limit=_RECENT_COMMITS):
            if commit.get("dagster_run_id") != run_id:
                continue
            version = int(commit["version"])
            changes = store.changes(spec, since_version=version - 1, through_version=version)
            if changes is None:
                return None
            dates |= {date.fromisoformat(change.partition) for change in changes}
    return dates


def _checked_dates(
    context: AssetCheckExecutionContext, store: DeltaStore, *written: TableSpec
) -> list[date] | None:
    """What a check covers: None (the whole table) for a check run alone; in a run that wrote
    to the `written` tables, the partitions it wrote; otherwise the run's partitions."""
    if not (context.has_partition_key or context.has_partition_key_range):
        return None
    dates = _written_dates(store, written, context.run.run_id)
    if dates:
        return sorted(dates)
    keys = context.partition_key_range
    return days_between(date.fromisoformat(keys.start), date.fromisoformat(keys.end))


def build_checks(*, settings: Settings) -> list[AssetChecksDefinition]:
    def store(context: AssetCheckExecutionContext) -> DeltaStore:
        lake: LakeResource = context.resources.lake
        return lake.store()

    def sessions_of(
        context: AssetCheckExecutionContext, *written: TableSpec
    ) -> tuple[DataFrame, list[date] | None]:
        lake_store = store(context)
        dates = _checked_dates(context, lake_store, *written)
        return lake_store.read(SESSIONS, partitions=dates), dates

    @asset_check(
        asset="events",
        required_resource_keys={"lake"},
        description="Every event id appears once in events.",
    )
    def unique_event_ids(context: AssetCheckExecutionContext) -> AssetCheckResult:
        lake_store = store(context)
        events = lake_store.read(EVENTS, partitions=_checked_dates(context, lake_store, EVENTS))
        return _result(duplicate_event_ids(events), "duplicated event ids")

    @asset_check(
        asset="sessions",
        required_resource_keys={"lake"},
        description="No two sessions of a user overlap.",
    )
    def no_overlapping_sessions(context: AssetCheckExecutionContext) -> AssetCheckResult:
        lake_store = store(context)
        dates = _checked_dates(context, lake_store, SESSIONS)
        # A session reaches at most L into the days after its start.
        reach = math.ceil(settings.max_session_length / timedelta(days=1))
        around = None if dates is None else days_around(dates, before=reach, after=reach)
        sessions = lake_store.read(SESSIONS, partitions=around)
        return _result(overlapping_sessions(sessions, dates=dates), "overlapping sessions")

    @asset_check(
        asset="sessions",
        required_resource_keys={"lake"},
        description="start <= end, event_count > 0, no session longer than L, date of start.",
    )
    def sessions_well_formed(context: AssetCheckExecutionContext) -> AssetCheckResult:
        sessions, _ = sessions_of(context, SESSIONS)
        finding = malformed_sessions(sessions, max_length=settings.max_session_length)
        return _result(finding, "malformed sessions")

    @asset_check(
        asset="session_quarantine",
        required_resource_keys={"lake"},
        description="Quarantine rows are exactly the sessions flagged is_quarantined.",
    )
    def quarantine_matches_flag(context: AssetCheckExecutionContext) -> AssetCheckResult:
        sessions, dates = sessions_of(context, SESSIONS, SESSION_QUARANTINE)
        quarantine = store(context).read(SESSION_QUARANTINE, partitions=dates)
        return _result(quarantine_mismatch(sessions, quarantine), "session ids in one place only")

    @asset_check(
        asset="events",
        required_resource_keys={"lake"},
        description="Per batch and event date, lines = events + rejected: each valid line is an "
        "event or a cross-batch duplicate.",
    )
    def every_line_accounted(context: AssetCheckExecutionContext) -> AssetCheckResult:
        lake_store = store(context)
        dates = _checked_dates(context, lake_store, EVENTS)
        if dates is None:
            raw = lake_store.read(RAW_EVENTS)
            events = lake_store.read(EVENTS)
            rejected = lake_store.read(REJECTED_EVENTS)
        else:
            # The batches holding events of these dates (from the index), those dates only.
            inputs = batch_inputs(lake_store, dates).values()
            batches = sorted({received for held in inputs for _, received in held})
            on_dates = F.col("event_date").isin(dates)
            raw = lake_store.read(RAW_EVENTS, partitions=batches).where(on_dates)
            events = lake_store.read(EVENTS, partitions=dates)
            rejected = lake_store.read(REJECTED_EVENTS, partitions=batches).where(on_dates)
        finding = unaccounted_lines(raw, events, rejected)
        return _result(finding, "inputs whose rows do not add up")

    @asset_check(
        asset=USER_LIFECYCLE_SNAPSHOT.name,
        required_resource_keys={"lake"},
        description="Each day has the five states, and users = the day before + entered - exited.",
    )
    def snapshot_balances(context: AssetCheckExecutionContext) -> AssetCheckResult:
        # Five rows a day: the whole snapshot is cheaper to check than to scope.
        finding = unbalanced_snapshot(store(context).read(USER_LIFECYCLE_SNAPSHOT))
        return _result(finding, "days or states that do not balance")

    return [
        snapshot_balances,
        unique_event_ids,
        no_overlapping_sessions,
        sessions_well_formed,
        quarantine_matches_flag,
        every_line_accounted,
    ]
