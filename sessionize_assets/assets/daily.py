"""events -> `arrivals`, sessions -> `daily_sessions` (SPEC §9): the summaries an analyst reads,
with how final each date is.

Both run in every sessions run (after its sessions) and in `summaries_job`, which the summaries
sensor asks for when the lake says a date is behind with no run to take it up (R moved on with
an empty batch, a run died between commits). Each brings every date that is behind up to date,
wherever it is (`pipeline/daily.py`): the dates of the run's range are reported on the output's
own materialization, the others on one of their own, each with its figures as the table holds
them after the run.
"""

from collections.abc import Iterator
from datetime import date

from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetMaterialization,
    AssetsDefinition,
    MaterializeResult,
    PartitionsDefinition,
)

from sessionize_assets.assets.lake_step import lake_step
from sessionize_assets.assets.metadata import lake_asset_spec, lake_multi_asset
from sessionize_assets.assets.reports import (
    ArrivalsDateMetadata,
    DailyRunMetadata,
    DailySessionsMetadata,
)
from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import ARRIVALS, DAILY_SESSIONS, EVENTS, SESSIONS
from sessionize_assets.pipeline.daily import update_arrivals, update_daily
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.completeness import GracePeriod
from sessionize_assets.transforms.daily import ALL_CHANNELS, DAILY_FIGURES

GROUP = "daily"


def build_summary_assets(
    *, settings: Settings, partitions_def: PartitionsDefinition
) -> list[AssetsDefinition]:
    @lake_multi_asset(
        name="arrivals",
        partitions_def=partitions_def,
        specs=[
            lake_asset_spec(
                ARRIVALS,
                description="The arrival curve: accepted events by event date and days late.",
                group=GROUP,
                layer="gold",
                deps=[AssetDep(EVENTS.name)],
            )
        ],
    )
    def arrivals(context: AssetExecutionContext, lake: LakeResource):
        """Count again the arrivals of every event date whose events changed."""
        with lake_step(context, lake, step="arrivals") as step:
            counted = update_arrivals(step.store, run_id=step.run_id)
            context.log.info(f"arrivals: {len(counted)} event dates counted again")
            yield from _report(
                context,
                asset_key=ARRIVALS.name,
                own=step.dates,
                changed=sorted(counted),
                metadata=_arrivals_metadata(
                    step.store, sorted({*step.dates, *counted}), counted=set(counted)
                ),
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
                # Its own date's arrivals; its status also reads the reference dates', which
                # the lake's bookkeeping follows (pipeline/daily.py), not the lineage.
                deps=[AssetDep(SESSIONS.name), AssetDep(ARRIVALS.name)],
            )
        ],
    )
    def daily_sessions(context: AssetExecutionContext, lake: LakeResource):
        """Aggregate again the dates whose sessions changed, and restate those whose status did."""
        with lake_step(context, lake, step="daily_sessions") as step:
            report = update_daily(step.store, settings=settings, run_id=step.run_id)
            grace = report.grace
            context.log.info(
                f"daily_sessions: {len(report.recomputed)} dates aggregated again, "
                f"{len(report.restated)} given a new status"
                + (
                    f"; grace period {grace.days} days at R = {grace.latest_received}"
                    if grace
                    else ""
                )
            )
            metadata = _daily_metadata(
                step.store,
                sorted({*step.dates, *report.changed}),
                grace=grace,
                recomputed=set(report.recomputed),
                restated=set(report.restated),
            )
            if grace is not None and step.dates:
                last = step.dates[-1].isoformat()
                metadata.setdefault(last, {}).update(
                    DailyRunMetadata(
                        latest_received=grace.latest_received.isoformat(),
                        grace_period_days=grace.days,
                        reference_dates=f"{grace.first_reference}..{grace.last_reference}",
                        reference_events=grace.reference_events,
                        dates_recomputed=len(report.recomputed),
                        dates_restated=len(report.restated),
                        spark_jobs=0,
                    ).to_metadata()
                )
            yield from _report(
                context,
                asset_key=DAILY_SESSIONS.name,
                own=step.dates,
                changed=report.changed,
                metadata=metadata,
            )

    return [arrivals, daily_sessions]


def _report(
    context: AssetExecutionContext,
    *,
    asset_key: str,
    own: list[date],
    changed: list[date],
    metadata: dict[str, dict],
) -> Iterator[AssetMaterialization | MaterializeResult]:
    """The run's own dates on its output's materialization; each other date it changed on a
    materialization of its own."""
    for day in own:
        key = day.isoformat()
        context.add_asset_metadata(metadata.get(key, {}), asset_key=asset_key, partition_key=key)
    for day in sorted(set(changed) - set(own)):
        key = day.isoformat()
        yield AssetMaterialization(asset_key=asset_key, partition=key, metadata=metadata.get(key))
    yield MaterializeResult(asset_key=asset_key)


def _arrivals_metadata(store: DeltaStore, dates: list[date], *, counted: set[date]) -> dict:
    """Each date's arrivals as the table holds them now."""
    by_date: dict[date, dict[int, int]] = {day: {} for day in dates}
    for row in store.read_arrow(ARRIVALS, partitions=dates).to_pylist():
        by_date[row["event_date"]][row["lag_days"]] = row["events"]
    figures = {}
    for day, by_lag in by_date.items():
        events = sum(by_lag.values())
        on_time = sum(n for lag, n in by_lag.items() if lag <= 0)
        figures[day.isoformat()] = ArrivalsDateMetadata(
            row_count=len(by_lag),
            events=events,
            on_time_share=round(on_time / events, 4) if events else 1.0,
            events_by_lag={str(lag): n for lag, n in sorted(by_lag.items())},
            counted=day in counted,
        ).to_metadata()
    return figures


def _daily_metadata(
    store: DeltaStore,
    dates: list[date],
    *,
    grace: GracePeriod | None,
    recomputed: set[date],
    restated: set[date],
) -> dict[str, dict]:
    """Each date's `(all)` row as the table holds it now (no row: a date without sessions)."""
    rows = store.read_arrow(DAILY_SESSIONS, partitions=dates).to_pylist()
    channels: dict[date, int] = {}
    for row in rows:
        channels[row["session_date"]] = channels.get(row["session_date"], 0) + 1
    figures = {}
    for row in rows:
        if row["channel"] != ALL_CHANNELS:
            continue
        day = row["session_date"]
        done = "still provisional" if row["status"] != "complete" else "complete"
        figures[day.isoformat()] = DailySessionsMetadata(
            row_count=channels[day],
            **{name: row[name] or 0 for name in DAILY_FIGURES},
            status=row["status"],
            expected_completeness=row["expected_completeness"],
            grace_period_days=grace.days if grace else 0,
            recomputed=day in recomputed,
            restated=day in restated,
            summary=(
                f"**{day}**: {row['sessions']} sessions of {row['users']} users, {done}; "
                f"about {row['expected_completeness']:.1%} of its events are expected to have "
                "arrived."
            ),
        ).to_metadata()
    return figures
