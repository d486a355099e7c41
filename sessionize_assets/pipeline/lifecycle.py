"""sessions -> the user lifecycle: the intervals of the users a change touched, restated from
their earliest changed day, and the snapshot moved by what those intervals gained and lost.

What each table has absorbed is recorded in its own commits, as Delta `txn` actions
(`AppTransaction`, one per commit), so a run that died between two commits is completed by the
next run, whatever range that one was asked for:
- `user_lifecycle_state` records the `sessions` version it reflects and its as-of day, both in
  the version of one application id (`ABSORBED`, see `absorbed_mark`);
- `user_lifecycle_snapshot` records the `user_lifecycle_state` version its counts reflect.

A run restates the users whose session days changed since that `sessions` version (from the
Delta log of `sessions`: the files added and removed since), the users with sessions on the
days the as-of day moves over, and the users whose current stretch runs out on those days
(`inactive` -> `dormant` -> `churned`). Everyone else keeps their rows. The snapshot then moves
by the interval rows added and removed since the version it reflects (from the Delta log of
`user_lifecycle_state`).

Where the work runs: a batch touches a few rows per touched user (their stretches from their
anchor, the few files holding them, the changed session days), so a run reads, restates and
commits them on the driver with Arrow: a Spark job's fixed cost would be most of the work.
Restating every user (the first run, or when the `sessions` history since the absorbed
version is gone) runs the same rule (`restate_intervals`) on the executors, by Spark.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import functions as F

from sessionize_assets.lake.store import AppTransaction, DeltaStore
from sessionize_assets.lake.tables import SESSIONS, USER_LIFECYCLE_SNAPSHOT, USER_LIFECYCLE_STATE
from sessionize_assets.partitions import ONE_DAY, days_between
from sessionize_assets.pipeline.keyed_reads import files_for_pairs
from sessionize_assets.pipeline.sessions import PAIR
from sessionize_assets.pipeline.versions import signed_arrow
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.lifecycle import (
    ARROW_INTERVAL_SCHEMA,
    CHURNED_AFTER,
    DORMANT_AFTER,
    INACTIVE_AFTER,
    INTERVAL_COLUMNS,
    INTERVAL_SCHEMA,
    OPEN_END,
    corrected_snapshot,
    restate_intervals,
    snapshot_moves,
)

# Delta application ids of the bookkeeping (see the module docstring).
ABSORBED = "sessionize.user_lifecycle_state.absorbed"  # version: `absorbed_mark`
STATE_ABSORBED = "sessionize.user_lifecycle_snapshot.state_version"
# Above every date's proleptic ordinal (date.max is 3,652,059): the as-of day's share of a mark.
_DAYS = 10_000_000

Interval = tuple[str, str, date, date]  # user_id, state, valid_from, valid_to


@dataclass(kw_only=True)
class LifecycleReport:
    as_of: date
    days: list[date] = field(default_factory=list)  # every snapshot day this run wrote
    restated_from_start: bool = False  # no usable bookkeeping: every user was restated
    users_restated: int = 0
    users_changed: int = 0  # users with an interval row added or removed
    intervals_added: int = 0
    intervals_removed: int = 0
    state_rows_written: int = 0  # rows in the files committed, carried rows included
    state_files_rewritten: int = 0
    state_rows: int = 0  # interval rows in the table after the run
    state_version: int | None = None
    snapshot_version: int | None = None


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
    commit = _IntervalCommit(
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
        scope = _changed_scope(
            store,
            absorbed=absorbed,
            sessions_version=sessions_version,
            previous_as_of=previous_as_of,
            as_of=as_of,
        )
    if scope is None:  # first run, or the sessions history since then is gone
        report.restated_from_start = True
        _restate_everyone(store, report, commit, start=settings.start_date, as_of=as_of)
    else:
        _restate_touched(store, scope, report, commit, as_of=as_of)
    _move_snapshot(store, report, settings=settings, run_id=run_id)
    report.state_version = store.version(USER_LIFECYCLE_STATE)
    report.snapshot_version = store.version(USER_LIFECYCLE_SNAPSHOT)
    report.state_rows = sum(store.row_counts(USER_LIFECYCLE_STATE).values())
    return report


def absorbed_mark(sessions_version: int | None, as_of: date) -> AppTransaction:
    """The intervals' bookkeeping in one `AppTransaction`: the `sessions` version they reflect
    (None before any) and their as-of day, packed so that the version grows whenever either
    does (neither moves back; Delta records one application version per commit)."""
    absorbed = 0 if sessions_version is None else sessions_version + 1
    return AppTransaction(app_id=ABSORBED, version=absorbed * _DAYS + as_of.toordinal())


def absorbed_by(version: int | None) -> tuple[int | None, date | None]:
    """(`sessions` version, as-of day) of an `absorbed_mark` version; (None, None) for none."""
    if version is None:
        return None, None
    absorbed, ordinal = divmod(version, _DAYS)
    return (None if absorbed == 0 else absorbed - 1), date.fromordinal(ordinal)


@dataclass(frozen=True, kw_only=True)
class _IntervalCommit:
    """How a run commits the intervals: with its bookkeeping mark, against the version read."""

    tags: dict[str, str]
    mark: AppTransaction | None  # None: the table's mark already says what this run absorbs
    read_version: int | None


# -- a batch: the touched users, on the driver ---------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Scope:
    """The users a run restates, from which day, and the session days that changed."""

    anchors: dict[str, date]  # each user whose intervals can change, from when
    changed: set[tuple[str, date]]  # (user, day) pairs whose sessions changed since absorbed
    arrivals: set[tuple[str, date]]  # (user, day) pairs with sessions on the days moved over
    held_through: date  # the as-of day the old intervals run through


def _changed_scope(
    store: DeltaStore,
    *,
    absorbed: int,
    sessions_version: int,
    previous_as_of: date,
    as_of: date,
) -> _Scope | None:
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
            if _runs_out(row["state"], row["valid_from"], previous_as_of) < as_of:
                anchor(row["user_id"], moved_over[0])
    return _Scope(anchors=anchors, changed=changed, arrivals=arrivals, held_through=previous_as_of)


def _pairs(table: pa.Table) -> Iterable[tuple[str, date]]:
    return zip(
        table.column("user_id").to_pylist(), table.column("session_date").to_pylist(), strict=True
    )


def _runs_out(state: str, since: date, previous_as_of: date) -> date:
    """The last day of a current stretch if no session comes (far future for `churned`)."""
    if state in ("new", "active"):
        return previous_as_of
    if state == "inactive":
        return since + timedelta(days=DORMANT_AFTER - INACTIVE_AFTER - 1)
    if state == "dormant":
        return since + timedelta(days=CHURNED_AFTER - DORMANT_AFTER - 1)
    return OPEN_END


def _restate_touched(
    store: DeltaStore,
    scope: _Scope,
    report: LifecycleReport,
    commit: _IntervalCommit,
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


def _old_intervals(store: DeltaStore, scope: _Scope) -> set[Interval]:
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


def _session_days(store: DeltaStore, scope: _Scope, old: set[Interval]) -> pa.Table:
    """(user_id, session_date): the anchored users' session days from their anchor on, as
    they are now.

    A day of a `new` or `active` stretch is a day with a session (SPEC §4), so the old
    intervals hold the session days absorbed through `held_through`: of those days only the
    changed pairs are read again from `sessions` (the few files whose user range can hold
    them), and the later days were read whole (`arrivals`). The history is not read.
    """
    days = set(scope.arrivals)
    for user, state, since, until in old:
        if state in ("new", "active"):
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


# -- every user, on the executors -----------------------------------------------------------


def _restate_everyone(
    store: DeltaStore,
    report: LifecycleReport,
    commit: _IntervalCommit,
    *,
    start: date,
    as_of: date,
) -> None:
    """Every user restated from the start date, by Spark; only the rows that differ from the
    table are committed."""
    session_days = store.read(SESSIONS, partitions=days_between(start, as_of)).select(*PAIR)
    buckets = int(session_days.sparkSession.conf.get("spark.sql.shuffle.partitions") or 200)

    def restate(group: pa.Table) -> pa.Table:
        users = pc.unique(group.column("user_id"))
        return restate_intervals(
            balances=pa.table(
                {
                    "user_id": users,
                    "anchor": pa.array([start] * len(users), pa.date32()),
                    "prior_state": pa.nulls(len(users), pa.string()),
                    "prior_from": pa.nulls(len(users), pa.date32()),
                }
            ),
            session_days=group,
            as_of=as_of,
        )

    new = (
        session_days.withColumn("_bucket", F.abs(F.hash("user_id")) % buckets)
        .groupBy("_bucket")
        .applyInArrow(restate, INTERVAL_SCHEMA)
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    old = store.read(USER_LIFECYCLE_STATE).persist(StorageLevel.MEMORY_AND_DISK)
    removed = old.join(new, on=INTERVAL_COLUMNS, how="left_anti").persist(
        StorageLevel.MEMORY_AND_DISK
    )
    added = new.join(old, on=INTERVAL_COLUMNS, how="left_anti").persist(
        StorageLevel.MEMORY_AND_DISK
    )
    frames = [new, old, removed, added]
    try:
        # One job computes (and caches) both sides while their inputs are cached.
        stats = (
            removed.select("user_id", F.lit(-1).alias("sign"))
            .unionByName(added.select("user_id", F.lit(1).alias("sign")))
            .unionByName(new.select("user_id", F.lit(0).alias("sign")))
            .agg(
                F.count(F.when(F.col("sign") > 0, 1)),
                F.count(F.when(F.col("sign") < 0, 1)),
                F.countDistinct(F.when(F.col("sign") != 0, F.col("user_id"))),
                F.countDistinct(F.when(F.col("sign") == 0, F.col("user_id"))),
            )
            .first()
        )
        assert stats is not None  # an aggregate has one row
        (
            report.intervals_added,
            report.intervals_removed,
            report.users_changed,
            report.users_restated,
        ) = stats
        partitions, files = files_for_pairs(
            store, USER_LIFECYCLE_STATE, pairs=removed, key="user_id"
        )
        done = store.rewrite(
            USER_LIFECYCLE_STATE,
            partitions=partitions,
            drop_keys=removed if report.intervals_removed else None,
            files=files,
            add=lambda: added,
            commit_metadata=commit.tags,
            app_transaction=commit.mark,
            read_version=commit.read_version,
        )
    finally:
        for frame in frames:
            frame.unpersist()
    report.state_rows_written = done.rows_written
    report.state_files_rewritten = done.files_removed


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
