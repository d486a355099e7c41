"""The lifecycle snapshot moved by the interval rows committed since the state version it
reflects (from the Delta log of `user_lifecycle_state`), and carried up to the as-of day; with
no usable bookkeeping, counted again from every interval. The counting itself is
`transforms.lifecycle.snapshot_moves` and `corrected_snapshot`.
"""

from __future__ import annotations

from datetime import date

import pyarrow as pa

from sessionize_assets.lake.store import AppTransaction, DeltaStore
from sessionize_assets.lake.tables import USER_LIFECYCLE_SNAPSHOT, USER_LIFECYCLE_STATE
from sessionize_assets.partitions import days_between
from sessionize_assets.pipeline.lifecycle_bookkeeping import STATE_ABSORBED, LifecycleReport
from sessionize_assets.pipeline.versions import signed_arrow
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.lifecycle import (
    INTERVAL_COLUMNS,
    corrected_snapshot,
    snapshot_moves,
)


def move_snapshot(
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
