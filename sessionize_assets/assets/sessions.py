"""events -> `sessions`, `session_quarantine` and the `session_changes` log, by session date."""

from datetime import date

import pyarrow.compute as pc
from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetsDefinition,
    AssetSelection,
    AssetSpec,
    MaterializeResult,
    PartitionsDefinition,
    TimeWindowPartitionMapping,
)

from sessionize_assets.assets.config import RebuildConfig
from sessionize_assets.assets.identities import identities_materialization
from sessionize_assets.assets.lake_step import lake_step
from sessionize_assets.assets.metadata import lake_asset_spec, lake_multi_asset
from sessionize_assets.assets.reports import (
    CHANNEL_KEYS,
    ChangesLoggedMetadata,
    ChannelsMetadata,
    SessionDateMetadata,
    SessionsChangedMetadata,
    SessionsRunMetadata,
    TableLocationMetadata,
    reported_version,
)
from sessionize_assets.lake.store import DeltaStore, TableSpec
from sessionize_assets.lake.tables import (
    EVENTS,
    SESSION_CHANGES,
    SESSION_QUARANTINE,
    SESSIONS,
    USER_IDENTITIES,
)
from sessionize_assets.partitions import late_data_condition
from sessionize_assets.pipeline.sessions import SessionsReport, session_definition, update_sessions
from sessionize_assets.pipeline.sessions_diff import DateChanges
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.settings import Settings

NO_CHANGE = DateChanges(inserted=0, replaced=0, removed=0, users=0)
NO_SESSIONS = ChannelsMetadata(
    sessions_by_channel=dict.fromkeys(CHANNEL_KEYS, 0), engaged_share=0.0
)


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
            deps=[
                AssetDep(EVENTS.name, partition_mapping=events_mapping),
                # Each run applies the identities' changes to every date (stitching.py): a
                # date is run again for its own events, not for each sign-in.
                AssetDep(USER_IDENTITIES.name),
            ],
            automation_condition=late_data_condition(
                ignore=AssetSelection.assets(USER_IDENTITIES.name)
            ),
            # A new gap or cap shows every partition as stale; backfilling it recomputes it.
            code_version=session_definition(settings),
        )

    @lake_multi_asset(
        name="sessionize",
        partitions_def=partitions_def,
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
        with lake_step(context, lake, step="sessions") as step:
            store, dates = step.store, step.dates
            # A daily batch's sessions are built and committed on the driver: no Spark session.
            with step.counting_jobs(on_demand=True):
                report = update_sessions(
                    store,
                    step.spark,
                    session_dates=dates,
                    settings=settings,
                    run_id=step.run_id,
                    full_refresh=config.full_refresh,
                )
            jobs = step.spark_jobs()
            if report.identities.updated:  # the events were materialized without them
                context.log_event(identities_materialization(store, report.identities))
            relabel = report.relabel
            context.log.info(
                f"stitching: {relabel.ids_changed} anonymous ids mapped anew or remapped, "
                f"{relabel.rows_relabelled} sessions relabelled on {len(relabel.by_date)} dates "
                f"({relabel.files_rewritten} of {relabel.files_searched} files searched rewritten)"
            )
            context.log.info(
                f"sessions: {len(report.updated)} of {len(dates)} dates had changed events "
                f"({len(report.recomputed)} recomputed for every user); the sessions of "
                f"{report.pairs_recomputed} (user, date) pairs touched, "
                f"{report.pairs_from_additions} of them updated from their old sessions and "
                f"added events, the others recomputed from the events of "
                f"{report.users_recomputed} users; sessions changed on "
                f"{len(report.changed)} dates"
            )
            # Every date asked for (a backfill counts on it) is reported once per table, on the
            # output's own materialization, with its own figures as the tables hold them now;
            # `changed` says whether this run changed it.
            tables = (SESSIONS, SESSION_QUARANTINE, SESSION_CHANGES)
            rows = {table: store.row_counts(table, partitions=dates) for table in tables}
            channels = _channel_figures(store, dates)
            for day in dates:
                key = day.isoformat()
                change = report.changes_by_date.get(day, NO_CHANGE)
                own = {
                    SESSIONS: SessionsChangedMetadata(
                        sessions_inserted=change.inserted,
                        sessions_replaced=change.replaced,
                        sessions_removed=change.removed,
                        users_changed=change.users,
                        summary=_day_summary(key, rows[SESSIONS].get(key, 0), change),
                    ).to_metadata()
                    | channels.get(key, NO_SESSIONS).to_metadata()
                    | (_run_metadata(report, jobs).to_metadata() if day == dates[-1] else {}),
                    SESSION_QUARANTINE: {},
                    SESSION_CHANGES: ChangesLoggedMetadata(
                        rows_logged=change.inserted + 2 * change.replaced + change.removed
                    ).to_metadata(),
                }
                for table in tables:
                    context.add_asset_metadata(
                        SessionDateMetadata(
                            row_count=rows[table].get(key, 0),
                            changed=day in report.changed,
                            updated=day in report.updated,
                            recomputed=day in report.recomputed,
                            delta_version=reported_version(report.sessions_version),
                        ).to_metadata()
                        | own[table],
                        asset_key=table.name,
                        partition_key=key,
                    )
            for table in tables:
                yield MaterializeResult(
                    asset_key=table.name,
                    metadata=TableLocationMetadata(uri=store.uri(table)).to_metadata(),
                )

    return sessionize


def _day_summary(key: str, rows: int, change: DateChanges) -> str:
    if change == NO_CHANGE:
        return f"**{key}**: {rows} sessions, unchanged by this run."
    return (
        f"**{key}**: {rows} sessions; this run inserted {change.inserted}, replaced "
        f"{change.replaced} and removed {change.removed}, for {change.users} users."
    )


def _run_metadata(report: SessionsReport, spark_jobs: int | None) -> SessionsRunMetadata:
    """What the whole run read and wrote (its dates together)."""
    return SessionsRunMetadata(
        dates_requested=len(report.requested),
        dates_updated=len(report.updated),
        dates_changed=len(report.changed),
        users_recomputed=report.users_recomputed,
        pairs_recomputed=report.pairs_recomputed,
        pairs_from_additions=report.pairs_from_additions,
        users_from_additions=report.users_from_additions,
        dates_searched_by_user=report.dates_searched_by_user,
        users_looked_up=report.users_looked_up,
        events_rows_scanned=report.events_rows_scanned,
        events_read=report.events_read,
        sessions_inserted=report.inserted,
        sessions_replaced=report.replaced,
        sessions_removed=report.removed,
        rows_written=report.rows_written,
        files_rewritten=report.files_rewritten,
        files_searched=report.files_searched,
        files_before=report.files_total,
        ids_mapped_or_remapped=report.relabel.ids_changed,
        sessions_relabelled=report.relabel.rows_relabelled,
        dates_relabelled=len(report.relabel.by_date),
        files_relabelled=report.relabel.files_rewritten,
        spark_jobs=spark_jobs,
    )


def _channel_figures(store: DeltaStore, dates: list[date]) -> dict[str, ChannelsMetadata]:
    """Per session date, its sessions by channel and the share that are engaged, as the table
    holds them now: two columns of those partitions, read on the driver (no Spark job)."""
    table = store.read_arrow(
        SESSIONS, partitions=dates, columns=["session_date", "channel", "is_engaged"]
    )
    if not table.num_rows:
        return {}
    table = table.set_column(0, "session_date", pc.cast(table["session_date"], "string"))
    by_channel: dict[str, dict[str, int]] = {}
    counts = table.group_by(["session_date", "channel"]).aggregate([("channel", "count")])
    for day, name, count in zip(
        *(counts[c].to_pylist() for c in ("session_date", "channel", "channel_count")), strict=True
    ):
        if name in CHANNEL_KEYS:  # rows written before channels were: null, not counted
            by_channel.setdefault(day, dict(NO_SESSIONS.sessions_by_channel))[name] = count
    engaged_share: dict[str, float] = {}
    engaged = table.group_by("session_date").aggregate([("is_engaged", "mean")])
    for day, share in zip(
        engaged["session_date"].to_pylist(), engaged["is_engaged_mean"].to_pylist(), strict=True
    ):
        if share is not None:
            engaged_share[day] = round(share, 4)
    return {
        day: ChannelsMetadata(
            sessions_by_channel=by_channel.get(day, NO_SESSIONS.sessions_by_channel),
            engaged_share=engaged_share.get(day, NO_SESSIONS.engaged_share),
        )
        for day in {*by_channel, *engaged_share}
    }
