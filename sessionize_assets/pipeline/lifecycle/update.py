"""A lifecycle run: which users it restates, where (`touched` on the driver, `history` by
Spark), and the snapshot moved by what their intervals gained and lost (the package's
docstring says why each table records what it absorbed)."""

from __future__ import annotations

from datetime import date

import pyarrow as pa

from sessionize_assets.lake.store import AppTransaction, DeltaStore
from sessionize_assets.lake.tables import SESSIONS, USER_LIFECYCLE_SNAPSHOT, USER_LIFECYCLE_STATE
from sessionize_assets.partitions import days_between
from sessionize_assets.pipeline.lifecycle.bookkeeping import (
    ABSORBED,
    STATE_ABSORBED,
    IntervalCommit,
    LifecycleReport,
    absorbed_by,
    absorbed_mark,
)
from sessionize_assets.pipeline.lifecycle.history import restate_everyone
from sessionize_assets.pipeline.lifecycle.touched import changed_scope, restate_touched
from sessionize_assets.pipeline.versions import signed_arrow
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.lifecycle import (
    INTERVAL_COLUMNS,
    corrected_snapshot,
    snapshot_moves,
)


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
    _move_snapshot(store, report, settings=settings, run_id=run_id)
    report.state_version = store.version(USER_LIFECYCLE_STATE)
    report.snapshot_version = store.version(USER_LIFECYCLE_SNAPSHOT)
    report.state_rows = sum(store.row_counts(USER_LIFECYCLE_STATE).values())
    return report


# -- the snapshot ---------------------------------------------------------------------------


def _move_snapshot(
    store: DeltaStore,
    report: LifecycleReport,
    *,
    settings: Settings,
    run_id: str,
) -> None:
    """Write the snapshot days that the interval rows committed since its version change, and
    the days up to the as-of day, in one commit that records the state version it reflects."""
    state_version = store.version(USER_LIFECYCLE_STATE)
    snapshot_read = store.read_version(USER_LIFECYCLE_SNAPSHOT)
    reflected = store.applied_version(USER_LIFECYCLE_SNAPSHOT, STATE_ABSORBED)
    days_held = sorted(date.fromisoformat(d) for d in store.row_counts(USER_LIFECYCLE_SNAPSHOT))
    old_last = days_held[-1] if days_held else None
    signed = (
        None
        if reflected is None or state_version is None
        else signed_arrow(
            store,
            USER_LIFECYCLE_STATE,
            since=reflected,
            through=state_version,
            columns=INTERVAL_COLUMNS,
        )
    )
    if signed is None:  # no usable bookkeeping: count every interval from an empty snapshot
        old_last = None
        every = store.read_arrow(USER_LIFECYCLE_STATE)
        signed = every.append_column("sign", pa.array([1] * every.num_rows, pa.int64()))
    moves = snapshot_moves(signed)
    moved_days = sorted({day for day, _ in moves})
    old: dict[tuple[date, str], tuple[int, int, int]] = {}
    if old_last is not None:
        # Every day from the first move on can change (users move by a running sum).
        wanted = days_between(min([*moved_days, old_last]), old_last)
        for row in store.read_arrow(USER_LIFECYCLE_SNAPSHOT, partitions=wanted).to_pylist():
            old[(row["snapshot_date"], row["state"])] = (
                row["users"],
                row["entered"],
                row["exited"],
            )
    rows = corrected_snapshot(
        old=old, old_last=old_last, moves=moves, start=settings.start_date, as_of=report.as_of
    )
    days = sorted({day for day, _ in rows})
    if not days:  # nothing moved: a later run counts from the same version
        return
    store.replace_partitions_arrow(
        USER_LIFECYCLE_SNAPSHOT,
        pa.Table.from_pylist(
            [
                {"snapshot_date": d, "state": s, "users": u, "entered": e, "exited": x}
                for (d, s), (u, e, x) in sorted(rows.items())
            ]
        ),
        partitions=days,
        commit_metadata={"dagster_run_id": run_id, "asset": USER_LIFECYCLE_SNAPSHOT.name},
        app_transaction=(
            None
            if state_version is None or state_version == reflected
            else AppTransaction(app_id=STATE_ABSORBED, version=state_version)
        ),
        read_version=snapshot_read,
    )
    report.days = days
