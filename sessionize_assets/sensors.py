"""The late-data sensor: new raw batches -> the event-date partitions they touched."""

from __future__ import annotations

from datetime import date

from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from sessionize_assets.partitions import contiguous_ranges
from sessionize_assets.settings import Settings

RAW_EVENTS_KEY = AssetKey("raw_events")
_PAGE = 500


def build_late_data_sensor(*, settings: Settings, events_job_name: str) -> SensorDefinition:
    @sensor(
        name="late_data_sensor",
        job_name=events_job_name,
        minimum_interval_seconds=15,
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            "Reads every new raw_events materialization (not just the latest) and requests the "
            "event dates its batch touched, as range runs of at most "
            f"{settings.max_partitions_per_run} days."
        ),
    )
    def late_data_sensor(context: SensorEvaluationContext):
        after = int(context.cursor) if context.cursor else None
        records = context.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=RAW_EVENTS_KEY, after_storage_id=after),
            limit=_PAGE,
            ascending=True,
        ).records
        if not records:
            return SkipReason("no new raw_events materializations")
        touched: set[date] = set()
        batches = []
        for record in records:
            materialization = record.asset_materialization
            if materialization is None:
                continue
            batches.append(materialization.partition)
            value = materialization.metadata.get("touched_event_dates")
            touched.update(date.fromisoformat(d) for d in (value.value if value else []))
        touched = {d for d in touched if d >= settings.start_date}
        last = records[-1].storage_id
        requests = [
            RunRequest(
                run_key=f"events-{first}-{end}-after-{last}",
                tags={
                    "dagster/asset_partition_range_start": first.isoformat(),
                    "dagster/asset_partition_range_end": end.isoformat(),
                    "sessionize/batches": ",".join(sorted(b for b in batches if b)),
                },
            )
            for first, end in contiguous_ranges(
                sorted(touched), max_days=settings.max_partitions_per_run
            )
        ]
        context.log.info(
            f"{len(records)} new raw_events materializations ({', '.join(map(str, batches))}) "
            f"touched {len(touched)} event dates: {len(requests)} run(s)"
        )
        return SensorResult(run_requests=requests, cursor=str(last))

    return late_data_sensor
