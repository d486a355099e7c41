"""A batch's lifecycle work: the users a change touched, restated on the driver with Arrow from
their anchor day, and their interval rows committed where they differ.

A batch touches a few rows per touched user (their stretches from their anchor, the few files
holding them, the changed session days): a Spark job's fixed cost would be most of the work.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import SESSIONS, USER_LIFECYCLE_STATE
from sessionize_assets.partitions import ONE_DAY, days_between
from sessionize_assets.pipeline.lifecycle.bookkeeping import (
    Interval,
    IntervalCommit,
    LifecycleReport,
)
from sessionize_assets.pipeline.touched import PAIR
from sessionize_assets.pipeline.versions import signed_arrow
from sessionize_assets.transforms.lifecycle import (
    ARROW_INTERVAL_SCHEMA,
    INTERVAL_COLUMNS,
    restate_intervals,
)
from sessionize_assets.transforms.lifecycle_states import OPEN_END, SESSION_STATES, runs_out


@dataclass(frozen=True, kw_only=True)
class TouchedScope:
    """The users a run restates, from which day, and the session days that changed."""

    anchors: dict[str, date]  # each user whose intervals can change, from when
    changed: set[tuple[str, date]]  # (user, day) pairs whose sessions changed since absorbed
    arrivals: set[tuple[str, date]]  # (user, day) pairs with sessions on the days moved over
    held_through: date  # the as-of day the old intervals run through


def changed_scope(
    store: DeltaStore,
    *,
    absorbed: int,
    sessions_version: int,
    previous_as_of: date,
    as_of: date,
) -> TouchedScope | None:
    """The users whose session days changed since `absorbed` (from their earliest changed
    day), those with a session on the days the as-of day moves over and those whose current
    stretch runs out on them (from the first of those days).

    None when the sessions history since `absorbed` is no longer available.
    """
    signed = signed_arrow(
        store, SESSIONS, since=absorbed, through=sessions_version, columns=list(PAIR)
    )
    if signed is None:
        return None
    # A pair whose count of sessions did not change keeps its day: superfluous here.
    net = signed.group_by(list(PAIR)).aggregate([("sign", "sum")])
    net = net.filter(pc.not_equal(net["sign_sum"], 0))
    changed = {pair for pair in _pairs(net) if pair[1] <= as_of}
    anchors: dict[str, date] = {}

    def anchor(user: str, day: date) -> None:
        if day < anchors.get(user, OPEN_END):
            anchors[user] = day

    for user, day in changed:
        anchor(user, day)
    arrivals: set[tuple[str, date]] = set()
    if as_of > previous_as_of:
        moved_over = days_between(previous_as_of + ONE_DAY, as_of)
        # Users with a session on the days the as-of day moves over ...
        arrivals = set(_pairs(store.read_arrow(SESSIONS, partitions=moved_over, columns=PAIR)))
        for user, _ in arrivals:
            anchor(user, moved_over[0])
        # ... and those whose current stretch runs out on them (idle states move on by time).
        current = store.read_arrow(
            USER_LIFECYCLE_STATE, partitions=[OPEN_END], columns=["user_id", "state", "valid_from"]
        )
        for row in current.to_pylist():
            if (
                runs_out(state=row["state"], since=row["valid_from"], previous_as_of=previous_as_of)
                < as_of
            ):
                anchor(row["user_id"], moved_over[0])
    return TouchedScope(
        anchors=anchors, changed=changed, arrivals=arrivals, held_through=previous_as_of
    )


def _pairs(table: pa.Table) -> Iterable[tuple[str, date]]:
    return zip(
        table.column("user_id").to_pylist(), table.column("session_date").to_pylist(), strict=True
    )


def restate_touched(
    store: DeltaStore,
    scope: TouchedScope,
    report: LifecycleReport,
    commit: IntervalCommit,
    *,
    as_of: date,
) -> None:
    """Restate the anchored users on the driver and commit the rows that differ."""
    report.users_restated = len(scope.anchors)
    old = _old_intervals(store, scope)
    balances: dict[str, tuple[str | None, date | None]] = {
        user: (None, None) for user in scope.anchors
    }
    for user, state, since, _ in old:
        if since < scope.anchors[user]:  # the stretch covering the day before the anchor
            balances[user] = (state, since)
    users = sorted(balances)
    new = restate_intervals(
        balances=pa.table(
            {
                "user_id": pa.array(users, pa.string()),
                "anchor": pa.array([scope.anchors[u] for u in users], pa.date32()),
                "prior_state": pa.array([balances[u][0] for u in users], pa.string()),
                "prior_from": pa.array([balances[u][1] for u in users], pa.date32()),
            }
        ),
        session_days=_session_days(store, scope, old),
        as_of=as_of,
    )
    restated = set(zip(*(new.column(name).to_pylist() for name in INTERVAL_COLUMNS), strict=True))
    removed, added = sorted(old - restated), sorted(restated - old)
    report.intervals_removed, report.intervals_added = len(removed), len(added)
    report.users_changed = len({row[0] for row in (*removed, *added)})
    if not (removed or added or commit.mark):
        return
    # The files holding the removed rows: by their user range in each valid_to partition.
    holding: dict[date, list[str]] = {}
    for user, _, _, until in removed:
        holding.setdefault(until, []).append(user)
    files = store.files_with_values(USER_LIFECYCLE_STATE, column="user_id", values=holding)
    done = store.rewrite_arrow(
        USER_LIFECYCLE_STATE,
        add=_interval_table(added),
        drop=_interval_table(removed),
        files=files,
        commit_metadata=commit.tags,
        app_transaction=commit.mark,
        read_version=commit.read_version,
    )
    report.state_rows_written = done.rows_written
    report.state_files_rewritten = done.files_removed


def _interval_table(rows: list[Interval]) -> pa.Table:
    columns: list[Any] = list(zip(*rows, strict=True)) if rows else [[]] * len(INTERVAL_COLUMNS)
    return pa.table(dict(zip(INTERVAL_COLUMNS, columns, strict=True)), schema=ARROW_INTERVAL_SCHEMA)


def _old_intervals(store: DeltaStore, scope: TouchedScope) -> set[Interval]:
    """The anchored users' intervals that end on or after the day before their anchor.

    A stretch is kept in the partition of its last day, sorted by user in files of
    `LIFECYCLE_STATE_FILE_ROWS` rows: only the files whose user range (from the Delta log) can
    hold an anchored user are read, from the day before the earliest anchor on.
    """
    by_anchor = sorted(scope.anchors.items(), key=lambda item: (item[1], item[0]))
    wanted: dict[date, list[str]] = {OPEN_END: [user for user, _ in by_anchor]}
    so_far: list[str] = []
    at = 0
    for day in days_between(by_anchor[0][1] - ONE_DAY, scope.held_through) if by_anchor else []:
        # A stretch that ended on `day` is wanted for the users anchored by the day after.
        while at < len(by_anchor) and by_anchor[at][1] <= day + ONE_DAY:
            so_far.append(by_anchor[at][0])
            at += 1
        if so_far:
            wanted[day] = list(so_far)
    files = store.files_with_values(USER_LIFECYCLE_STATE, column="user_id", values=wanted)
    rows = store.read_files_arrow(USER_LIFECYCLE_STATE, files, columns=INTERVAL_COLUMNS)
    # Filtered in Arrow: the files hold other users' rows too.
    users = pa.array([user for user, _ in by_anchor], pa.string())
    since = pa.array([anchor - ONE_DAY for _, anchor in by_anchor], pa.date32())
    rows = rows.join(
        pa.table({"user_id": users, "_since": since}), keys="user_id", join_type="inner"
    )
    rows = rows.filter(pc.greater_equal(rows["valid_to"], rows["_since"]))
    return set(zip(*(rows.column(name).to_pylist() for name in INTERVAL_COLUMNS), strict=True))


def _session_days(store: DeltaStore, scope: TouchedScope, old: set[Interval]) -> pa.Table:
    """(user_id, session_date): the anchored users' session days from their anchor on, as
    they are now.

    A day of a `new` or `active` stretch is a day with a session (SPEC §4), so the old
    intervals hold the session days absorbed through `held_through`: of those days only the
    changed pairs are read again from `sessions` (the few files whose user range can hold
    them), and the later days were read whole (`arrivals`). The history is not read.
    """
    days = set(scope.arrivals)
    for user, state, since, until in old:
        if state in SESSION_STATES:
            first = max(since, scope.anchors[user])
            last = min(until, scope.held_through)
            for n in range((last - first).days + 1):
                day = first + timedelta(days=n)
                if (user, day) not in scope.changed:
                    days.add((user, day))
    again: dict[date, list[str]] = {}
    for user, day in scope.changed:
        if day <= scope.held_through:
            again.setdefault(day, []).append(user)
    if again:
        files = store.files_with_values(SESSIONS, column="user_id", values=again)
        found = store.read_files_arrow(SESSIONS, files, columns=list(PAIR))
        days.update(pair for pair in _pairs(found) if pair in scope.changed)
    users, session_dates = zip(*sorted(days), strict=True) if days else ((), ())
    return pa.table(
        {
            "user_id": pa.array(users, pa.string()),
            "session_date": pa.array(session_dates, pa.date32()),
        }
    )
