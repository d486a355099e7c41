"""Asset checks: the SPEC's invariants (`rules.py`), verified on the Delta tables as they are.

With a materialization a check reads what its run wrote; alone, the whole table (`scope.py`).
"""

import math
from datetime import date, timedelta

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    MetadataValue,
    asset_check,
)
from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sessionize_assets.checks.rules import (
    Finding,
    duplicate_event_ids,
    malformed_sessions,
    overlapping_sessions,
    quarantine_mismatch,
    unaccounted_lines,
    unbalanced_snapshot,
)
from sessionize_assets.checks.scope import (
    KEYED_CHECK_PAIRS,
    RunWrites,
    checked_dates,
    in_run,
    run_writes,
)
from sessionize_assets.lake.store import DeltaStore, TableSpec
from sessionize_assets.lake.tables import (
    EVENTS,
    RAW_EVENTS,
    REJECTED_EVENTS,
    SESSION_QUARANTINE,
    SESSIONS,
    USER_LIFECYCLE_SNAPSHOT,
)
from sessionize_assets.partitions import days_around
from sessionize_assets.pipeline.keyed_reads import keys_by_partition, read_by_keys
from sessionize_assets.pipeline.manifests import batch_inputs
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.settings import Settings


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
    # A session reaches at most L into the days after its start.
    reach = math.ceil(settings.max_session_length / timedelta(days=1))

    def store(context: AssetCheckExecutionContext) -> DeltaStore:
        lake: LakeResource = context.resources.lake
        return lake.store()

    def written(
        context: AssetCheckExecutionContext, lake_store: DeltaStore, spec: TableSpec
    ) -> RunWrites | None:
        """What this check's run wrote to `spec`; None alone, or if it names no such files."""
        return run_writes(lake_store, spec, context.run.run_id) if in_run(context) else None

    def users_near(
        lake_store: DeltaStore, pairs: DataFrame, *, before: int, after: int
    ) -> DataFrame | None:
        """Sessions of the (session_date, user_id) `pairs`' users on the days around their
        dates, from the files whose user range can hold them; None when too many pairs."""
        by_date = keys_by_partition(
            pairs, partition="session_date", key="user_id", limit=KEYED_CHECK_PAIRS
        )
        if by_date is None:
            return None
        near: dict[date, set[str]] = {}
        for day, users in by_date.items():
            for around in days_around([day], before=before, after=after):
                near.setdefault(around, set()).update(users)
        files = lake_store.files_with_values(
            SESSIONS, column="user_id", values={d: sorted(u) for d, u in sorted(near.items())}
        )
        users = pairs.select("user_id").distinct()
        return lake_store.read_files(SESSIONS, files).join(
            F.broadcast(users), on="user_id", how="left_semi"
        )

    @asset_check(
        asset="events",
        required_resource_keys={"lake"},
        description="Every event id appears once in events.",
    )
    def unique_event_ids(context: AssetCheckExecutionContext) -> AssetCheckResult:
        lake_store = store(context)
        writes = written(context, lake_store, EVENTS)
        if writes and writes.added:
            # The ids the run added, and every copy of them on their dates, found by id.
            added = lake_store.read_files(EVENTS, writes.added).select("event_date", "event_id")
            added = added.persist(StorageLevel.MEMORY_AND_DISK)
            try:
                lookup = read_by_keys(
                    lake_store, EVENTS, wanted=added, key="event_id", columns=added.columns
                )
                finding = duplicate_event_ids(lookup.rows)
            finally:
                added.unpersist()
        else:
            dates = checked_dates(context, lake_store, EVENTS)
            finding = duplicate_event_ids(lake_store.read(EVENTS, partitions=dates))
        return _result(finding, "duplicated event ids")

    @asset_check(
        asset="sessions",
        required_resource_keys={"lake"},
        description="No two sessions of a user overlap.",
    )
    def no_overlapping_sessions(context: AssetCheckExecutionContext) -> AssetCheckResult:
        lake_store = store(context)
        writes = written(context, lake_store, SESSIONS)
        if writes and writes.added:
            # Only an added session can overlap: its user's sessions within reach of it.
            added = lake_store.read_files(SESSIONS, writes.added)
            near = users_near(lake_store, added, before=reach, after=reach)
            if near is not None:
                return _result(overlapping_sessions(near), "overlapping sessions")
        dates = checked_dates(context, lake_store, SESSIONS)
        around = None if dates is None else days_around(dates, before=reach, after=reach)
        sessions = lake_store.read(SESSIONS, partitions=around)
        return _result(overlapping_sessions(sessions, dates=dates), "overlapping sessions")

    @asset_check(
        asset="sessions",
        required_resource_keys={"lake"},
        description="start <= end, event_count > 0, no session longer than L, date of start.",
    )
    def sessions_well_formed(context: AssetCheckExecutionContext) -> AssetCheckResult:
        lake_store = store(context)
        writes = written(context, lake_store, SESSIONS)
        if writes and writes.added:
            sessions = lake_store.read_files(SESSIONS, writes.added)
        else:
            sessions = lake_store.read(
                SESSIONS, partitions=checked_dates(context, lake_store, SESSIONS)
            )
        finding = malformed_sessions(sessions, max_length=settings.max_session_length)
        return _result(finding, "malformed sessions")

    @asset_check(
        asset="session_quarantine",
        required_resource_keys={"lake"},
        description="Quarantine rows are exactly the sessions flagged is_quarantined.",
    )
    def quarantine_matches_flag(context: AssetCheckExecutionContext) -> AssetCheckResult:
        lake_store = store(context)
        dates = checked_dates(context, lake_store, SESSIONS, SESSION_QUARANTINE)
        quarantine = lake_store.read(SESSION_QUARANTINE, partitions=dates)
        sessions_written = written(context, lake_store, SESSIONS)
        quarantine_written = written(context, lake_store, SESSION_QUARANTINE)
        if (sessions_written or quarantine_written) and dates is not None:
            # A mismatch the run made involves a quarantine row of a date it wrote (there are
            # few), one it removed, or a flagged session it added: check those users' sessions.
            pair = ["session_date", "user_id"]
            removed = quarantine_written.removed if quarantine_written else []
            added = sessions_written.added if sessions_written else []
            pairs = (
                quarantine.select(*pair)
                .unionByName(lake_store.read_files(SESSION_QUARANTINE, removed).select(*pair))
                .unionByName(
                    lake_store.read_files(SESSIONS, added).where("is_quarantined").select(*pair)
                )
            )
            near = users_near(lake_store, pairs, before=0, after=0)
            if near is not None:
                sessions = near.join(F.broadcast(pairs.distinct()), on=pair, how="left_semi")
                finding = quarantine_mismatch(sessions, quarantine)
                return _result(finding, "session ids in one place only")
        sessions = lake_store.read(SESSIONS, partitions=dates)
        return _result(quarantine_mismatch(sessions, quarantine), "session ids in one place only")

    @asset_check(
        asset="events",
        required_resource_keys={"lake"},
        description="Per batch and event date, lines = events + rejected: each valid line is an "
        "event or a cross-batch duplicate.",
    )
    def every_line_accounted(context: AssetCheckExecutionContext) -> AssetCheckResult:
        lake_store = store(context)
        dates = checked_dates(context, lake_store, EVENTS)
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
