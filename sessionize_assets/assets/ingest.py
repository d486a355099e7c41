"""Landing batches -> `raw_events` + `rejected_events`, one partition per received day.

A run covers one batch or a range of them (a backfill is one run and one Spark job); each
batch's partition is reported with its own figures.
"""

from collections.abc import Callable, Iterator, Mapping
from datetime import date

from dagster import (
    AssetExecutionContext,
    AssetMaterialization,
    AssetsDefinition,
    PartitionsDefinition,
)

from sessionize_assets.assets.lake_step import lake_step
from sessionize_assets.assets.metadata import lake_asset_spec, lake_multi_asset, markdown_table
from sessionize_assets.assets.reports import (
    IngestRunMetadata,
    RawBatchMetadata,
    RejectedBatchMetadata,
    reported_version,
)
from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import LANDING_BATCHES, RAW_EVENTS, REJECTED_EVENTS
from sessionize_assets.pipeline.ingest import BatchIngested, IngestResult, ingest_landed
from sessionize_assets.pipeline.landing import BatchFingerprint, fingerprint, ingested_batches
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.landing import (
    BatchFileError,
    LandingZoneResource,
    unreadable_file,
)
from sessionize_assets.settings import Settings

LATENESS_BUCKETS = (("same day", 0, 0), ("1 day", 1, 1), ("2-7 days", 2, 7), ("8-30 days", 8, 30))


def lateness(batch: BatchIngested) -> dict[str, int]:
    """Accepted events by how many days after their event date they were received."""
    buckets: dict[str, int] = {}
    for day, count in sorted(batch.events_by_date.items()):
        days_late = (batch.received - day).days
        label = next(
            (name for name, low, high in LATENESS_BUCKETS if low <= days_late <= high),
            "over 30 days" if days_late > 0 else "same day",  # next-day events: clock skew
        )
        buckets[label] = buckets.get(label, 0) + count
    return buckets


def build_ingest_assets(
    *, settings: Settings, partitions_def: PartitionsDefinition
) -> AssetsDefinition:
    @lake_multi_asset(
        name="ingest_batch",
        partitions_def=partitions_def,
        specs=[
            lake_asset_spec(
                RAW_EVENTS,
                description="Every valid line of a landing batch, parsed, by received day.",
                group="ingest",
                layer="bronze",
                skippable=True,  # reported per batch below, with that batch's own figures
            ),
            lake_asset_spec(
                REJECTED_EVENTS,
                description="Lines that failed validation, with the reason, per received day.",
                group="ingest",
                layer="bronze",
                skippable=True,
            ),
        ],
    )
    def ingest_batch(
        context: AssetExecutionContext, landing: LandingZoneResource, lake: LakeResource
    ):
        """Validate landing batches and replace their raw_events and rejected_events partitions."""
        with lake_step(context, lake, step="ingest") as step:
            store = step.store
            days = _batches_to_read(context, landing, store, days=step.dates)
            if not days:
                return
            files = {day: landing.batch_files(day) for day in days}
            ignored = {day: landing.ignored_files(day) for day in days}
            for day in days:
                if not files[day]:
                    context.log.warning(
                        f"no batch files at {landing.batch_dir(day)}: an empty batch"
                    )
                if ignored[day]:
                    names = ", ".join(ignored[day])
                    context.log.warning(f"batch {day}: not batch files, ignored: {names}")
            # Taken before the lines are read: a file replaced meanwhile shows as changed again.
            fingerprints = {day: fingerprint(day, files[day]) for day in days}
            try:
                # A daily batch is read, parsed and written on the driver: no Spark session.
                with step.counting_jobs(on_demand=True):
                    result = ingest_landed(
                        store,
                        landing,
                        step.spark,
                        fingerprints=fingerprints,
                        settings=settings,
                        run_id=step.run_id,
                    )
                jobs = step.spark_jobs()
            except Exception as error:  # Spark's read errors reach Python as Py4J errors
                path = unreadable_file(error)
                if path is None:
                    raise
                # Every line is counted before the first commit: the read fails before it.
                raise BatchFileError(
                    f"cannot read batch file {path} (truncated or corrupt?): nothing of received "
                    f"days {days[0]}..{days[-1]} was committed"
                ) from error
            yield from batch_materializations(
                store,
                result,
                files={day: len(files[day]) for day in days},
                ignored=ignored,
                fingerprints=fingerprints,
                spark_jobs=jobs,
                log=context.log.info,
            )

    return ingest_batch


def batch_materializations(
    store: DeltaStore,
    result: IngestResult,
    *,
    files: Mapping[date, int],
    ignored: Mapping[date, list[str]],
    fingerprints: Mapping[date, BatchFingerprint],
    spark_jobs: int | None,
    log: Callable[[str], None],
) -> Iterator[AssetMaterialization]:
    """Each ingested batch's `raw_events` and `rejected_events` partitions, with the figures
    of what they hold (the run's own on the last): what an ingest run reports, and an erasure
    that ingests batches again (`erasure_jobs.py`). `files`: files read per batch."""
    days = sorted(result.batches)
    rejected_rows = store.row_counts(REJECTED_EVENTS, partitions=days)
    for day in days:
        batch = result.batches[day]
        late = lateness(batch)
        raw = RawBatchMetadata(
            row_count=batch.accepted,
            lines=batch.accepted + batch.rejected,
            accepted=batch.accepted,
            rejected=batch.rejected,
            late_events=batch.accepted - late.get("same day", 0),
            event_dates={d.isoformat(): n for d, n in sorted(batch.events_by_date.items())},
            lateness=late,
            summary=_batch_summary(batch, late),
            files=files[day],
            ignored_files=ignored[day],
            batch_fingerprint=fingerprints[day].digest,
            batch_bytes=fingerprints[day].total_bytes,
            uri=store.uri(RAW_EVENTS),
            delta_version=reported_version(result.raw.version),
            index_version=reported_version(result.index.version),
            touched_event_dates=[d.isoformat() for d in batch.touched_event_dates],
        )
        log(
            f"batch {day}: {files[day]} files, {batch.accepted} accepted, "
            f"{batch.rejected} rejected, {raw.late_events} late"
        )
        yield AssetMaterialization(
            asset_key=RAW_EVENTS.name,
            partition=day.isoformat(),
            metadata=raw.to_metadata()
            | (IngestRunMetadata(spark_jobs=spark_jobs).to_metadata() if day == days[-1] else {}),
        )
        yield AssetMaterialization(
            asset_key=REJECTED_EVENTS.name,
            partition=day.isoformat(),
            metadata=RejectedBatchMetadata(
                row_count=rejected_rows.get(day.isoformat(), 0),
                rejected_at_ingestion=batch.rejected,
                rejected_by_reason=batch.rejected_by_reason,
                uri=store.uri(REJECTED_EVENTS),
                delta_version=reported_version(result.rejected.version),
                summary=markdown_table(batch.rejected_by_reason, key="reason", value="lines"),
            ).to_metadata(),
        )


def _batches_to_read(
    context: AssetExecutionContext,
    landing: LandingZoneResource,
    store: DeltaStore,
    *,
    days: list[date],
) -> list[date]:
    """The run's received `days` but those ingested before whose folder is gone (landing
    retention): what they hold stays, and the run says so; it is never replaced by nothing.
    A day never ingested without a folder is an empty batch, as is an empty folder."""
    ingested = ingested_batches(store.read_arrow(LANDING_BATCHES, partitions=days))
    kept = [day for day in days if day in ingested and not landing.batch_dir(day).is_dir()]
    for day in kept:
        context.log.warning(
            f"batch {day} was ingested from {len(ingested[day].files)} files and its folder "
            f"{landing.batch_dir(day)} is gone: what was ingested stays, untouched"
        )
    return [day for day in days if day not in kept]


def _batch_summary(batch: BatchIngested, late: dict[str, int]) -> str:
    lines = batch.accepted + batch.rejected
    late_events = batch.accepted - late.get("same day", 0)
    return (
        f"**{lines}** lines: **{batch.accepted}** accepted, **{batch.rejected}** "
        f"rejected; **{late_events}** late events over "
        f"**{len(batch.events_by_date)}** event dates.\n\n"
        + markdown_table(late, key="lateness", value="events")
    )
