"""sessions -> the user lifecycle accumulating snapshot, advanced from the day before."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date

from pyspark.sql import SparkSession

from sessionize_assets.lake.store import DeltaStore, LakeError
from sessionize_assets.lake.tables import SESSIONS, USER_LIFECYCLE_SNAPSHOT, USER_LIFECYCLE_STATE
from sessionize_assets.partitions import ONE_DAY, days_between
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.lifecycle import (
    STATE_SCHEMA,
    STATES,
    advance_lifecycle,
    lifecycle_counts,
)


@dataclass(kw_only=True)
class LifecycleReport:
    first_date: date
    last_date: date
    # (snapshot_date, state) -> (users, entered, exited), for every date of the range.
    counts: dict[tuple[date, str], tuple[int, int, int]] = field(default_factory=dict)
    state_rows: int = 0
    state_version: int | None = None
    snapshot_version: int | None = None

    def day(self, snapshot_date: date) -> dict[str, tuple[int, int, int]]:
        return {state: self.counts[(snapshot_date, state)] for state in STATES}


def update_lifecycle(
    store: DeltaStore,
    spark: SparkSession,
    *,
    first_date: date,
    last_date: date,
    settings: Settings,
    run_id: str,
) -> LifecycleReport:
    """Advance the user lifecycle from the balance at first_date - 1 through last_date.

    Every date of the range is replaced (a late session at X moves every later day), in one
    commit per table: the per-user states, then the snapshot counts built from them.
    """
    if first_date < settings.start_date or last_date < first_date:
        raise ValueError(
            f"lifecycle range {first_date}..{last_date} must start on or after "
            f"{settings.start_date} and not end before it starts"
        )
    dates = days_between(first_date, last_date)
    day_before = first_date - ONE_DAY
    if first_date == settings.start_date:
        previous = spark.createDataFrame([], STATE_SCHEMA)
    elif not store.row_counts(USER_LIFECYCLE_SNAPSHOT, partitions=[day_before]):
        raise LakeError(
            f"{USER_LIFECYCLE_SNAPSHOT.name} has no {day_before}, the balance {first_date} "
            f"starts from: materialize the snapshot from its first missing date instead"
        )
    else:
        previous = store.read(USER_LIFECYCLE_STATE, partitions=[day_before])
    session_days = store.read(SESSIONS, partitions=dates).select("user_id", "session_date")
    tags = {"dagster_run_id": run_id, "asset": USER_LIFECYCLE_SNAPSHOT.name}
    states = advance_lifecycle(
        previous=previous, session_days=session_days, first_date=first_date, last_date=last_date
    )
    state_commit = store.replace_partitions(
        USER_LIFECYCLE_STATE, states, partitions=dates, commit_metadata=tags
    )
    # Counted from what was committed, so the two tables agree row for row.
    counts = lifecycle_counts(
        states=store.read(USER_LIFECYCLE_STATE, partitions=dates),
        previous=previous,
        first_date=first_date,
        last_date=last_date,
    ).toArrow()
    snapshot_commit = store.replace_partitions_arrow(
        USER_LIFECYCLE_SNAPSHOT, counts, partitions=dates, commit_metadata=tags
    )
    report = LifecycleReport(
        first_date=first_date,
        last_date=last_date,
        state_rows=sum(store.row_counts(USER_LIFECYCLE_STATE, partitions=dates).values()),
        state_version=state_commit.version,
        snapshot_version=snapshot_commit.version,
    )
    for row in counts.to_pylist():
        report.counts[(row["snapshot_date"], row["state"])] = (
            row["users"],
            row["entered"],
            row["exited"],
        )
    return report
