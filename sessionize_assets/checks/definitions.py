"""Asset checks: the SPEC's invariants (`rules.py`), verified on the Delta tables as they are.

The lifecycle's checks run inside its asset (`assets/lifecycle.py`), on what each run wrote.

With a materialization a check reads what its run wrote; alone, the whole table (`scope.py`).

Every check is blocking: when it fails, its run fails (and what depends on the asset in that
run is not computed), so neither a run nor `sessionize replay` passes it for a success. It
also marks the dates of the offending rows to be derived again from their inputs
(`manifests.recompute_event_dates` / `recompute_session_dates`): the sensors then ask for
them, and the recompute heals them. A check holds the lake's writer lock while it reads, so no
run commits between its reads of tables that must agree.
"""

import math
from collections.abc import Callable
from datetime import timedelta
from functools import wraps
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    MetadataValue,
    asset_check,
)
from pyspark import StorageLevel
from pyspark.sql import functions as F

from sessionize_assets.checks.rules import (
    Finding,
    duplicate_event_ids,
    malformed_sessions,
    overlapping_sessions,
    quarantine_mismatch,
    unaccounted_lines,
)
from sessionize_assets.checks.scope import (
    added_rows,
    checked_dates,
    covered_dates,
    sessions_near,
    written,
)
from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import (
    EVENTS,
    RAW_EVENTS,
    REJECTED_EVENTS,
    SESSION_QUARANTINE,
    SESSIONS,
)
from sessionize_assets.partitions import days_around
from sessionize_assets.pipeline.event_ids import copies_of
from sessionize_assets.pipeline.keyed_reads import read_by_keys
from sessionize_assets.pipeline.manifests import (
    batch_inputs,
    recompute_event_dates,
    recompute_session_dates,
)
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.spark import counting_jobs
from sessionize_assets.settings import Settings

Check = Callable[[AssetCheckExecutionContext], AssetCheckResult]


def lake_check(**kwargs: Any) -> Callable[[Check], AssetChecksDefinition]:
    """`asset_check` for a blocking check of the lake, run holding the lake's writer lock; its
    result reports the Spark jobs it started (`spark_jobs`), as the assets' runs do."""

    def decorate(check: Check) -> AssetChecksDefinition:
        @wraps(check)
        def held(context: AssetCheckExecutionContext) -> AssetCheckResult:
            lake: LakeResource = context.resources.lake
            with (
                lake.writer(context, step=f"check {check.__name__}"),
                counting_jobs(lake.spark.session(), check.__name__) as spark_jobs,
            ):
                result = check(context)
            jobs = spark_jobs()
            if jobs is None:  # Spark Connect: not counted
                return result
            return result.with_metadata({**result.metadata, "spark_jobs": jobs})

        return asset_check(required_resource_keys={"lake"}, blocking=True, **kwargs)(held)

    return decorate


def check_result(finding: Finding, what: str, **kwargs: Any) -> AssetCheckResult:
    """A check's outcome with its violation count and a sample (kwargs: check_name, ...)."""
    return AssetCheckResult(
        **kwargs,
        passed=finding.passed,
        metadata={
            "violations": finding.violations,
            "sample": MetadataValue.json(finding.sample),
            "what": what,
            "dates": MetadataValue.json([day.isoformat() for day in finding.dates]),
        },
    )


def healing_result(
    context: AssetCheckExecutionContext,
    store: DeltaStore,
    finding: Finding,
    what: str,
    *,
    recompute: Callable[..., None],
) -> AssetCheckResult:
    """`check_result`, after marking the failing dates to be derived again (`recompute`:
    `recompute_event_dates` or `recompute_session_dates`)."""
    if finding.dates:
        recompute(store, finding.dates, run_id=context.run.run_id)
        context.log.warning(
            f"{finding.violations} {what} on {len(finding.dates)} dates "
            f"({finding.dates[0]}..{finding.dates[-1]}): marked to be recomputed from their "
            "inputs; the sensors ask for them"
        )
    return check_result(finding, what)


def build_checks(*, settings: Settings) -> list[AssetChecksDefinition]:
    # A session reaches at most L into the days after its start.
    reach = math.ceil(settings.max_session_length / timedelta(days=1))

    def store(context: AssetCheckExecutionContext) -> DeltaStore:
        lake: LakeResource = context.resources.lake
        return lake.store()

    @lake_check(
        asset="events", description="Every event id appears once in events, over every date."
    )
    def unique_event_ids(context: AssetCheckExecutionContext) -> AssetCheckResult:
        lake_store = store(context)
        added = added_rows(context, lake_store, EVENTS)
        if added is None:
            dates = checked_dates(context, lake_store, EVENTS)
            return healing_result(
                context,
                lake_store,
                duplicate_event_ids(lake_store.read(EVENTS, partitions=dates)),
                "duplicated event ids",
                recompute=recompute_event_dates,
            )
        # The ids the run added, and every copy of them in `events` on any date: the id index
        # names the dates their copies are on, where they are found by id.
        added = added.select("event_date", "event_id").persist(StorageLevel.MEMORY_AND_DISK)
        copies = copies_of(lake_store, added)
        wanted = (
            copies.rows.select("event_date", "event_id")
            .unionByName(added)
            .distinct()
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        try:
            lookup = read_by_keys(
                lake_store, EVENTS, wanted=wanted, key="event_id", columns=wanted.columns
            )
            return healing_result(
                context,
                lake_store,
                duplicate_event_ids(lookup.rows),
                "duplicated event ids",
                recompute=recompute_event_dates,
            )
        finally:
            wanted.unpersist()
            added.unpersist()

    @lake_check(asset="sessions", description="No two sessions of a user overlap.")
    def no_overlapping_sessions(context: AssetCheckExecutionContext) -> AssetCheckResult:
        lake_store = store(context)
        added = added_rows(context, lake_store, SESSIONS)
        # Only an added session can overlap: its user's sessions within reach of it.
        near = (
            None if added is None else sessions_near(lake_store, added, before=reach, after=reach)
        )
        if near is not None:
            return healing_result(
                context,
                lake_store,
                overlapping_sessions(near),
                "overlapping sessions",
                recompute=recompute_session_dates,
            )
        dates = checked_dates(context, lake_store, SESSIONS)
        around = None if dates is None else days_around(dates, before=reach, after=reach)
        sessions = lake_store.read(SESSIONS, partitions=around)
        return healing_result(
            context,
            lake_store,
            overlapping_sessions(sessions, dates=dates),
            "overlapping sessions",
            recompute=recompute_session_dates,
        )

    @lake_check(
        asset="sessions",
        description="start <= end, event_count > 0, no session longer than L, date of start.",
    )
    def sessions_well_formed(context: AssetCheckExecutionContext) -> AssetCheckResult:
        lake_store = store(context)
        sessions = added_rows(context, lake_store, SESSIONS)
        if sessions is None:
            dates = checked_dates(context, lake_store, SESSIONS)
            sessions = lake_store.read(SESSIONS, partitions=dates)
        finding = malformed_sessions(sessions, max_length=settings.max_session_length)
        return healing_result(
            context, lake_store, finding, "malformed sessions", recompute=recompute_session_dates
        )

    @lake_check(
        asset="session_quarantine",
        description="Quarantine rows are exactly the sessions flagged is_quarantined.",
    )
    def quarantine_matches_flag(context: AssetCheckExecutionContext) -> AssetCheckResult:
        lake_store = store(context)
        sessions_written = written(context, lake_store, SESSIONS)
        quarantine_written = written(context, lake_store, SESSION_QUARANTINE)
        dates = covered_dates(context, [sessions_written, quarantine_written])
        quarantine = lake_store.read(SESSION_QUARANTINE, partitions=dates)
        sessions = None
        if sessions_written or quarantine_written:
            # A mismatch the run made involves a quarantine row of a date it wrote (there are
            # few), one it removed, or a flagged session it added: those users' sessions.
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
            near = sessions_near(lake_store, pairs, before=0, after=0)
            if near is not None:
                sessions = near.join(F.broadcast(pairs.distinct()), on=pair, how="left_semi")
        if sessions is None:  # alone, or too many pairs to look up: the dates whole
            sessions = lake_store.read(SESSIONS, partitions=dates)
        return healing_result(
            context,
            lake_store,
            quarantine_mismatch(sessions, quarantine),
            "session ids in one place only",
            recompute=recompute_session_dates,
        )

    @lake_check(
        asset="events",
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
        return healing_result(
            context,
            lake_store,
            finding,
            "inputs whose rows do not add up",
            recompute=recompute_event_dates,
        )

    return [
        unique_event_ids,
        no_overlapping_sessions,
        sessions_well_formed,
        quarantine_matches_flag,
        every_line_accounted,
    ]
