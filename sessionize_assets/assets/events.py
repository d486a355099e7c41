"""raw_events -> `events` by event date, with the cross-batch duplicate rule."""

from datetime import date

from dagster import (
    AllPartitionMapping,
    AssetDep,
    AssetExecutionContext,
    AssetMaterialization,
    AssetsDefinition,
    BackfillPolicy,
    MaterializeResult,
    MetadataValue,
    PartitionsDefinition,
    multi_asset,
)

from sessionize_assets.assets.config import RebuildConfig
from sessionize_assets.assets.metadata import LAKE_POOL, lake_asset_spec, run_figures
from sessionize_assets.lake.tables import EVENTS
from sessionize_assets.pipeline.events import EventsReport, update_events
from sessionize_assets.resources.lake import LakeResource


def build_events_asset(*, partitions_def: PartitionsDefinition) -> AssetsDefinition:
    @multi_asset(
        name="events",
        partitions_def=partitions_def,
        backfill_policy=BackfillPolicy.single_run(),
        pool=LAKE_POOL,
        specs=[
            lake_asset_spec(
                EVENTS,
                description="Accepted events, deduplicated across batches, by the UTC day they "
                "happened.",
                group="events",
                layer="silver",
                # Which batches feed an event date is data: the index says, the sensor asks.
                deps=[AssetDep("raw_events", partition_mapping=AllPartitionMapping())],
            )
        ],
    )
    def events(context: AssetExecutionContext, config: RebuildConfig, lake: LakeResource):
        """Accepted events, deduplicated across batches, by the UTC day they happened."""
        store = lake.store()
        dates = [date.fromisoformat(key) for key in context.partition_keys]
        before = store.row_counts(EVENTS, partitions=dates)
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
        version = report.events_version if report.events_version is not None else -1
        # The step's output, which the range's partitions all get from Dagster (and the asset
        # checks wait for): only what is true of every partition.
        yield MaterializeResult(
            asset_key=EVENTS.name, metadata={"dagster/uri": MetadataValue.path(store.uri(EVENTS))}
        )
        # Then every date asked for (a backfill counts on it), each with its own figures as
        # the table holds them now; `updated` says whether this run changed it.
        after = store.row_counts(EVENTS, partitions=dates)
        for day in dates:
            key = day.isoformat()
            rows = after.get(key, 0)
            added = rows - before.get(key, 0)
            yield AssetMaterialization(
                asset_key=EVENTS.name,
                partition=key,
                metadata={
                    "dagster/row_count": rows,
                    "dagster/uri": MetadataValue.path(store.uri(EVENTS)),
                    "updated": day in report.updated,
                    "recomputed": day in report.recomputed,
                    "events_added": added,
                    "batches": report.batches_by_date.get(day, 0),
                    "batches_absorbed": report.absorbed_by_date.get(day, 0),
                    "delta_version": version,
                    "summary": MetadataValue.md(
                        f"**{key}**: {rows} events"
                        + (
                            f" ({added:+d} in this run, from "
                            f"{report.absorbed_by_date.get(day, 0)} new batch inputs)"
                            if day in report.updated
                            else " (nothing new in this run)"
                        )
                        + f"; {report.batches_by_date.get(day, 0)} batches hold events of it."
                    ),
                    **(run_figures(_run_figures(report)) if day == dates[-1] else {}),
                },
            )

    return events


def _run_figures(report: EventsReport) -> dict[str, int]:
    """What the whole run read and wrote (its dates together)."""
    return {
        "dates_requested": len(report.requested),
        "dates_updated": len(report.updated),
        "batches_read": report.batches_read,
        "raw_rows_read": report.raw_rows_read,
        "dates_searched_by_id": report.dates_searched_by_id,
        "ids_looked_up": report.ids_looked_up,
        "events_rows_scanned": report.events_rows_scanned,
        "new_events": report.new_events,
        "displaced": report.displaced,
        "duplicates_found": report.duplicates,
        "rows_written": report.rows_written,
        "files_added": report.files_added,
        "files_removed": report.files_removed,
    }
