"""sessions -> the user lifecycle: the intervals of the users a change touched, restated from
their earliest changed day, and the snapshot moved by what those intervals gained and lost.

What each table has absorbed is recorded in its own commits, as Delta `txn` actions
(`AppTransaction`), so a run that died between two commits is completed by the next run,
whatever range that one was asked for:
- `user_lifecycle_state` records the `sessions` version it reflects and its as-of day;
- `user_lifecycle_snapshot` records the `user_lifecycle_state` version its counts reflect.

A run restates the users whose session days changed since that `sessions` version (from the
Delta log of `sessions`: the files added and removed since), the users with sessions on the
days the as-of day moves over, and the users whose current stretch runs out on those days
(`inactive` -> `dormant` -> `churned`). Everyone else keeps their rows. The snapshot then moves
by the interval rows added and removed since the version it reflects (from the Delta log of
`user_lifecycle_state`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from functools import reduce

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.lake.store import AppTransaction, DeltaStore
from sessionize_assets.lake.tables import SESSIONS, USER_LIFECYCLE_SNAPSHOT, USER_LIFECYCLE_STATE
from sessionize_assets.partitions import ONE_DAY, days_between
from sessionize_assets.pipeline.keyed_reads import files_for_pairs, read_pairs
from sessionize_assets.pipeline.sessions import PAIR
from sessionize_assets.pipeline.versions import signed_rows
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.lifecycle import (
    CHURNED_AFTER,
    DORMANT_AFTER,
    INACTIVE_AFTER,
    INTERVAL_COLUMNS,
    OPEN_END,
    corrected_snapshot,
    restate_intervals,
    snapshot_moves,
)

# Delta application ids of the bookkeeping (see the module docstring).
SESSIONS_ABSORBED = "sessionize.user_lifecycle_state.sessions_version"
AS_OF = "sessionize.user_lifecycle_state.as_of"  # version: the day's proleptic ordinal
STATE_ABSORBED = "sessionize.user_lifecycle_snapshot.state_version"


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
    store: DeltaStore, spark: SparkSession, *, through: date, settings: Settings, run_id: str
) -> LifecycleReport:
    """Bring the lifecycle up to date with `sessions`, its as-of day moved to `through` (it
    never moves back), rewriting only the users and the snapshot days that change."""
    if through < settings.start_date:
        raise ValueError(f"lifecycle day {through} is before the start date {settings.start_date}")
    tags = {"dagster_run_id": run_id, "asset": USER_LIFECYCLE_STATE.name}
    # The intervals' commit is made against the version read here (WriteConflictError).
    state_read = store.version(USER_LIFECYCLE_STATE)
    absorbed = store.applied_version(USER_LIFECYCLE_STATE, SESSIONS_ABSORBED)
    ordinal = store.applied_version(USER_LIFECYCLE_STATE, AS_OF)
    previous_as_of = None if ordinal is None else date.fromordinal(ordinal)
    as_of = through if previous_as_of is None else max(through, previous_as_of)
    sessions_version = store.version(SESSIONS)
    report = LifecycleReport(as_of=as_of)

    scope = None
    if absorbed is not None and previous_as_of is not None and sessions_version is not None:
        scope = _changed_scope(
            store,
            spark,
            absorbed=absorbed,
            sessions_version=sessions_version,
            previous_as_of=previous_as_of,
            as_of=as_of,
        )
    if scope is None:  # first run, or the sessions history since then is gone
        report.restated_from_start = True
        scope = _everyone(store, start=settings.start_date, as_of=as_of)
    frames: list[DataFrame] = scope.cached()
    try:
        users, earliest = scope.anchors.agg(F.count(F.lit(1)), F.min("anchor")).first()
        report.users_restated = users
        if users:
            old = _old_intervals(
                store, scope.anchors, earliest=earliest, previous_as_of=previous_as_of
            )
            frames.append(old)
            session_days = scope.session_days(store, old)
            removed, added = _restate(scope.anchors, old, session_days, report, as_of=as_of)
            frames += [removed, added]
            _commit_intervals(
                store,
                removed,
                added,
                report,
                tags=tags,
                transactions=_marks(sessions_version, as_of),
                read_version=state_read,
            )
        elif (absorbed, previous_as_of) != (sessions_version, as_of):
            # Nothing to restate: record what was absorbed, with no row.
            store.rewrite(
                USER_LIFECYCLE_STATE,
                add=lambda: spark.createDataFrame([], USER_LIFECYCLE_STATE.schema),
                commit_metadata=tags,
                app_transactions=_marks(sessions_version, as_of),
                read_version=state_read,
            )
    finally:
        for frame in frames:
            frame.unpersist()
    _move_snapshot(store, spark, report, settings=settings, run_id=run_id)
    report.state_version = store.version(USER_LIFECYCLE_STATE)
    report.snapshot_version = store.version(USER_LIFECYCLE_SNAPSHOT)
    report.state_rows = sum(store.row_counts(USER_LIFECYCLE_STATE).values())
    return report


def _marks(sessions_version: int | None, as_of: date) -> list[AppTransaction]:
    marks = [AppTransaction(app_id=AS_OF, version=as_of.toordinal())]
    if sessions_version is not None:
        marks.append(AppTransaction(app_id=SESSIONS_ABSORBED, version=sessions_version))
    return marks


@dataclass(frozen=True)
class _Scope:
    """The users a run restates, from which day, and where their session days come from."""

    anchors: DataFrame  # (user_id, anchor): each user whose intervals can change, from when
    # (user_id, session_date) read from `sessions`: the days the as-of day moves over, or every
    # day when restating from the start.
    read: DataFrame
    # (user_id, session_date) pairs whose sessions changed since the absorbed version, and the
    # as-of day the old intervals run through; both None when restating from the start.
    changed: DataFrame | None = None
    held_through: date | None = None

    def cached(self) -> list[DataFrame]:
        """Persist the frames used more than once; the caller unpersists them. The inputs go
        first, so that the anchors' cached plan reads them from the cache."""
        frames = [self.read, self.anchors]
        if self.changed is not None:
            frames.insert(0, self.changed)
        for frame in frames:
            frame.persist(StorageLevel.MEMORY_AND_DISK)
        return frames

    def session_days(self, store: DeltaStore, old: DataFrame) -> DataFrame:
        """(user_id, session_date): the anchored users' session days from their anchor on, as
        they are now, given their `old` intervals from the day before their anchor.

        A day of a `new` or `active` stretch is a day with a session (SPEC §4), so the old
        intervals hold the session days absorbed through `held_through`: of those days only
        the changed pairs are read again from `sessions` (the few files whose user range can
        hold them), and the later ones were read whole. The history is not read.
        """
        if self.changed is None or self.held_through is None:
            return self.read  # restating from the start: every day was read
        held = (
            old.where(F.col("state").isin("new", "active"))
            .select(
                "user_id",
                F.greatest("valid_from", "anchor").alias("_from"),
                F.least("valid_to", F.lit(self.held_through)).alias("_to"),
            )
            .where(F.col("_from") <= F.col("_to"))
            .select("user_id", F.explode(F.sequence("_from", "_to")).alias("session_date"))
            .join(self.changed, on=list(PAIR), how="left_anti")
        )
        reread = read_pairs(
            store,
            SESSIONS,
            pairs=self.changed.where(F.col("session_date") <= F.lit(self.held_through)),
            key="user_id",
        ).select(*PAIR)
        return held.unionByName(reread).unionByName(self.read)


def _everyone(store: DeltaStore, *, start: date, as_of: date) -> _Scope:
    """Every user with a session or an interval, restated from the start date."""
    session_days = store.read(SESSIONS, partitions=days_between(start, as_of)).select(*PAIR)
    anchors = (
        session_days.select("user_id")
        .unionByName(store.read(USER_LIFECYCLE_STATE).select("user_id"))
        .distinct()
        .withColumn("anchor", F.lit(start))
    )
    return _Scope(anchors=anchors, read=session_days)


def _changed_scope(
    store: DeltaStore,
    spark: SparkSession,
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
    changed = _changed_session_days(store, spark, since=absorbed, through=sessions_version)
    if changed is None:
        return None
    changed = changed.where(F.col("session_date") <= F.lit(as_of))
    moved_over = days_between(previous_as_of + ONE_DAY, as_of) if as_of > previous_as_of else []
    arrivals = store.read(SESSIONS, partitions=moved_over).select(*PAIR)
    parts = [changed.select("user_id", F.col("session_date").alias("anchor"))]
    if moved_over:
        after = F.lit(moved_over[0]).alias("anchor")
        # Users with a session on the days the as-of day moves over ...
        parts.append(arrivals.select("user_id", after))
        # ... and those whose current stretch runs out on them (idle states move on by time).
        current = store.read(USER_LIFECYCLE_STATE, partitions=[OPEN_END])
        parts.append(
            current.where(_runs_out(previous_as_of) < F.lit(as_of)).select("user_id", after)
        )
    anchors = (
        reduce(DataFrame.unionByName, parts).groupBy("user_id").agg(F.min("anchor").alias("anchor"))
    )
    return _Scope(anchors=anchors, read=arrivals, changed=changed, held_through=previous_as_of)


def _runs_out(previous_as_of: date) -> Column:
    """The last day of a current stretch if no session comes (far future for `churned`)."""
    state, since = F.col("state"), F.col("valid_from")
    return (
        F.when(state.isin("new", "active"), F.lit(previous_as_of))
        .when(state == "inactive", F.date_add(since, DORMANT_AFTER - INACTIVE_AFTER - 1))
        .when(state == "dormant", F.date_add(since, CHURNED_AFTER - DORMANT_AFTER - 1))
        .otherwise(F.lit(OPEN_END))
    )


def _changed_session_days(
    store: DeltaStore, spark: SparkSession, *, since: int, through: int
) -> DataFrame | None:
    """(user_id, session_date) pairs whose sessions changed between the two versions (a pair
    whose count of sessions did not change keeps its day: superfluous for the lifecycle)."""
    rows = signed_rows(store, spark, SESSIONS, since=since, through=through)
    if rows is None:
        return None
    return (
        rows.groupBy("user_id", "session_date")
        .agg(F.sum("sign").alias("net"))
        .where(F.col("net") != 0)
        .select("user_id", "session_date")
    )


def _old_intervals(
    store: DeltaStore, anchors: DataFrame, *, earliest: date, previous_as_of: date | None
) -> DataFrame:
    """The anchored users' intervals that end on or after the day before their anchor, with
    the anchor: from the partitions of the days since `earliest` - 1 and the current one."""
    if previous_as_of is None:
        partitions: list[date] = [OPEN_END]
        rows = store.read(USER_LIFECYCLE_STATE)
    else:
        partitions = [*days_between(earliest - ONE_DAY, previous_as_of), OPEN_END]
        rows = store.read(USER_LIFECYCLE_STATE, partitions=partitions)
    return (
        rows.join(F.broadcast(anchors), on="user_id")
        .where(F.col("valid_to") >= F.date_sub("anchor", 1))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )


def _restate(
    anchors: DataFrame,
    old: DataFrame,
    session_days: DataFrame,
    report: LifecycleReport,
    *,
    as_of: date,
) -> tuple[DataFrame, DataFrame]:
    """(removed, added): the anchored users' interval rows that are gone, and the new ones,
    both cached, with their counts in `report`."""
    prior = old.where(F.col("valid_from") <= F.date_sub("anchor", 1)).select(
        "user_id", F.col("state").alias("prior_state"), F.col("valid_from").alias("prior_from")
    )
    balances = anchors.join(prior, on="user_id", how="left")
    new = restate_intervals(balances=balances, session_days=session_days, as_of=as_of).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    try:
        before = old.select(*INTERVAL_COLUMNS)
        removed = before.join(new, on=INTERVAL_COLUMNS, how="left_anti")
        added = new.join(before, on=INTERVAL_COLUMNS, how="left_anti")
        removed = removed.persist(StorageLevel.MEMORY_AND_DISK)
        added = added.persist(StorageLevel.MEMORY_AND_DISK)
        # One job computes (and caches) both sides while their inputs are cached.
        stats = (
            removed.select("user_id", F.lit(-1).alias("sign"))
            .unionByName(added.select("user_id", F.lit(1).alias("sign")))
            .agg(
                F.count(F.when(F.col("sign") > 0, 1)),
                F.count(F.when(F.col("sign") < 0, 1)),
                F.countDistinct("user_id"),
            )
            .first()
        )
        report.intervals_added, report.intervals_removed, report.users_changed = stats
    finally:
        new.unpersist()
    return removed, added


def _commit_intervals(
    store: DeltaStore,
    removed: DataFrame,
    added: DataFrame,
    report: LifecycleReport,
    *,
    tags: dict[str, str],
    transactions: list[AppTransaction],
    read_version: int | None,
) -> None:
    """One commit: the removed rows dropped (only the files holding them are rewritten), the
    added ones appended, and the bookkeeping marks."""
    partitions, files = files_for_pairs(store, USER_LIFECYCLE_STATE, pairs=removed, key="user_id")
    commit = store.rewrite(
        USER_LIFECYCLE_STATE,
        partitions=partitions,
        drop_keys=removed if report.intervals_removed else None,
        files=files,
        add=lambda: added,
        commit_metadata=tags,
        app_transactions=transactions,
        read_version=read_version,
    )
    report.state_rows_written = commit.rows_written
    report.state_files_rewritten = commit.files_removed


def _move_snapshot(
    store: DeltaStore,
    spark: SparkSession,
    report: LifecycleReport,
    *,
    settings: Settings,
    run_id: str,
) -> None:
    """Write the snapshot days that the interval rows committed since its version change, and
    the days up to the as-of day, in one commit that records the state version it reflects."""
    state_version = store.version(USER_LIFECYCLE_STATE)
    snapshot_read = store.version(USER_LIFECYCLE_SNAPSHOT)
    reflected = store.applied_version(USER_LIFECYCLE_SNAPSHOT, STATE_ABSORBED)
    days_held = sorted(date.fromisoformat(d) for d in store.row_counts(USER_LIFECYCLE_SNAPSHOT))
    old_last = days_held[-1] if days_held else None
    signed = (
        None
        if reflected is None or state_version is None
        else signed_rows(store, spark, USER_LIFECYCLE_STATE, since=reflected, through=state_version)
    )
    if signed is None:  # no usable bookkeeping: count every interval from an empty snapshot
        old_last = None
        signed = store.read(USER_LIFECYCLE_STATE).withColumn("sign", F.lit(1))
    moves = {
        (r["day"], r["state"]): (int(r["begins"]), int(r["ends"]))
        for r in snapshot_moves(signed).collect()
    }
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
        app_transactions=(
            []
            if state_version is None
            else [AppTransaction(app_id=STATE_ABSORBED, version=state_version)]
        ),
        read_version=snapshot_read,
    )
    report.days = days
