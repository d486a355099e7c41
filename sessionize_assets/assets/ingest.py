"""Landing batch -> `raw_events` + `rejected_events`, one partition per received day."""

from dataclasses import dataclass
from datetime import date
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    MaterializeResult,
    MetadataValue,
    PartitionsDefinition,
    multi_asset,
)
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sessionize_assets.assets.metadata import commit_metadata, lake_asset_spec, markdown_table
from sessionize_assets.lake.tables import RAW_EVENTS, REJECTED_EVENTS
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.validation import INGEST, REASONS
from sessionize_assets.updates import ingest_batch_lines

LATENESS_BUCKETS = (("same day", 0, 0), ("1 day", 1, 1), ("2-7 days", 2, 7), ("8-30 days", 8, 30))


@dataclass(frozen=True, kw_only=True)
class BatchProfile:
    """What a committed batch holds: drives the late-data sensor and the UI."""

    accepted: int
    rejected_by_reason: dict[str, int]
    events_by_date: dict[str, int]
    lateness: dict[str, int]

    @property
    def rejected(self) -> int:
        return sum(self.rejected_by_reason.values())

    @property
    def late_events(self) -> int:
        return self.accepted - self.lateness.get("same day", 0)


def profile_batch(raw: DataFrame, rejected: DataFrame, *, received: date) -> BatchProfile:
    by_date = {
        row["event_date"].isoformat(): row["count"]
        for row in raw.groupBy("event_date").count().orderBy("event_date").collect()
    }
    by_reason = {reason: 0 for reason in REASONS}
    for row in rejected.groupBy("reason").count().collect():
        by_reason[row["reason"]] = row["count"]
    lateness: dict[str, int] = {}
    for day, count in by_date.items():
        days_late = (received - date.fromisoformat(day)).days
        label = next(
            (name for name, low, high in LATENESS_BUCKETS if low <= days_late <= high),
            "over 30 days" if days_late > 0 else "same day",  # next-day events: clock skew
        )
        lateness[label] = lateness.get(label, 0) + count
    return BatchProfile(
        accepted=sum(by_date.values()),
        rejected_by_reason=by_reason,
        events_by_date=by_date,
        lateness=lateness,
    )


def build_ingest_assets(
    *, settings: Settings, partitions_def: PartitionsDefinition
) -> AssetsDefinition:
    @multi_asset(
        name="ingest_batch",
        partitions_def=partitions_def,
        specs=[
            lake_asset_spec(
                RAW_EVENTS,
                description="Every valid line of a landing batch, parsed, by received day.",
                group="ingest",
                layer="bronze",
            ),
            lake_asset_spec(
                REJECTED_EVENTS,
                description="Lines that failed validation, with the reason, per received day.",
                group="ingest",
                layer="bronze",
            ),
        ],
    )
    def ingest_batch(
        context: AssetExecutionContext, landing: LandingZoneResource, lake: LakeResource
    ):
        """Validate one landing batch and replace its raw_events and rejected_events partitions."""
        received = date.fromisoformat(context.partition_key)
        store = lake.store()
        spark = lake.spark.session()
        files = landing.batch_files(received)
        if not files:
            context.log.warning(f"no batch folder or files at {landing.batch_dir(received)}")
        result = ingest_batch_lines(
            store,
            landing.read_lines(spark, received),
            received=received,
            settings=settings,
            run_id=context.run.run_id,
        )
        profile = profile_batch(
            store.read(RAW_EVENTS, partitions=[received]),
            store.read(REJECTED_EVENTS, partitions=[received]).where(F.col("origin") == INGEST),
            received=received,
        )
        raw_commit, rejected_commit = result.raw, result.rejected
        context.log.info(
            f"batch {received}: {len(files)} files, {profile.accepted} accepted, "
            f"{profile.rejected} rejected, {profile.late_events} late"
        )
        yield MaterializeResult(
            asset_key="raw_events",
            metadata=_raw_metadata(profile)
            | commit_metadata(raw_commit, uri=store.uri(RAW_EVENTS))
            | {
                "files": len(files),
                "index_version": result.index.version,
                # What the late-data sensor requests: dates the batch holds now or held before.
                "touched_event_dates": MetadataValue.json(
                    [d.isoformat() for d in result.touched_event_dates]
                ),
            },
        )
        yield MaterializeResult(
            asset_key="rejected_events",
            metadata={
                "dagster/row_count": profile.rejected,
                "rejected_by_reason": MetadataValue.json(profile.rejected_by_reason),
                "summary": MetadataValue.md(
                    markdown_table(profile.rejected_by_reason, key="reason", value="lines")
                ),
            }
            | commit_metadata(rejected_commit, uri=store.uri(REJECTED_EVENTS)),
        )

    return ingest_batch


def _raw_metadata(profile: BatchProfile) -> dict[str, Any]:
    lines = profile.accepted + profile.rejected
    return {
        "dagster/row_count": profile.accepted,
        "lines": lines,
        "accepted": profile.accepted,
        "rejected": profile.rejected,
        "late_events": profile.late_events,
        # The late-data sensor reads this: which event-date partitions the batch touched.
        "event_dates": MetadataValue.json(profile.events_by_date),
        "lateness": MetadataValue.json(profile.lateness),
        "summary": MetadataValue.md(
            f"**{lines}** lines: **{profile.accepted}** accepted, **{profile.rejected}** "
            f"rejected; **{profile.late_events}** late events over "
            f"**{len(profile.events_by_date)}** event dates.\n\n"
            + markdown_table(profile.lateness, key="lateness", value="events")
        ),
    }
