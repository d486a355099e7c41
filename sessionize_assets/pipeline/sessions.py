"""events -> `sessions`, `session_quarantine` and the `session_changes` log, per (user, day).

A sessions partition records the `events` version it has absorbed. The files `events` added or
removed since then (read from its Delta log) hold the users whose events changed: a change for
user u on event date E can only move u's sessions on E - lookahead .. E + lookback (see
partitions.py), so exactly those (user, session date) pairs are recomputed
(`pipeline/touched.py` finds them), from those users' events in the pairs' windows. Only pairs
whose rows really differ are written: the files holding their old rows are rewritten (files are
user ranges within a date), their new rows added, and both sides go to the corrections log, all
without touching other users.

Each session carries `stitched_user_id` (SPEC §3c): the run first brings `user_identities` up to
date (a no-op when the events run did) and relabels the sessions, on any date, of the anonymous
ids whose mapping changed (pipeline/stitching.py); what it recomputes is stitched with the
identities as they are.

A partition never computed, computed with another gap or cap, or asked for with `full_refresh`
is recomputed whole (every user); so is one whose `events` history is gone. Its old rows are all
compared, so there too only the pairs whose rows differ are rewritten.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date
from functools import cached_property

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import (
    EVENTS,
    SESSION_QUARANTINE,
    SESSIONS,
    SESSIONS_MANIFEST,
    USER_IDENTITIES,
)
from sessionize_assets.partitions import (
    event_window,
    session_lookahead_days,
    session_lookback_days,
)
from sessionize_assets.pipeline.corrections import (
    diff_sessions,
    log_commit,
    log_unlogged_versions,
)
from sessionize_assets.pipeline.identities import IdentitiesReport, update_identities
from sessionize_assets.pipeline.keyed_reads import (
    PRUNING_PAIRS_LIMIT,
    PUSHED_KEYS_TOTAL,
    keys_by_partition,
    pair_filter,
    read_by_keys,
)
from sessionize_assets.pipeline.manifests import (
    SessionsProgress,
    record_sessions_progress,
    sessions_progress,
)
from sessionize_assets.pipeline.stitching import (
    Relabel,
    RelabelReport,
    commit_relabel,
    plan_relabel,
    relabelled_rows,
)
from sessionize_assets.pipeline.touched import (
    PAIR,
    TouchedPairs,
    days_around_column,
    touched_pairs,
)
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.identities import stitch
from sessionize_assets.transforms.sessions import SESSION_EVENT_COLUMNS, build_sessions


def session_definition(settings: Settings) -> str:
    """What sessions depend on besides events: part of the assets' code version."""
    gap = settings.session_gap.total_seconds()
    cap = settings.max_session_length.total_seconds()
    conversions = json.dumps(sorted(settings.conversion_events))
    return f"gap={gap:g}s,cap={cap:g}s,conversions={conversions}"


@dataclass(kw_only=True)
class SessionsReport:
    requested: list[date]
    updated: list[date] = field(default_factory=list)  # dates brought up to date
    recomputed: list[date] = field(default_factory=list)  # of those, recomputed for every user
    changed: list[date] = field(default_factory=list)  # dates whose sessions rows changed
    pairs_recomputed: int = 0  # (user, date) pairs recomputed outside the whole dates
    users_recomputed: int = 0
    # How the recomputed users' events were found: partitions with few such users are
    # searched by user (Parquet skips row groups), the others (and whole dates) read whole.
    dates_searched_by_user: int = 0
    users_looked_up: int = 0
    events_rows_scanned: int = 0  # rows of the `events` partitions read whole
    events_read: int = 0  # events the sessions were recomputed from
    rows_written: int = 0
    files_rewritten: int = 0
    files_total: int = 0
    changes_by_date: dict[date, DateChanges] = field(default_factory=dict)
    sessions_version: int | None = None
    # Sessions versions a killed run committed but did not log, logged by this run.
    versions_logged_late: list[int] = field(default_factory=list)
    identities: IdentitiesReport = field(default_factory=IdentitiesReport)
    relabel: RelabelReport = field(default_factory=RelabelReport)

    @property
    def inserted(self) -> int:
        return sum(c.inserted for c in self.changes_by_date.values())

    @property
    def replaced(self) -> int:
        return sum(c.replaced for c in self.changes_by_date.values())

    @property
    def removed(self) -> int:
        return sum(c.removed for c in self.changes_by_date.values())


def update_sessions(
    store: DeltaStore,
    spark: SparkSession,
    *,
    session_dates: Iterable[date],
    settings: Settings,
    run_id: str,
    full_refresh: bool = False,
) -> SessionsReport:
    """Bring these sessions dates up to date with `events`, recomputing only what changed."""
    dates = sorted(set(session_dates))
    report = SessionsReport(requested=dates)
    tags = {"dagster_run_id": run_id, "table": SESSIONS.name}
    # First the sessions commits a killed run left out of the corrections log.
    report.versions_logged_late = log_unlogged_versions(store, spark, run_id=run_id, tags=tags)
    report.identities = update_identities(store, run_id=run_id)
    # What this run reads: its commits are made against these versions (WriteConflictError).
    read_at = {
        spec: store.read_version(spec) for spec in (SESSIONS, SESSION_QUARANTINE, SESSIONS_MANIFEST)
    }
    relabel = plan_relabel(store)
    report.relabel = relabel.report
    events_version = store.version(EVENTS)
    if events_version is None:
        commit_relabel(store, relabel, tags=tags, read_version=read_at[SESSIONS])
        return report
    definition = session_definition(settings)
    progress = sessions_progress(store, partitions=dates)
    whole = [
        d
        for d in dates
        if full_refresh or d not in progress or progress[d].definition != definition
    ]
    partial = [d for d in dates if d not in whole and progress[d].events_version < events_version]
    found = touched_pairs(
        store, spark, {d: progress[d].events_version for d in partial}, events_version, settings
    )
    if found is None:  # the events history since then is gone: recompute those dates
        whole, partial = sorted([*whole, *partial]), []
        found = TouchedPairs.none(spark)
    if not whole and not partial:
        commit_relabel(store, relabel, tags=tags, read_version=read_at[SESSIONS])
        return report
    touched = found.pairs.persist(StorageLevel.MEMORY_AND_DISK)
    by_date = (
        found.listed
        if found.listed is not None
        else keys_by_partition(
            touched, partition="session_date", key="user_id", limit=PRUNING_PAIRS_LIMIT
        )
    )
    pairs = touched.count() if by_date is None else sum(map(len, by_date.values()))
    progress_now = SessionsProgress(events_version=events_version, definition=definition)
    if not whole and not pairs:  # nothing in these dates' windows changed
        touched.unpersist()
        commit_relabel(store, relabel, tags=tags, read_version=read_at[SESSIONS])
        record_sessions_progress(
            store,
            partitions=partial,
            progress=progress_now,
            run_id=run_id,
            read_version=read_at[SESSIONS_MANIFEST],
        )
        report.updated = partial
        return report
    scope = _Scope(whole=whole, pairs=touched, listed=by_date)
    computed = sorted([*whole, *partial])
    columns = list(SESSION_EVENT_COLUMNS)
    whole_window = event_window(whole, settings)
    # Every user's events around whole dates; elsewhere each touched pair's user's events in
    # that pair's window, found by user (Parquet skips the other users' row groups). With a
    # few pairs on the driver, so are the users of each event date.
    wanted: DataFrame | dict[date, set[str]]
    if by_date is not None and pairs <= PUSHED_KEYS_TOTAL:
        wanted = {}
        skipped = set(whole_window)
        for session_date, users in by_date.items():
            for event_date in event_window([session_date], settings):
                if event_date not in skipped:
                    wanted.setdefault(event_date, set()).update(users)
    else:
        wanted = (
            touched.select("user_id", _event_dates(F.col("session_date"), settings))
            .where(~F.col("event_date").isin(whole_window))
            .select("event_date", "user_id")
            .distinct()
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
    lookup = read_by_keys(store, EVENTS, wanted=wanted, key="user_id", columns=columns)
    report.dates_searched_by_user = len(lookup.searched)
    report.users_looked_up = lookup.keys_pushed
    report.events_rows_scanned = sum(
        store.row_counts(EVENTS, partitions=[*whole_window, *lookup.scanned]).values()
    )
    events = (
        store.read(EVENTS, partitions=whole_window)
        .select(*columns)
        .unionByName(lookup.rows)
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    sessions, quarantine = build_sessions(
        events,
        gap=settings.session_gap,
        max_length=settings.max_session_length,
        conversion_events=settings.conversion_events,
        session_dates=computed,
    )
    identities = store.read(USER_IDENTITIES) if store.exists(USER_IDENTITIES) else None
    sessions = stitch(scope.within(sessions), identities).persist(StorageLevel.MEMORY_AND_DISK)
    # The sessions files that can hold the recomputed pairs' old rows, from the log's per-file
    # user ranges: a few files of each old date instead of all of them.
    files = (
        None
        if by_date is None
        else store.files_with_values(SESSIONS, column="user_id", values=by_date, whole=whole)
    )
    old_rows = (
        store.read(SESSIONS, partitions=computed)
        if files is None
        else store.read_files(SESSIONS, files)
    )
    old = scope.within(old_rows)
    diff = diff_sessions(old, sessions).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        summary = _summarise(diff, events=events, sessions=sessions)  # everything above, once
        changes = summary.changes
        changed_dates = sorted(changes)
        report.files_total = len(store.live_files(SESSIONS, partitions=changed_dates))
        if changed_dates:
            # Only the pairs whose rows differ are rewritten, on whole dates too: their old
            # rows were all compared, so the pairs that did not change keep their rows. The
            # relabelled pairs ride on the same commit.
            drop, drop_keys, new_rows = _rewritten(
                spark, sessions, diff, changed_pairs=summary.changed_pairs, relabel=relabel
            )
            commit = store.rewrite(
                SESSIONS,
                partitions=sorted({*changed_dates, *relabel.dates}),
                drop=drop,
                drop_keys=drop_keys,
                files=None if files is None else sorted({*files, *relabel.files}),
                add=lambda: new_rows,
                commit_metadata=tags,
                app_transaction=relabel.transaction,
                read_version=read_at[SESSIONS],
            )
            log_commit(
                store, spark, diff, sessions_version=commit.version or 0, run_id=run_id, tags=tags
            )
            report.rows_written = commit.rows_written
            report.files_rewritten = commit.files_removed
        else:
            commit_relabel(store, relabel, tags=tags, read_version=read_at[SESSIONS])
        # Bots are rare: without quarantine rows before or after, there is nothing to write.
        if summary.flagged or store.live_files(SESSION_QUARANTINE, partitions=computed):
            in_scope = scope.rows_filter
            store.rewrite(
                SESSION_QUARANTINE,
                partitions=computed,
                drop=in_scope
                if in_scope is not None
                else (F.col("session_date").isin(whole) if whole else None),
                drop_keys=None if in_scope is not None else touched,
                add=lambda: scope.within(quarantine),
                commit_metadata=tags,
                read_version=read_at[SESSION_QUARANTINE],
            )
        report.changed = changed_dates
        report.changes_by_date = changes
        report.events_read = summary.events_read
        report.users_recomputed = summary.users_read
        report.pairs_recomputed = pairs
        report.sessions_version = store.version(SESSIONS)
    finally:
        for frame in (touched, events, sessions, diff):
            frame.unpersist()
        if isinstance(wanted, DataFrame):
            wanted.unpersist()
    record_sessions_progress(
        store,
        partitions=[*whole, *partial],
        progress=progress_now,
        run_id=run_id,
        read_version=read_at[SESSIONS_MANIFEST],
    )
    report.updated = sorted([*whole, *partial])
    report.recomputed = whole
    return report


def _rewritten(
    spark: SparkSession,
    sessions: DataFrame,
    diff: DataFrame,
    *,
    changed_pairs: list[tuple[date, str]] | None,
    relabel: Relabel,
) -> tuple[Column | None, DataFrame | None, DataFrame]:
    """What the sessions commit drops (a filter, or keys) and adds: the recomputed pairs whose
    rows differ, and the relabelled pairs outside them. Few pairs are a filter in the
    queries; many, a join (a broadcast job of its own)."""
    relabelled = relabelled_rows(relabel, recomputed=set(changed_pairs or ()))
    extra = None if relabelled is None else spark.createDataFrame(relabelled, SESSIONS.schema)
    dropped = None if changed_pairs is None else {*changed_pairs, *relabel.pairs}
    if changed_pairs is not None and dropped is not None and len(dropped) <= PUSHED_KEYS_TOTAL:
        drop = _pair_filter(dropped)
        new_rows = sessions.where(_pair_filter(changed_pairs))
        return drop, None, new_rows if extra is None else new_rows.unionByName(extra)
    keys = diff.select(*PAIR).distinct()
    new_rows = sessions.join(keys, on=list(PAIR), how="left_semi")
    if extra is None:
        return None, keys, new_rows
    extra = extra.join(keys, on=list(PAIR), how="left_anti")
    relabelled_keys = spark.createDataFrame(relabel.pairs, "session_date date, user_id string")
    return None, keys.unionByName(relabelled_keys).distinct(), new_rows.unionByName(extra)


def _event_dates(session_date: Column, settings: Settings) -> Column:
    """`event_date`, one row per event date that decides the session date: what
    `partitions.event_window` gives, computed in the query (a join with a table of dates made
    on the driver would be a broadcast job of its own)."""
    return days_around_column(
        session_date,
        before=session_lookback_days(settings),
        after=session_lookahead_days(settings),
    ).alias("event_date")


def _pair_filter(pairs: Iterable[tuple[date, str]]) -> Column:
    """Whether a row's (session_date, user_id) is one of `pairs` (`keyed_reads.pair_filter`)."""
    return pair_filter(pairs, partition="session_date", key="user_id")


@dataclass(frozen=True)
class _Scope:
    """What a run recomputes: every user on `whole` dates, and the touched (user, date) pairs
    (`listed` holds them by date when they came to the driver)."""

    whole: list[date]
    pairs: DataFrame  # (user_id, session_date)
    listed: dict[date, list[str]] | None

    @cached_property
    def rows_filter(self) -> Column | None:
        """The scope as a filter in the query (a hash set) when its pairs came to the driver
        and are few; None otherwise (a join then, a broadcast job of its own). Built once:
        the run's reads, its sessions and its quarantine all take it."""
        if self.listed is None or sum(map(len, self.listed.values())) > PUSHED_KEYS_TOTAL:
            return None
        keep = _pair_filter((day, user) for day, users in self.listed.items() for user in users)
        return (keep | F.col("session_date").isin(self.whole)) if self.whole else keep

    def within(self, rows: DataFrame) -> DataFrame:
        keep = self.rows_filter
        if keep is not None:
            return rows.where(keep)
        marked = rows.join(
            F.broadcast(self.pairs.withColumn("_pair", F.lit(True))), on=list(PAIR), how="left"
        )
        keep = F.col("_pair").isNotNull()
        if self.whole:
            keep = keep | F.col("session_date").isin(self.whole)
        return marked.where(keep).drop("_pair")


@dataclass(frozen=True, kw_only=True)
class DateChanges:
    """How one date's sessions changed in a run: a session both removed and added was
    replaced; `users` are those with a changed session on the date."""

    inserted: int
    replaced: int
    removed: int
    users: int


@dataclass(frozen=True, kw_only=True)
class _Summary:
    """What a run computed, from one Spark job: how each date's sessions changed, the events
    and users they were recomputed from, and the sessions flagged for quarantine."""

    changes: dict[date, DateChanges]
    # The (date, user) pairs with a changed session; None past PUSHED_KEYS_TOTAL of them.
    changed_pairs: list[tuple[date, str]] | None
    events_read: int
    users_read: int
    flagged: int


def _summarise(diff: DataFrame, *, events: DataFrame, sessions: DataFrame) -> _Summary:
    """Per session date with a changed row, how its sessions changed (`diff`), with what was
    read (`events`) and flagged (`sessions`): three aggregates, collected in one Spark job."""
    added, removed = F.col("added") == 1, F.col("removed") == 1
    per_session = diff.groupBy("session_date", "session_id", "user_id").agg(
        F.max((F.col("change") == "added").cast("int")).alias("added"),
        F.max((F.col("change") == "removed").cast("int")).alias("removed"),
    )
    per_date = per_session.groupBy("session_date").agg(
        F.count(F.when(added & ~removed, 1)).alias("inserted"),
        F.count(F.when(added & removed, 1)).alias("replaced"),
        F.count(F.when(~added & removed, 1)).alias("removed"),
        F.countDistinct("user_id").alias("users"),
        F.when(F.countDistinct("user_id") <= PUSHED_KEYS_TOTAL, F.collect_set("user_id")).alias(
            "changed_users"
        ),
    )
    read = events.agg(
        F.count(F.lit(1)).alias("events_read"), F.countDistinct("user_id").alias("users_read")
    )
    flagged = sessions.where("is_quarantined").agg(F.count(F.lit(1)).alias("flagged"))
    rows = (
        per_date.unionByName(read, allowMissingColumns=True)
        .unionByName(flagged, allowMissingColumns=True)
        .collect()
    )
    figures = {
        name: row[name]
        for row in rows
        for name in ("events_read", "users_read", "flagged")
        if row[name] is not None
    }
    dated = [row for row in rows if row.session_date is not None]
    pairs = [(row.session_date, user) for row in dated for user in row.changed_users or []]
    whole = any(row.changed_users is None for row in dated) or len(pairs) > PUSHED_KEYS_TOTAL
    changed_pairs = None if whole else pairs
    return _Summary(
        changed_pairs=changed_pairs,
        changes={
            r.session_date: DateChanges(
                inserted=r.inserted, replaced=r.replaced, removed=r.removed, users=r.users
            )
            for r in dated
        },
        events_read=figures.get("events_read", 0),
        users_read=figures.get("users_read", 0),
        flagged=figures.get("flagged", 0),
    )
