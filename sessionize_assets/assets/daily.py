"""events -> `arrivals`, sessions -> `daily_sessions` (SPEC §9): the summaries an analyst reads,
with how final each date is.

Both run in `summaries_job`, which the summaries sensor asks for once the sessions are up to
date (and `sessionize replay` and `rebuild` run after theirs). Each brings every date that is
behind up to date, wherever it is (`pipeline/daily.py`), so a run costs the dates that changed.

- `arrivals` is one asset (the Delta table is partitioned by event date): its materialization
  shows the arrival curve's latest state and the grace period learned from it.
- `daily_sessions` is partitioned by the session days that are over
  (`partitions.daily_figure_partitions`). A run's own partition is the latest date it brings up
  to date; every other date it changes that is a partition is reported on a materialization
  of its own, with its figures and status as the table holds them after the run.
"""

from collections.abc import Iterator
from datetime import date

from dagster import (
    AllPartitionMapping,
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetsDefinition,
    DagsterEventType,
    DagsterInstance,
    DailyPartitionsDefinition,
    DataVersion,
    MaterializeResult,
)

from sessionize_assets.assets.lake_step import lake_step
from sessionize_assets.assets.metadata import lake_asset_spec, lake_multi_asset
from sessionize_assets.assets.reports import ArrivalsMetadata, DailySessionsMetadata
from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import ARRIVALS, DAILY_SESSIONS, EVENTS, SESSIONS
from sessionize_assets.pipeline.daily import current_grace_period, update_arrivals, update_daily
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.completeness import COMPLETE, PROVISIONAL, GracePeriod
from sessionize_assets.transforms.daily import ALL_CHANNELS, DAILY_FIGURES

GROUP = "daily"
# Every summaries run restates every daily_sessions date whose status the arrivals move, so a
# date is never behind its arrivals: a data version that changed with each count would show
# every daily_sessions partition out of sync after each run (as the identities' would the
# sessions', assets/identities.py).
ARRIVALS_DATA_VERSION = DataVersion("applied to every daily_sessions date by each summaries run")
# How far the arrivals' metadata lists the curve F(k) of the reference dates.
CURVE_SHOWN_DAYS = 14


def build_summary_assets(
    *, settings: Settings, partitions_def: DailyPartitionsDefinition
) -> list[AssetsDefinition]:
    @lake_multi_asset(
        name="arrivals",
        specs=[
            lake_asset_spec(
                ARRIVALS,
                description=(
                    "The arrival curve: accepted events by event date and days late. Its "
                    "latest materialization shows the grace period learned from it."
                ),
                group=GROUP,
                layer="gold",
                deps=[AssetDep(EVENTS.name, partition_mapping=AllPartitionMapping())],
            )
        ],
    )
    def arrivals(context: AssetExecutionContext, lake: LakeResource):
        """Count again the arrivals of every event date whose events changed."""
        with lake_step(context, lake, step="arrivals") as step:
            counted = update_arrivals(step.store, run_id=step.run_id)
            grace = current_grace_period(step.store, settings)
            context.log.info(
                f"arrivals: {len(counted)} event dates counted again; " + _grace_text(grace)
            )
            yield MaterializeResult(
                asset_key=ARRIVALS.name,
                metadata=_arrivals_metadata(step.store, counted=len(counted), grace=grace),
                data_version=ARRIVALS_DATA_VERSION,
            )

    @lake_multi_asset(
        name="daily_sessions",
        partitions_def=partitions_def,
        specs=[
            lake_asset_spec(
                DAILY_SESSIONS,
                description=(
                    "Per session date: sessions, users and conversions by channel and for "
                    "(all), and whether the date is complete or still provisional."
                ),
                group=GROUP,
                layer="gold",
                # Its status reads the reference dates' arrivals, whichever they are.
                deps=[AssetDep(SESSIONS.name), AssetDep(ARRIVALS.name)],
            )
        ],
    )
    def daily_sessions(context: AssetExecutionContext, lake: LakeResource):
        """Aggregate again the dates whose sessions changed, and restate those whose status did."""
        with lake_step(context, lake, step="daily_sessions") as step:
            report = update_daily(step.store, settings=settings, run_id=step.run_id)
            context.log.info(
                f"daily_sessions: {len(report.recomputed)} dates aggregated again, "
                f"{len(report.restated)} given a new status; " + _grace_text(report.grace)
            )
            own = step.dates
            # A date that is not a partition yet (today, tomorrow) is shown once its day is
            # over, as one of the unreported dates.
            shown = sorted(
                {
                    *_partitions_of(report.changed, partitions_def),
                    *unreported_dates(context.instance, partitions_def),
                }
            )
            metadata = _daily_metadata(
                step.store,
                sorted({*own, *shown}),
                grace=report.grace,
                recomputed=set(report.recomputed),
                restated=set(report.restated),
            )
            yield from _report(context, own=own, changed=shown, metadata=metadata)

    return [arrivals, daily_sessions]


def unreported_dates(
    instance: DagsterInstance, partitions_def: DailyPartitionsDefinition
) -> list[date]:
    """The `daily_sessions` partitions whose `sessions` partition `instance` has seen
    materialized since they last were (or ever): a sessions run reports every date of its
    range, changed or not, and a date counted before its day was over has not been shown. A
    summaries run reports them as the table holds them, so the UI shows none out of sync."""
    materialized = DagsterEventType.ASSET_MATERIALIZATION
    sessions = instance.get_latest_storage_id_by_partition(AssetKey(SESSIONS.name), materialized)
    daily = instance.get_latest_storage_id_by_partition(AssetKey(DAILY_SESSIONS.name), materialized)
    later = [
        date.fromisoformat(key)
        for key, storage_id in sessions.items()
        if storage_id > daily.get(key, -1)
    ]
    return _partitions_of(sorted(later), partitions_def)


def _partitions_of(days: list[date], partitions_def: DailyPartitionsDefinition) -> list[date]:
    """The days of `days` that are partitions of `partitions_def` now (their day is over)."""
    last = partitions_def.get_last_partition_key()
    return [day for day in days if last is not None and day.isoformat() <= last]


def _grace_text(grace: GracePeriod | None) -> str:
    if grace is None:
        return "no batch ingested yet"
    return (
        f"grace period {grace.days} days at R = {grace.latest_received}, from "
        f"{grace.reference_events} events of {grace.first_reference}..{grace.last_reference}"
    )


def _report(
    context: AssetExecutionContext,
    *,
    own: list[date],
    changed: list[date],
    metadata: dict[str, dict],
) -> Iterator[AssetMaterialization | MaterializeResult]:
    """The run's own partition on its output's materialization; each other date it changed on
    a materialization of its own."""
    for day in sorted(set(changed) - set(own)):
        key = day.isoformat()
        yield AssetMaterialization(
            asset_key=DAILY_SESSIONS.name, partition=key, metadata=metadata[key]
        )
    for day in own:
        key = day.isoformat()
        context.add_asset_metadata(metadata[key], asset_key=DAILY_SESSIONS.name, partition_key=key)
    yield MaterializeResult(asset_key=DAILY_SESSIONS.name)


def _arrivals_metadata(store: DeltaStore, *, counted: int, grace: GracePeriod | None) -> dict:
    """The table as it holds it now, and the grace period it gives at R."""
    rows = store.read_arrow(ARRIVALS, columns=["event_date", "events"])
    dates = set(rows["event_date"].to_pylist())
    curve = (
        {
            str(k): round(grace.completeness(k), 4)
            for k in range(min(CURVE_SHOWN_DAYS, grace.days) + 1)
        }
        if grace
        else {}
    )
    return ArrivalsMetadata(
        row_count=rows.num_rows,
        uri=store.uri(ARRIVALS),
        event_dates=len(dates),
        events=sum(rows["events"].to_pylist()),
        event_dates_counted=counted,
        latest_received=grace.latest_received.isoformat() if grace else "",
        grace_period_days=grace.days if grace else 0,
        reference_dates=f"{grace.first_reference}..{grace.last_reference}" if grace else "",
        reference_events=grace.reference_events if grace else 0,
        completeness_by_lag=curve,
    ).to_metadata()


def _daily_metadata(
    store: DeltaStore,
    dates: list[date],
    *,
    grace: GracePeriod | None,
    recomputed: set[date],
    restated: set[date],
) -> dict[str, dict]:
    """Each date's `(all)` row as the table holds it now: zeros, and the date's status, for a
    date without sessions."""
    rows = store.read_arrow(DAILY_SESSIONS, partitions=dates).to_pylist()
    channels: dict[date, int] = {}
    totals: dict[date, dict] = {}
    for row in rows:
        day = row["session_date"]
        channels[day] = channels.get(day, 0) + 1
        if row["channel"] == ALL_CHANNELS:
            totals[day] = row
    figures = {}
    for day in dates:
        row = totals.get(day)
        status, completeness = (
            (row["status"], row["expected_completeness"])
            if row
            else grace.of_dates([day])[day]
            if grace
            else (PROVISIONAL, 1.0)
        )
        sessions, users = (row["sessions"], row["users"]) if row else (0, 0)
        done = "complete" if status == COMPLETE else "still provisional"
        figures[day.isoformat()] = DailySessionsMetadata(
            row_count=channels.get(day, 0),
            **{name: (row[name] or 0) if row else 0 for name in DAILY_FIGURES},
            status=status,
            expected_completeness=completeness,
            grace_period_days=grace.days if grace else 0,
            recomputed=day in recomputed,
            restated=day in restated,
            summary=(
                f"**{day}**: {sessions} sessions of {users} users, {done}; about "
                f"{completeness:.1%} of its events are expected to have arrived."
            ),
        ).to_metadata()
    return figures
