"""sessions -> the user lifecycle: the intervals of the users a change touched, restated from
their earliest changed day, and the snapshot moved by what those intervals gained and lost.

What each table has absorbed is recorded in its own commits, as Delta `txn` actions
(`AppTransaction`, one per commit; `lifecycle_bookkeeping`), so a run that died between two
commits is completed by the next run, whatever range that one was asked for.

A run restates the users whose session days changed since that `sessions` version (from the
Delta log of `sessions`: the files added and removed since), the users with sessions on the
days the as-of day moves over, and the users whose current stretch runs out on those days
(`inactive` -> `dormant` -> `churned`). Everyone else keeps their rows. The snapshot then moves
by the interval rows added and removed since the version it reflects (from the Delta log of
`user_lifecycle_state`; `lifecycle_snapshot`).

Where the work runs: a batch touches a few rows per touched user, so a run reads, restates and
commits them on the driver with Arrow (`lifecycle_touched`): a Spark job's fixed cost would be
most of the work. Restating every user (the first run, or when the `sessions` history since the
absorbed version is gone) runs the same rule on the executors, by Spark (`lifecycle_history`).
"""

from __future__ import annotations

from datetime import date

from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import SESSIONS, USER_LIFECYCLE_SNAPSHOT, USER_LIFECYCLE_STATE
from sessionize_assets.pipeline.lifecycle_bookkeeping import (
    ABSORBED,
    IntervalCommit,
    LifecycleReport,
    absorbed_by,
    absorbed_mark,
)
from sessionize_assets.pipeline.lifecycle_history import restate_everyone
from sessionize_assets.pipeline.lifecycle_snapshot import move_snapshot
from sessionize_assets.pipeline.lifecycle_touched import changed_scope, restate_touched
from sessionize_assets.settings import Settings


def update_lifecycle(
    store: DeltaStore, *, through: date, settings: Settings, run_id: str
) -> LifecycleReport:
    """Bring the lifecycle up to date with `sessions`, its as-of day moved to `through` (it
    never moves back), rewriting only the users and the snapshot days that change.

    Only a restate of every user (the first run, or when the sessions history it needs is
    gone) runs on Spark; the users a change touched are restated with Arrow, so an everyday
    run needs no Spark session (`DeltaStore`'s is started when first used)."""
    if through < settings.start_date:
        raise ValueError(f"lifecycle day {through} is before the start date {settings.start_date}")
    tags = {"dagster_run_id": run_id, "asset": USER_LIFECYCLE_STATE.name}
    # The intervals' commit is made against the version read here (WriteConflictError).
    state_read = store.read_version(USER_LIFECYCLE_STATE)
    absorbed, previous_as_of = absorbed_by(store.applied_version(USER_LIFECYCLE_STATE, ABSORBED))
    as_of = through if previous_as_of is None else max(through, previous_as_of)
    sessions_version = store.version(SESSIONS)
    report = LifecycleReport(as_of=as_of)
    commit = IntervalCommit(
        tags=tags,
        mark=(
            None
            if (absorbed, previous_as_of) == (sessions_version, as_of)
            else absorbed_mark(sessions_version, as_of)
        ),
        read_version=state_read,
    )
    scope = None
    if absorbed is not None and previous_as_of is not None and sessions_version is not None:
        scope = changed_scope(
            store,
            absorbed=absorbed,
            sessions_version=sessions_version,
            previous_as_of=previous_as_of,
            as_of=as_of,
        )
    if scope is None:  # first run, or the sessions history since then is gone
        report.restated_from_start = True
        restate_everyone(store, report, commit, start=settings.start_date, as_of=as_of)
    else:
        restate_touched(store, scope, report, commit, as_of=as_of)
    move_snapshot(store, report, settings=settings, run_id=run_id)
    report.state_version = store.version(USER_LIFECYCLE_STATE)
    report.snapshot_version = store.version(USER_LIFECYCLE_SNAPSHOT)
    report.state_rows = sum(store.row_counts(USER_LIFECYCLE_STATE).values())
    return report
