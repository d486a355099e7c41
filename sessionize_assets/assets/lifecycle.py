"""sessions -> the user lifecycle accumulating snapshot (SPEC §4), by snapshot date."""

from collections.abc import Iterator
from datetime import date, timedelta

import pyarrow as pa
import pyarrow.compute as pc
from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    AssetMaterialization,
    AssetsDefinition,
    AssetSpec,
    PartitionsDefinition,
    TimeWindowPartitionMapping,
)

from sessionize_assets.assets.lake_step import lake_step
from sessionize_assets.assets.metadata import lake_asset_spec, lake_multi_asset
from sessionize_assets.assets.reports import (
    LifecycleRunMetadata,
    LifecycleStateDayMetadata,
    SnapshotDayMetadata,
)
from sessionize_assets.checks.definitions import check_result
from sessionize_assets.checks.rules import snapshot_off_intervals, unbalanced_snapshot
from sessionize_assets.lake.store import DeltaStore, TableSpec
from sessionize_assets.lake.tables import SESSIONS, USER_LIFECYCLE_SNAPSHOT, USER_LIFECYCLE_STATE
from sessionize_assets.partitions import previous_day_mapping
from sessionize_assets.pipeline.lifecycle.bookkeeping import LifecycleReport
from sessionize_assets.pipeline.lifecycle.update import update_lifecycle
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.lifecycle_states import OPEN_END, STATES, State

TREND_DAYS = 14


def build_lifecycle_assets(
    *,
    settings: Settings,
    partitions_def: PartitionsDefinition,
    sessions_mapping: TimeWindowPartitionMapping,
) -> AssetsDefinition:
    def spec(table: TableSpec, description: str) -> AssetSpec:
        return lake_asset_spec(
            table,
            description=description,
            group="lifecycle",
            layer="gold",
            # Day D follows from day D-1 and the sessions of D. Both tables depend on their D-1 in
            # the same way: a backfill must target the same days of both (non-subsettable).
            deps=[
                AssetDep(SESSIONS.name, partition_mapping=sessions_mapping),
                AssetDep(table.name, partition_mapping=previous_day_mapping()),
            ],
            # Materializations are logged per day below, with that day's own figures.
            skippable=True,
        )

    @lake_multi_asset(
        name="user_lifecycle",
        partitions_def=partitions_def,
        specs=[
            spec(
                USER_LIFECYCLE_STATE,
                "Each user's lifecycle as intervals: one row per stretch of days in one state "
                "(valid_to 9999-12-31 while it lasts). A day's materialization counts the users "
                "with a state that day.",
            ),
            spec(
                USER_LIFECYCLE_SNAPSHOT,
                "How many users are new, active, inactive, dormant or churned at the end of "
                "each day, and how many entered and left each state.",
            ),
        ],
        check_specs=[
            AssetCheckSpec(
                "snapshot_balances",
                asset=USER_LIFECYCLE_SNAPSHOT.name,
                blocking=True,
                description="Each day has the five states, and users = the day before + "
                "entered - exited.",
            ),
            AssetCheckSpec(
                "snapshot_matches_intervals",
                asset=USER_LIFECYCLE_SNAPSHOT.name,
                blocking=True,
                description="The last day's users per state are the current stretches in it.",
            ),
        ],
    )
    def user_lifecycle(context: AssetExecutionContext, lake: LakeResource):
        """Restate the users whose sessions changed and move the snapshot days that change."""
        with lake_step(context, lake, step="lifecycle") as step:
            store = step.store
            # Only a restate of every user needs Spark: an everyday run starts no session.
            with step.counting_jobs(on_demand=True):
                report = update_lifecycle(
                    store, through=step.dates[-1], settings=settings, run_id=step.run_id
                )
            jobs = step.spark_jobs()
            context.log.info(
                f"lifecycle through {report.as_of}: {report.users_restated} users restated"
                f"{' from the start' if report.restated_from_start else ''}, "
                f"{report.users_changed} changed ({report.intervals_removed} interval rows "
                f"removed, {report.intervals_added} added); snapshot days written: "
                + (
                    f"{report.days[0]}..{report.days[-1]} ({len(report.days)})"
                    if report.days
                    else "none"
                )
            )
            # Every day the run was asked for, and every day it rewrote, is reported with its
            # figures as they are in the table now (a day it did not need to change included, so a
            # backfill sees each of its partitions materialized). A day it neither was asked for
            # nor rewrote keeps its materialization, whose figures are still the day's content.
            asked = set(step.dates)
            days = sorted(asked | set(report.days))
            # Five rows a day: read whole once, for the days' figures, the trend and the checks.
            snapshot = store.read_arrow(USER_LIFECYCLE_SNAPSHOT)
            since = min(days[0], days[-1] - timedelta(days=TREND_DAYS))
            counts = {
                (r["snapshot_date"], r["state"]): (r["users"], r["entered"], r["exited"])
                for r in snapshot.to_pylist()
                if since <= r["snapshot_date"] <= days[-1]
            }
            history = {key: users for key, (users, _, _) in counts.items()}
            rewritten = set(report.days)
            for day in days:
                last = day == days[-1]
                figures = {state: counts.get((day, state), (0, 0, 0)) for state in STATES}
                on_hand = sum(users for users, _, _ in figures.values())
                # One materialization per day, with that day's own figures: the Plots tab then
                # shows users per state per day.
                yield AssetMaterialization(
                    asset_key=USER_LIFECYCLE_SNAPSHOT.name,
                    partition=day.isoformat(),
                    metadata=SnapshotDayMetadata(
                        users_by_state={state: figures[state][0] for state in STATES},
                        users_on_hand=on_hand,
                        moves_in=sum(entered for _, entered, _ in figures.values()),
                        moves_out=sum(exited for _, _, exited in figures.values()),
                        rewritten=day in rewritten,
                        row_count=sum(1 for state in STATES if (day, state) in counts),
                        uri=store.uri(USER_LIFECYCLE_SNAPSHOT),
                        delta_version=report.snapshot_version or 0,
                        summary=_day_markdown(day, figures)
                        + ("\n\n" + _trend_markdown(history, day) if last else ""),
                    ).to_metadata(),
                )
                yield AssetMaterialization(
                    asset_key=USER_LIFECYCLE_STATE.name,
                    partition=day.isoformat(),
                    metadata=LifecycleStateDayMetadata(
                        users_with_a_state=on_hand,
                        rewritten=day in rewritten,
                        uri=store.uri(USER_LIFECYCLE_STATE),
                        delta_version=report.state_version or 0,
                    ).to_metadata()
                    | (_run_metadata(report, jobs).to_metadata() if last else {}),
                )
            yield from _checks(snapshot, store, report)

    return user_lifecycle


def _run_metadata(report: LifecycleReport, spark_jobs: int | None) -> LifecycleRunMetadata:
    """What the whole run did to the intervals and the snapshot."""
    return LifecycleRunMetadata(
        interval_rows=report.state_rows,
        users_restated=report.users_restated,
        restated_from_start=report.restated_from_start,
        users_changed=report.users_changed,
        interval_rows_added=report.intervals_added,
        interval_rows_removed=report.intervals_removed,
        interval_rows_written=report.state_rows_written,
        interval_files_rewritten=report.state_files_rewritten,
        snapshot_days_written=len(report.days),
        spark_jobs=spark_jobs,
    )


def _checks(
    snapshot: pa.Table, store: DeltaStore, report: LifecycleReport
) -> Iterator[AssetCheckResult]:
    """The snapshot as it is after the run, checked with the current stretches (one per
    user), on the driver (no Spark job)."""
    yield check_result(
        unbalanced_snapshot(snapshot),
        "days or states that do not balance",
        check_name="snapshot_balances",
        asset_key=USER_LIFECYCLE_SNAPSHOT.name,
    )
    last_day = snapshot.filter(pc.equal(snapshot["snapshot_date"], pa.scalar(report.as_of)))
    current = store.read_arrow(USER_LIFECYCLE_STATE, partitions=[OPEN_END])
    yield check_result(
        snapshot_off_intervals(last_day, current),
        f"states whose {report.as_of} users differ from the current stretches",
        check_name="snapshot_matches_intervals",
        asset_key=USER_LIFECYCLE_SNAPSHOT.name,
    )


def _day_markdown(day: date, figures: dict[State, tuple[int, int, int]]) -> str:
    lines = [f"**{day}**", "", "| state | users | entered | exited |", "|---|---:|---:|---:|"]
    lines += [f"| {s} | {u} | {e} | {x} |" for s, (u, e, x) in figures.items()]
    return "\n".join(lines)


def _trend_markdown(users: dict[tuple[date, str], int], through: date) -> str:
    """Users per state over the days up to `through`: the trend at a glance."""
    days = sorted({day for day, _ in users if day <= through})[-TREND_DAYS:]
    lines = ["| date | " + " | ".join(STATES) + " |", "|---|" + "---:|" * len(STATES)]
    lines += [
        f"| {day} | " + " | ".join(str(users.get((day, s), 0)) for s in STATES) + " |"
        for day in days
    ]
    return "\n".join(lines)
