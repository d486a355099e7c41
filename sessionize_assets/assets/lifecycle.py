"""sessions -> the user lifecycle accumulating snapshot (SPEC §4), by snapshot date."""

from datetime import date, timedelta

from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetMaterialization,
    AssetsDefinition,
    AssetSpec,
    BackfillPolicy,
    MetadataValue,
    PartitionsDefinition,
    TimeWindowPartitionMapping,
    multi_asset,
)

from sessionize_assets.assets.metadata import lake_asset_spec
from sessionize_assets.lake.store import TableSpec
from sessionize_assets.lake.tables import USER_LIFECYCLE_SNAPSHOT, USER_LIFECYCLE_STATE
from sessionize_assets.partitions import days_between, previous_day_mapping
from sessionize_assets.pipeline.lifecycle import update_lifecycle
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.lifecycle import STATES

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
            # Day D = day D-1 plus the sessions of D. Both tables depend on their own D-1 in
            # the same way: a backfill must target the same days of both (non-subsettable).
            deps=[
                AssetDep("sessions", partition_mapping=sessions_mapping),
                AssetDep(table.name, partition_mapping=previous_day_mapping()),
            ],
            # Materializations are logged per day below, with that day's own figures.
            skippable=True,
        )

    @multi_asset(
        name="user_lifecycle",
        partitions_def=partitions_def,
        backfill_policy=BackfillPolicy.single_run(),
        specs=[
            spec(
                USER_LIFECYCLE_STATE,
                "Each user's lifecycle state, since when and for how long, at the end of each day.",
            ),
            spec(
                USER_LIFECYCLE_SNAPSHOT,
                "How many users are new, active, inactive, dormant or churned at the end of "
                "each day, and how many entered and left each state.",
            ),
        ],
    )
    def user_lifecycle(context: AssetExecutionContext, lake: LakeResource):
        """Advance the lifecycle from the day before the range, correcting every later day."""
        store = lake.store()
        dates = [date.fromisoformat(key) for key in context.partition_keys]
        report = update_lifecycle(
            store,
            lake.spark.session(),
            first_date=dates[0],
            last_date=dates[-1],
            settings=settings,
            run_id=context.run.run_id,
        )
        context.log.info(
            f"lifecycle: {len(dates)} days from {dates[0]} advanced from the day before; "
            f"{report.state_rows} user-days"
        )
        # The trend of each day reaches back before the range: read it from the table.
        trend = store.read_arrow(
            USER_LIFECYCLE_SNAPSHOT,
            partitions=days_between(dates[0] - timedelta(days=TREND_DAYS), dates[-1]),
        ).to_pylist()
        history = {(r["snapshot_date"], r["state"]): r["users"] for r in trend}
        for day in dates:
            figures = report.day(day)
            on_hand = sum(users for users, _, _ in figures.values())
            yield AssetMaterialization(
                asset_key=USER_LIFECYCLE_SNAPSHOT.name,
                partition=day.isoformat(),
                metadata={
                    **{f"users_{state}": figures[state][0] for state in STATES},
                    "users_on_hand": on_hand,
                    "moves_in": sum(entered for _, entered, _ in figures.values()),
                    "moves_out": sum(exited for _, _, exited in figures.values()),
                    "dagster/row_count": len(STATES),
                    "dagster/uri": MetadataValue.path(store.uri(USER_LIFECYCLE_SNAPSHOT)),
                    "delta_version": report.snapshot_version or 0,
                    "corrected_from": dates[0].isoformat(),
                    "summary": MetadataValue.md(
                        _day_markdown(day, figures) + "\n\n" + _trend_markdown(history, day)
                    ),
                },
            )
            yield AssetMaterialization(
                asset_key=USER_LIFECYCLE_STATE.name,
                partition=day.isoformat(),
                metadata={
                    "dagster/row_count": on_hand,  # one state row per user
                    "dagster/uri": MetadataValue.path(store.uri(USER_LIFECYCLE_STATE)),
                    "delta_version": report.state_version or 0,
                },
            )

    return user_lifecycle


def _day_markdown(day: date, figures: dict[str, tuple[int, int, int]]) -> str:
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
