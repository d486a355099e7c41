"""raw_events -> `events` by event date, with the cross-batch duplicate rule."""

from dagster import (
    AllPartitionMapping,
    AssetDep,
    AssetExecutionContext,
    AssetMaterialization,
    AssetsDefinition,
    MaterializeResult,
    PartitionsDefinition,
)

from sessionize_assets.assets.config import RebuildConfig
from sessionize_assets.assets.lake_step import lake_step
from sessionize_assets.assets.metadata import lake_asset_spec, lake_multi_asset
from sessionize_assets.assets.reports import (
    EventDateMetadata,
    EventsRunMetadata,
    reported_version,
)
from sessionize_assets.lake.tables import EVENTS, RAW_EVENTS
from sessionize_assets.pipeline.events import EventsReport, update_events
from sessionize_assets.resources.lake import LakeResource


def build_events_asset(*, partitions_def: PartitionsDefinition) -> AssetsDefinition:
    @lake_multi_asset(
        name="events",
        partitions_def=partitions_def,
        specs=[
            lake_asset_spec(
                EVENTS,
                description="Accepted events, deduplicated across batches, by the UTC day they "
                "happened.",
                group="events",
                layer="silver",
                # Which batches feed an event date is data: the index says, the sensor asks.
                deps=[AssetDep(RAW_EVENTS.name, partition_mapping=AllPartitionMapping())],
            )
        ],
    )
    def events(context: AssetExecutionContext, config: RebuildConfig, lake: LakeResource):
        """Accepted events, deduplicated across batches, by the UTC day they happened."""
        with lake_step(context, lake, step="events") as step:
            store, dates = step.store, step.dates
            before = store.row_counts(EVENTS, partitions=dates)
            asked = set(dates)
            # A daily batch that fits the driver is settled there: no Spark session starts.
            with step.counting_jobs(on_demand=True):
                report = update_events(
                    store,
                    step.spark,
                    event_dates=dates,
                    run_id=step.run_id,
                    full_refresh=config.full_refresh,
                )
            jobs = step.spark_jobs()
            context.log.info(
                f"events: {len(report.updated)} of {len(dates)} dates had new input "
                f"({len(report.recomputed)} recomputed), {report.raw_rows_read} raw rows read"
            )
            # Every date asked for (a backfill counts on it) is reported on the output's own
            # materialization; every other date whose rows moved because a copy of one of its
            # ids was settled here (displaced or promoted) gets one of its own. Each carries its
            # own figures as the table holds them now.
            reported = sorted({*dates, *report.also_changed})
            after = store.row_counts(EVENTS, partitions=reported)
            for day in reported:
                key = day.isoformat()
                rows = after.get(key, 0)
                requested = day in asked
                if day in report.updated:
                    what = (
                        f" ({rows - before.get(key, 0):+d} in this run, from "
                        f"{report.absorbed_by_date.get(day, 0)} new batch inputs)"
                    )
                elif requested:
                    what = " (nothing new in this run)"
                else:
                    what = " (a copy of one of its ids moved to or from another date in this run)"
                if day in report.recomputed:
                    what += (
                        "; recomputed from raw and written again"
                        if day in report.replaced
                        else "; recomputed from raw: the table held these rows already"
                    )
                metadata = EventDateMetadata(
                    row_count=rows,
                    uri=store.uri(EVENTS),
                    updated=day in report.updated,
                    recomputed=day in report.recomputed,
                    replaced=day in report.replaced,
                    copies_moved=day in report.also_changed,
                    events_added=rows - before.get(key, 0) if requested else None,
                    batches=report.batches_by_date.get(day, 0),
                    batches_absorbed=report.absorbed_by_date.get(day, 0),
                    delta_version=reported_version(report.events_version),
                    summary=f"**{key}**: {rows} events"
                    + what
                    + (
                        f"; {report.batches_by_date[day]} batches hold events of it."
                        if requested
                        else "."
                    ),
                ).to_metadata()
                if day == reported[-1]:
                    metadata |= _run_metadata(report, jobs).to_metadata()
                if requested:
                    context.add_asset_metadata(metadata, asset_key=EVENTS.name, partition_key=key)
                else:
                    yield AssetMaterialization(
                        asset_key=EVENTS.name, partition=key, metadata=metadata
                    )
            yield MaterializeResult(asset_key=EVENTS.name)  # each date's metadata is above

    return events


def _run_metadata(report: EventsReport, spark_jobs: int | None) -> EventsRunMetadata:
    """What the whole run read and wrote (its dates together)."""
    return EventsRunMetadata(
        dates_requested=len(report.requested),
        dates_updated=len(report.updated),
        batches_read=report.batches_read,
        raw_rows_read=report.raw_rows_read,
        dates_also_changed=len(report.also_changed),
        contested_ids=report.contested_ids,
        new_events=report.new_events,
        displaced=report.displaced,
        promoted=report.promoted,
        duplicates_found=report.duplicates,
        rows_written=report.rows_written,
        files_added=report.files_added,
        files_removed=report.files_removed,
        spark_jobs=spark_jobs,
    )
