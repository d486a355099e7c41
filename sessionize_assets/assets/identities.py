"""events -> `user_identities` (SPEC §3c): which signed-in user each anonymous id belongs to."""

from dagster import (
    AllPartitionMapping,
    AssetDep,
    AssetExecutionContext,
    AssetMaterialization,
    AssetsDefinition,
    DataVersion,
    MaterializeResult,
)

from sessionize_assets.assets.lake_step import lake_step
from sessionize_assets.assets.metadata import lake_asset_spec, lake_multi_asset
from sessionize_assets.assets.reports import (
    IdentitiesMetadata,
    IdentitiesRunMetadata,
    reported_version,
)
from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import EVENTS, USER_IDENTITIES
from sessionize_assets.pipeline.identities import IdentitiesReport, update_identities
from sessionize_assets.resources.lake import LakeResource

# Every sessions date reads the one identities table, and every sessions run applies its
# changes to every date (pipeline/stitching.py). A data version that changed with each
# sign-in would show every sessions partition out of sync after each batch, although the
# batch's own sessions run relabels them all: the identities' version stays this one, and a
# sessions date is shown stale for what its own events window holds.
DATA_VERSION_TAG = "dagster/data_version"
IDENTITIES_DATA_VERSION = DataVersion("applied to every sessions date by each sessions run")


def build_identities_asset() -> AssetsDefinition:
    @lake_multi_asset(
        name="identities",
        specs=[
            lake_asset_spec(
                USER_IDENTITIES,
                description="Which signed-in user each anonymous id belongs to: the userId of "
                "its latest event that has one (identity stitching).",
                group="sessions",
                layer="silver",
                deps=[AssetDep(EVENTS.name, partition_mapping=AllPartitionMapping())],
            )
        ],
    )
    def identities(context: AssetExecutionContext, lake: LakeResource):
        """Absorb the events that changed since the last run into `user_identities`."""
        with lake_step(context, lake, step="identities") as step:
            store = step.store
            with step.counting_jobs():
                report = update_identities(store, run_id=step.run_id)
            context.log.info(
                f"user_identities: {report.ids_new} ids newly mapped, {report.ids_remapped} "
                f"remapped, {report.ids_unmapped} unmapped, from {report.events_read} "
                "identifying events of the changed events files"
            )
            yield MaterializeResult(
                asset_key=USER_IDENTITIES.name,
                metadata=identities_metadata(store, report).to_metadata()
                | IdentitiesRunMetadata(spark_jobs=step.spark_jobs()).to_metadata(),
                data_version=IDENTITIES_DATA_VERSION,
            )

    return identities


def identities_metadata(store: DeltaStore, report: IdentitiesReport) -> IdentitiesMetadata:
    """What a run did to `user_identities`, and what the table holds now."""
    return IdentitiesMetadata(
        row_count=sum(store.row_counts(USER_IDENTITIES).values()),
        uri=store.uri(USER_IDENTITIES),
        ids_newly_mapped=report.ids_new,
        ids_remapped=report.ids_remapped,
        ids_unmapped=report.ids_unmapped,
        ids_recomputed=report.ids_recomputed,
        identifying_events_read=report.events_read,
        rebuilt=report.rebuilt,
        events_version_absorbed=reported_version(report.events_version),
        delta_version=reported_version(report.identities_version),
    )


def identities_materialization(store: DeltaStore, report: IdentitiesReport) -> AssetMaterialization:
    """The materialization a sessions run logs when it brought the identities up to date
    itself (the events were materialized without them)."""
    return AssetMaterialization(
        asset_key=USER_IDENTITIES.name,
        # The data version every materialization of the asset reports (public run tag).
        tags={DATA_VERSION_TAG: IDENTITIES_DATA_VERSION.value},
        metadata=identities_metadata(store, report).to_metadata(),
    )
