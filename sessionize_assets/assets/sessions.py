"""events -> `sessions`, `session_quarantine` and the `session_changes` log, by session date."""

from datetime import date

from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetsDefinition,
    AssetSpec,
    BackfillPolicy,
    MaterializeResult,
    MetadataValue,
    PartitionsDefinition,
    TimeWindowPartitionMapping,
    multi_asset,
)

from sessionize_assets.assets.config import RebuildConfig
from sessionize_assets.assets.metadata import lake_asset_spec, markdown_table
from sessionize_assets.lake.store import TableSpec
from sessionize_assets.lake.tables import SESSION_CHANGES, SESSION_QUARANTINE, SESSIONS
from sessionize_assets.partitions import late_data_condition
from sessionize_assets.pipeline.sessions import session_definition, update_sessions
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.settings import Settings


def build_sessions_assets(
    *,
    settings: Settings,
    partitions_def: PartitionsDefinition,
    events_mapping: TimeWindowPartitionMapping,
) -> AssetsDefinition:
    def spec(table: TableSpec, description: str) -> AssetSpec:
        return lake_asset_spec(
            table,
            description=description,
            group="sessions",
            layer="gold",
            deps=[AssetDep("events", partition_mapping=events_mapping)],
            automation_condition=late_data_condition(),
            # A new gap or cap shows every partition as stale; backfilling it recomputes it.
            code_version=session_definition(settings),
        )

    @multi_asset(
        name="sessionize",
        partitions_def=partitions_def,
        backfill_policy=BackfillPolicy.single_run(),
        specs=[
            spec(SESSIONS, "User sessions by the UTC day they started."),
            spec(
                SESSION_QUARANTINE,
                "Sessions whose events ran past the maximum session length (bots).",
            ),
            spec(SESSION_CHANGES, "Corrections log: which sessions each run removed and added."),
        ],
    )
    def sessionize(context: AssetExecutionContext, config: RebuildConfig, lake: LakeResource):
        """Recompute the sessions of users whose events changed, and log the corrections."""
        store = lake.store()
        dates = [date.fromisoformat(key) for key in context.partition_keys]
        report = update_sessions(
            store,
            lake.spark.session(),
            session_dates=dates,
            settings=settings,
            run_id=context.run.run_id,
            full_refresh=config.full_refresh,
        )
        context.log.info(
            f"sessions: {len(report.updated)} of {len(dates)} dates had changed events "
            f"({len(report.recomputed)} recomputed for every user); "
            f"{report.pairs_recomputed} (user, date) pairs recomputed"
        )
        common = {
            "dates_updated": MetadataValue.json([d.isoformat() for d in report.updated]),
            # Read by the lifecycle sensor: the snapshot is corrected from the earliest of these.
            "dates_changed": MetadataValue.json([d.isoformat() for d in report.changed]),
            "users_recomputed": report.users_recomputed,
        }
        yield MaterializeResult(
            asset_key="sessions",
            metadata=common
            | {
                "dagster/row_count": sum(report.sessions_by_date.values()),
                "dagster/uri": MetadataValue.path(store.uri(SESSIONS)),
                "pairs_recomputed": report.pairs_recomputed,
                "dates_searched_by_user": report.dates_searched_by_user,
                "users_looked_up": report.users_looked_up,
                "events_rows_scanned": report.events_rows_scanned,
                "events_read": report.events_read,
                "sessions_inserted": report.inserted,
                "sessions_replaced": report.replaced,
                "sessions_removed": report.removed,
                "rows_written": report.rows_written,
                "files_rewritten": report.files_rewritten,
                "files_before": report.files_total,
                "dates_recomputed": MetadataValue.json([d.isoformat() for d in report.recomputed]),
                "delta_version": report.sessions_version
                if report.sessions_version is not None
                else -1,
                "summary": MetadataValue.md(
                    f"Recomputed **{report.pairs_recomputed}** (user, date) pairs of "
                    f"**{report.users_recomputed}** users"
                    + (
                        f" and **{len(report.recomputed)}** whole dates"
                        if report.recomputed
                        else ""
                    )
                    + f"; sessions +{report.inserted} ~{report.replaced} -{report.removed}; "
                    f"read {report.events_read} events; rewrote {report.files_rewritten} of "
                    f"{report.files_total} files of the changed dates.\n\n"
                    + markdown_table(report.sessions_by_date, key="session date", value="sessions")
                ),
            },
        )
        yield MaterializeResult(
            asset_key="session_quarantine",
            metadata=common
            | {
                "quarantined_sessions": sum(report.quarantined_by_date.values()),
                "dagster/uri": MetadataValue.path(store.uri(SESSION_QUARANTINE)),
            },
        )
        yield MaterializeResult(
            asset_key="session_changes",
            metadata=common
            | {
                "added": report.inserted + report.replaced,
                "removed": report.removed + report.replaced,
                "dagster/uri": MetadataValue.path(store.uri(SESSION_CHANGES)),
            },
        )

    return sessionize
