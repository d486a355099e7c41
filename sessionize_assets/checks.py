"""Asset checks: the SPEC's invariants, verified on the Delta tables as they are."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from dagster import AssetCheckResult, AssetChecksDefinition, MetadataValue, asset_check
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import (
    EVENTS,
    RAW_EVENTS,
    REJECTED_EVENTS,
    SESSION_QUARANTINE,
    SESSIONS,
    USER_LIFECYCLE_SNAPSHOT,
)
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


def overlapping_sessions(sessions: DataFrame) -> Finding:
    following = Window.partitionBy("user_id").orderBy("session_start", "session_id")
    bad = sessions.withColumn("next_start", F.lead("session_start").over(following)).where(
        F.col("next_start") <= F.col("session_end")
    )
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
    """Per batch: every valid raw row is an event or a cross-batch duplicate, exactly once."""
    per_batch = (
        raw.groupBy("received_date")
        .agg(F.count(F.lit(1)).alias("raw"))
        .join(
            events.groupBy("received_date").agg(F.count(F.lit(1)).alias("events")),
            "received_date",
            "full",
        )
        .join(
            rejected.where(F.col("origin") == DEDUP)
            .groupBy("received_date")
            .agg(F.count(F.lit(1)).alias("duplicates")),
            "received_date",
            "full",
        )
        .fillna(0)
    )
    bad = per_batch.where(F.col("raw") != F.col("events") + F.col("duplicates"))
    return _finding(bad, lambda r: f"{r.received_date}: raw {r.raw} != {r.events} + {r.duplicates}")


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


def build_checks(*, settings: Settings) -> list[AssetChecksDefinition]:
    def store(lake: LakeResource) -> DeltaStore:
        return lake.store()

    @asset_check(asset="events", description="Every event id appears once in events.")
    def unique_event_ids(lake: LakeResource) -> AssetCheckResult:
        return _result(duplicate_event_ids(store(lake).read(EVENTS)), "duplicated event ids")

    @asset_check(asset="sessions", description="No two sessions of a user overlap.")
    def no_overlapping_sessions(lake: LakeResource) -> AssetCheckResult:
        return _result(overlapping_sessions(store(lake).read(SESSIONS)), "overlapping sessions")

    @asset_check(
        asset="sessions",
        description="start <= end, event_count > 0, no session longer than L, date of start.",
    )
    def sessions_well_formed(lake: LakeResource) -> AssetCheckResult:
        finding = malformed_sessions(
            store(lake).read(SESSIONS), max_length=settings.max_session_length
        )
        return _result(finding, "malformed sessions")

    @asset_check(
        asset="session_quarantine",
        description="Quarantine rows are exactly the sessions flagged is_quarantined.",
    )
    def quarantine_matches_flag(lake: LakeResource) -> AssetCheckResult:
        lake_store = store(lake)
        finding = quarantine_mismatch(
            lake_store.read(SESSIONS), lake_store.read(SESSION_QUARANTINE)
        )
        return _result(finding, "session ids in one place only")

    @asset_check(
        asset="events",
        description="Per batch, lines = events + rejected: each valid line is an event or a "
        "cross-batch duplicate.",
    )
    def every_line_accounted(lake: LakeResource) -> AssetCheckResult:
        lake_store = store(lake)
        finding = unaccounted_lines(
            lake_store.read(RAW_EVENTS), lake_store.read(EVENTS), lake_store.read(REJECTED_EVENTS)
        )
        return _result(finding, "batches whose rows do not add up")

    @asset_check(
        asset=USER_LIFECYCLE_SNAPSHOT.name,
        description="Each day has the five states, and users = the day before + entered - exited.",
    )
    def snapshot_balances(lake: LakeResource) -> AssetCheckResult:
        finding = unbalanced_snapshot(store(lake).read(USER_LIFECYCLE_SNAPSHOT))
        return _result(finding, "days or states that do not balance")

    return [
        snapshot_balances,
        unique_event_ids,
        no_overlapping_sessions,
        sessions_well_formed,
        quarantine_matches_flag,
        every_line_accounted,
    ]
