"""raw_events -> `events` by event date, with the cross-batch duplicate rule."""

from datetime import date

from dagster import (
    AllPartitionMapping,
    AssetDep,
    AssetExecutionContext,
    AssetsDefinition,
    BackfillPolicy,
    MaterializeResult,
    MetadataValue,
    PartitionsDefinition,
    asset,
)

from sessionize_assets.assets.config import RebuildConfig
from sessionize_assets.assets.metadata import KINDS, OWNERS, definition_metadata, markdown_table
from sessionize_assets.lake.tables import EVENTS
from sessionize_assets.pipeline.events import update_events
from sessionize_assets.resources.lake import LakeResource


def build_events_asset(*, partitions_def: PartitionsDefinition) -> AssetsDefinition:
    @asset(
        name="events",
        partitions_def=partitions_def,
        # Which batches feed an event date is data: the index says, the late-data sensor asks.
        deps=[AssetDep("raw_events", partition_mapping=AllPartitionMapping())],
        backfill_policy=BackfillPolicy.single_run(),
        group_name="events",
        kinds=KINDS,
        owners=OWNERS,
        tags={"layer": "silver"},
        metadata=definition_metadata(EVENTS),
    )
    def events(
        context: AssetExecutionContext, config: RebuildConfig, lake: LakeResource
    ) -> MaterializeResult:
        """Accepted events, deduplicated across batches, by the UTC day they happened."""
        store = lake.store()
        dates = [date.fromisoformat(key) for key in context.partition_keys]
        report = update_events(
            store,
            lake.spark.session(),
            event_dates=dates,
            run_id=context.run.run_id,
            full_refresh=config.full_refresh,
        )
        context.log.info(
            f"events: {len(report.updated)} of {len(dates)} dates had new input "
            f"({len(report.recomputed)} recomputed), {report.raw_rows_read} raw rows read"
        )
        return MaterializeResult(
            metadata={
                "dagster/row_count": sum(report.events_by_date.values()),
                "dagster/uri": MetadataValue.path(store.uri(EVENTS)),
                "dates_requested": len(dates),
                "dates_updated": MetadataValue.json([d.isoformat() for d in report.updated]),
                "dates_recomputed": MetadataValue.json([d.isoformat() for d in report.recomputed]),
                "batches_read": report.batches_read,
                "raw_rows_read": report.raw_rows_read,
                "dates_searched_by_id": report.dates_searched_by_id,
                "ids_looked_up": report.ids_looked_up,
                "events_rows_scanned": report.events_rows_scanned,
                "new_events": report.new_events,
                "displaced": report.displaced,
                "rows_written": report.rows_written,
                "files_added": report.files_added,
                "files_removed": report.files_removed,
                "duplicates_found": report.duplicates,
                "delta_version": report.events_version if report.events_version is not None else -1,
                "summary": MetadataValue.md(
                    f"{len(report.updated)} of {len(dates)} dates had new batches; "
                    f"read {report.raw_rows_read} raw rows from {report.batches_read} batches.\n\n"
                    + markdown_table(report.events_by_date, key="event date", value="events")
                ),
            }
        )

    return events
