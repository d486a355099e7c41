"""events -> `sessions`, `session_quarantine` and the `session_changes` log, per (user, day).

A sessions partition records the `events` version it has absorbed. The files `events` added or
removed since then (read from its Delta log) hold the users whose events changed: a change for
user u on event date E can only move u's sessions on E - lookahead .. E + lookback (see
partitions.py), so exactly those (user, session date) pairs are recomputed
(`pipeline/touched.py` finds them), from those users' events in the pairs' windows, or, for a
pair whose added events join none of its user's old chains, from its old rows and those events
(`pipeline/sessions_additions.py`). Only pairs whose rows really differ are written: the files
holding their old rows are rewritten (files are user ranges within a date), their new rows
added, and both sides go to the corrections log, all without touching other users.

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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.lake.parquet_files import files_named
from sessionize_assets.lake.store import DeltaStore, TableSpec
from sessionize_assets.lake.tables import (
    EVENTS,
    SESSION_QUARANTINE,
    SESSIONS,
    SESSIONS_MANIFEST,
    USER_IDENTITIES,
)
from sessionize_assets.partitions import (
    event_window,
)
from sessionize_assets.pipeline import sessions_additions
from sessionize_assets.pipeline.corrections import (
    diff_sessions,
    log_commit,
    log_unlogged_versions,
)
from sessionize_assets.pipeline.identities import IdentitiesReport, update_identities
from sessionize_assets.pipeline.keyed_reads import (
    PRUNING_PAIRS_LIMIT,
    keys_by_partition,
    keys_for_join,
    pair_filter,
)
from sessionize_assets.pipeline.manifests import (
    SessionsProgress,
    record_sessions_progress,
    sessions_progress,
)
from sessionize_assets.pipeline.sessions_additions import (
    Candidates,
    candidates,
    isolated_pairs,
    sessions_of_additions,
)
from sessionize_assets.pipeline.sessions_diff import (
    DateChanges,
    EventsRead,
    SessionsCommitted,
    SessionsScope,
    pairs_table,
    rewritten,
    summarise,
)
from sessionize_assets.pipeline.sessions_events import (
    EventsLookup,
    built_on_driver,
    events_on,
    read_events,
)
from sessionize_assets.pipeline.sessions_on_driver import (
    commit_on_driver,
    fits_on_driver,
)
from sessionize_assets.pipeline.stitching import (
    Relabel,
    RelabelReport,
    commit_relabel,
    plan_relabel,
)
from sessionize_assets.pipeline.touched import (
    NO_PAIRS,
    ChangedEvents,
    touched_pairs,
)
from sessionize_assets.resources.spark import shuffle_partitions_for
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.identities import stitch
from sessionize_assets.transforms.sessions import (
    sessions_with_quarantine,
    split_quarantine,
)

# A run keeps what it reuses (the events it read, the sessions it computed, their diff) in
# memory, spilling to disk, while its whole dates hold at most this many events; past it, on
# disk alone. PySpark's MEMORY_AND_DISK is serialised: at the bench's full size (1 GB driver)
# a range run over days 32..90 failed twice in the heap, serialising its 7 M events (63 dates)
# into memory, then reading a spilled block of its sessions back into memory whole. A daily
# batch's whole dates (its new days) hold about 100,000 events at the mid size, 400,000 at
# the full size.
KEPT_IN_MEMORY_EVENTS = 1_000_000


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
    # Touched users (and their pairs) whose sessions were updated from their old rows and the
    # events added (pipeline/sessions_additions.py): their history was not read.
    users_from_additions: int = 0
    pairs_from_additions: int = 0  # of `pairs_recomputed`
    # How the recomputed users' events were found: partitions with few such users are
    # searched by user (Parquet skips row groups), the others (and whole dates) read whole.
    dates_searched_by_user: int = 0
    users_looked_up: int = 0
    events_rows_scanned: int = 0  # rows of the `events` partitions read whole
    events_read: int = 0  # events the sessions were recomputed from
    rows_written: int = 0
    files_rewritten: int = 0
    # The files searched for the old rows the commit drops; None when the pairs were too
    # many to list and their dates were searched whole.
    files_searched: int | None = 0
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
    spark: Callable[[], SparkSession],
    *,
    session_dates: Iterable[date],
    settings: Settings,
    run_id: str,
    full_refresh: bool = False,
) -> SessionsReport:
    """Bring these sessions dates up to date with `events`, recomputing only what changed.

    The recipe: log what a killed run left unlogged and bring identities up to date; plan which
    dates are recomputed whole and which (user, date) pairs elsewhere (`_plan`); find the files
    holding those pairs' old rows (`_old_files`) and the added events that may join no old
    chain (`_addition_candidates`). A small run then reads its events, builds their sessions
    and commits them on the driver (pipeline/sessions_events.py, sessions_on_driver.py).
    Otherwise: read the old rows (`_old_rows`) and tell the isolated pairs; read the other
    pairs' users' events (`read_events`); recompute those, update the isolated ones from their
    old rows and added events, and stitch them all; commit the pairs whose rows differ with
    their corrections (`_commit_sessions`) and the quarantine (`_commit_quarantine`). Last,
    record what each date has absorbed. `spark` is called only when the run needs Spark: a
    run made on the driver starts no session.
    """
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
    plan = _plan(store, spark, dates, settings=settings, full_refresh=full_refresh)
    if plan is None or (not plan.scope.whole and not plan.scope.pair_count):
        commit_relabel(store, relabel, tags=tags, read_version=read_at[SESSIONS])
        if plan is not None:  # nothing in these dates' windows changed
            plan.scope.release()
            _record_progress(store, plan, plan.partial, run_id, read_at, report)
        return report
    report.pairs_recomputed = plan.scope.pair_count
    frames: list[DataFrame] = []
    try:
        # Events per date from the log's statistics, read once: the run's size, the additions'
        # gate and the rows the lookup scanned.
        event_rows = store.row_counts(EVENTS)
        whole_rows = events_on(event_rows, event_window(plan.scope.whole, settings))
        keep = _kept_at(whole_rows)
        files = _old_files(store, plan)
        found = _addition_candidates(plan, event_rows=event_rows, settings=settings)
        rules = _rules(plan, settings)
        # Without additions, a run whose sessions the driver builds commits there too when
        # what it rewrites fits (pipeline/sessions_on_driver.py): no Spark session.
        on_driver = (
            built_on_driver(
                store,
                plan.scope,
                settings=settings,
                rules=rules,
                skipped=set(),
                event_rows=event_rows,
            )
            if found is None
            else None
        )
        if (
            on_driver is not None
            and files is not None
            and fits_on_driver(store, on_driver.sessions, files=files, relabel=relabel)
        ):
            _report_lookup(report, on_driver.lookup)
            _report_commit(
                report,
                commit_on_driver(
                    store,
                    spark,
                    built=on_driver.sessions,
                    events=on_driver.read,
                    scope=plan.scope,
                    files=files,
                    relabel=relabel,
                    tags=tags,
                    read_versions=(read_at[SESSIONS], read_at[SESSION_QUARANTINE]),
                    run_id=run_id,
                ),
            )
            report.sessions_version = store.version(SESSIONS)
            return _finish(store, plan, run_id, read_at, report)
        session = spark()
        # Spark plans a kept frame when it is kept, and an action when it runs: all of them
        # from here on have shuffles sized for the run.
        with shuffle_partitions_for(session, rows=whole_rows):
            old = None if files is None else _old_rows(store, plan, files, keep=keep)
            if old is not None:
                frames.append(old)
            additions = (
                None
                if found is None or old is None
                else isolated_pairs(store, session, found=found, old=old, settings=settings)
            )
            report.users_from_additions = 0 if additions is None else len(additions.users)
            report.pairs_from_additions = 0 if additions is None else len(additions.pairs)
            skipped = set() if additions is None else additions.pairs
            if found is not None:  # the isolated pairs' events are not read
                on_driver = built_on_driver(
                    store,
                    plan.scope,
                    settings=settings,
                    rules=rules,
                    skipped=skipped,
                    event_rows=event_rows,
                )
            events: DataFrame | EventsRead
            if on_driver is not None:
                built = session.createDataFrame(on_driver.sessions)
                events, lookup = on_driver.read, on_driver.lookup
            else:
                events, lookup = read_events(
                    store,
                    plan.scope,
                    settings=settings,
                    frames=frames,
                    keep=keep,
                    skipped=skipped,
                    event_rows=event_rows,
                )
                built = sessions_with_quarantine(events, **rules)
            _report_lookup(report, lookup)
            if additions is not None and old is not None:
                # The isolated pairs from their old rows and added events; the others
                # recomputed from `events` (whole dates are never isolated).
                isolated = pair_filter(additions.pairs, partition="session_date", key="user_id")
                built = built.where(~isolated).unionByName(
                    sessions_of_additions(
                        store, session, additions=additions, old=old, settings=settings
                    )
                )
            identities = store.read(USER_IDENTITIES) if store.exists(USER_IDENTITIES) else None
            # Kept with the quarantine's columns: both tables' rows come from it, the chains
            # once.
            stitched = stitch(plan.scope.within(built), identities).persist(keep)
            frames.append(stitched)
            sessions, quarantine = split_quarantine(stitched)
            committed = _commit_sessions(
                store,
                session,
                plan,
                events=events,
                sessions=sessions,
                old=old,
                files=files,
                relabel=relabel,
                commit=_Commit(tags=tags, read_version=read_at[SESSIONS], run_id=run_id),
                frames=frames,
                keep=keep,
            )
            _report_commit(report, committed)
            _commit_quarantine(
                store,
                plan,
                quarantine,
                flagged=committed.summary.flagged,
                commit=_Commit(tags=tags, read_version=read_at[SESSION_QUARANTINE], run_id=run_id),
            )
        report.sessions_version = store.version(SESSIONS)
    finally:
        plan.scope.release()
        for frame in frames:
            frame.unpersist()
    return _finish(store, plan, run_id, read_at, report)


def _finish(
    store: DeltaStore,
    plan: _Plan,
    run_id: str,
    read_at: Mapping[TableSpec, int],
    report: SessionsReport,
) -> SessionsReport:
    """Record the progress of a run that recomputed its dates, and report them."""
    _record_progress(store, plan, plan.computed, run_id, read_at, report)
    report.recomputed = plan.scope.whole
    return report


def _rules(plan: _Plan, settings: Settings) -> dict[str, Any]:
    """The arguments of SPEC §3's rules, in either engine, for the dates `plan` computes."""
    return {
        "gap": settings.session_gap,
        "max_length": settings.max_session_length,
        "conversion_events": settings.conversion_events,
        "session_dates": plan.computed,
    }


def _report_lookup(report: SessionsReport, lookup: EventsLookup) -> None:
    report.dates_searched_by_user = lookup.dates_searched_by_user
    report.users_looked_up = lookup.users_looked_up
    report.events_rows_scanned = lookup.events_rows_scanned


def _report_commit(report: SessionsReport, done: SessionsCommitted) -> None:
    """What the run's commit changed, in its report."""
    summary = done.summary
    report.changed = sorted(summary.changes)
    report.changes_by_date = summary.changes
    report.events_read = summary.events_read
    report.users_recomputed = summary.users_read
    report.files_total = done.files_total
    report.rows_written = done.rows_written
    report.files_rewritten = done.files_rewritten
    report.files_searched = done.files_searched


@dataclass(frozen=True, kw_only=True)
class _Plan:
    """Which sessions dates a run recomputes whole, which it brings up to date by the (user,
    date) pairs touched since what they absorbed (`scope`), and the progress it records."""

    scope: SessionsScope
    partial: list[date]
    progress: SessionsProgress
    # The `events` version each partial date has absorbed.
    absorbed: dict[date, int] = field(default_factory=dict)
    # What the changed `events` files hold by user, when they were read on the driver.
    changed: ChangedEvents | None = None

    @property
    def computed(self) -> list[date]:
        return sorted([*self.scope.whole, *self.partial])


@dataclass(frozen=True, kw_only=True)
class _Commit:
    """How a run commits a table: tagged, against the version it read."""

    tags: dict[str, str]
    read_version: int
    run_id: str


def _plan(
    store: DeltaStore,
    spark: Callable[[], SparkSession],
    dates: list[date],
    *,
    settings: Settings,
    full_refresh: bool,
) -> _Plan | None:
    """The dates to recompute whole (never computed, another definition, `full_refresh`, or
    their events history gone) and the pairs touched elsewhere; None before any events."""
    events_version = store.version(EVENTS)
    if events_version is None:
        return None
    definition = session_definition(settings)
    progress = sessions_progress(store, partitions=dates)
    whole = [
        d
        for d in dates
        if full_refresh or d not in progress or progress[d].definition != definition
    ]
    partial = [d for d in dates if d not in whole and progress[d].events_version < events_version]
    absorbed = {d: progress[d].events_version for d in partial}
    found = touched_pairs(store, absorbed, events_version, settings)
    if found is None:  # the events history since then is gone: recompute those dates
        whole, partial = sorted([*whole, *partial]), []
        found = NO_PAIRS
    if not whole and not partial:
        return None
    if found.listed is not None:
        by_date: dict[date, list[str]] | None = found.listed
        # Made and kept only when the run needs it in Spark.
        pairs = lambda: found.frame(spark()).persist(StorageLevel.MEMORY_AND_DISK)  # noqa: E731
    else:
        kept = found.frame(spark()).persist(StorageLevel.MEMORY_AND_DISK)
        by_date = keys_by_partition(
            kept, partition="session_date", key="user_id", limit=PRUNING_PAIRS_LIMIT
        )
        pairs = lambda: kept  # noqa: E731
    pair_count = pairs().count() if by_date is None else sum(map(len, by_date.values()))
    return _Plan(
        scope=SessionsScope(whole=whole, kept_pairs=pairs, listed=by_date, pair_count=pair_count),
        partial=partial,
        progress=SessionsProgress(events_version=events_version, definition=definition),
        absorbed=absorbed,
        changed=found.changed,
    )


def _old_files(store: DeltaStore, plan: _Plan) -> list[str] | None:
    """The sessions files that can hold the touched pairs' old rows (from the log's per-file
    user ranges: a few files of each old date instead of all of them); None when the pairs
    are too many to list (their dates are then read whole for the diff)."""
    if plan.scope.listed is None:
        return None
    return store.files_with_values(
        SESSIONS, column="user_id", values=plan.scope.listed, whole=plan.scope.whole
    )


def _old_rows(store: DeltaStore, plan: _Plan, files: list[str], *, keep: StorageLevel) -> DataFrame:
    """The old rows of the scope in `files`, each with its file, kept at `keep`: compared with
    the new rows, and what the isolated pairs' sessions are updated from."""
    return plan.scope.within(store.read_files(SESSIONS, files, with_file=True)).persist(keep)


def _addition_candidates(
    plan: _Plan, *, event_rows: Mapping[str, int], settings: Settings
) -> Candidates | None:
    """The clusters of added events whose pairs may be updated from their old rows and those
    events (pipeline/sessions_additions.py): None for none, or when the dates only they would
    read hold fewer than ADDITIONS_MIN_EVENTS_SKIPPED events."""
    listed = plan.scope.listed
    if listed is None:
        return None
    found = candidates(plan.changed, listed=listed, absorbed=plan.absorbed, settings=settings)
    if not found.times:
        return None
    skippable = found.skippable(listed, settings) - set(event_window(plan.scope.whole, settings))
    if events_on(event_rows, skippable) < sessions_additions.ADDITIONS_MIN_EVENTS_SKIPPED:
        return None
    return found


def _kept_at(whole_rows: int) -> StorageLevel:
    """Where a run whose whole dates' windows hold `whole_rows` events keeps the frames it
    reuses: in memory, spilling to disk, up to KEPT_IN_MEMORY_EVENTS; past it, on disk."""
    return (
        StorageLevel.MEMORY_AND_DISK
        if whole_rows <= KEPT_IN_MEMORY_EVENTS
        else StorageLevel.DISK_ONLY
    )


def _commit_sessions(
    store: DeltaStore,
    spark: SparkSession,
    plan: _Plan,
    *,
    events: DataFrame | EventsRead,
    sessions: DataFrame,
    old: DataFrame | None,
    files: list[str] | None,
    relabel: Relabel,
    commit: _Commit,
    frames: list[DataFrame],
    keep: StorageLevel,
) -> SessionsCommitted:
    """Compare the recomputed sessions with the old rows of their pairs, and commit the pairs
    whose rows differ (with the relabelled pairs) and their corrections. Returns what changed
    (with the sessions flagged for quarantine). The diff is kept at `keep`."""
    old_rows = (
        old
        if old is not None
        else plan.scope.within(store.read(SESSIONS, partitions=plan.computed))
    )
    diff = diff_sessions(old_rows, sessions).persist(keep)
    frames.append(diff)
    # Everything above, once; with the files holding an old row of a changed pair.
    summary = summarise(diff, events=events, sessions=sessions, old=old)
    changed_dates = sorted(summary.changes)
    files_total = len(store.live_files(SESSIONS, partitions=changed_dates))
    if changed_dates:
        # Only the pairs whose rows differ are rewritten, on whole dates too: their old rows
        # were all compared, so the pairs that did not change keep their rows. The relabelled
        # pairs ride on the same commit.
        rewrite = rewritten(
            spark,
            sessions,
            diff,
            changed_pairs=summary.changed_pairs,
            changed=sum(change.users for change in summary.changes.values()),
            relabel=relabel,
        )
        # The files to search for the old rows: those holding an old row of a changed pair
        # (a few per date where a late event adds sessions to many), and the relabelled ones.
        searched = (
            None
            if files is None or summary.old_files is None
            else sorted({*files_named(summary.old_files, files), *relabel.files})
        )
        if (
            searched is not None
            and rewrite.dropped is not None
            and store.rewrites_on_driver(SESSIONS, rewrite.new_rows, files=searched)
        ):
            # The pairs and the files that can hold their old rows are known, and they fit
            # the driver: the files are read and written there with Arrow, and Spark's one job
            # collects the new rows alone (not the files' rows too, shuffled to the driver).
            done = store.rewrite_arrow(
                SESSIONS,
                add=rewrite.new_rows.toArrow(),
                drop=pairs_table(rewrite.dropped),
                files=searched,
                commit_metadata=commit.tags,
                app_transaction=relabel.transaction,
                read_version=commit.read_version,
            )
        else:
            done = store.rewrite(
                SESSIONS,
                partitions=sorted({*changed_dates, *relabel.dates}),
                drop=rewrite.drop_filter(),
                drop_keys=rewrite.drop_keys,
                files=searched,
                add=lambda: rewrite.new_rows,
                commit_metadata=commit.tags,
                app_transaction=relabel.transaction,
                read_version=commit.read_version,
            )
        log_commit(
            store,
            lambda: spark,
            diff,
            sessions_version=done.version or 0,
            run_id=commit.run_id,
            tags=commit.tags,
        )
        return SessionsCommitted(
            summary=summary,
            files_total=files_total,
            rows_written=done.rows_written,
            files_rewritten=done.files_removed,
            files_searched=None if searched is None else len(searched),
        )
    commit_relabel(store, relabel, tags=commit.tags, read_version=commit.read_version)
    return SessionsCommitted(summary=summary, files_total=files_total)


def _commit_quarantine(
    store: DeltaStore, plan: _Plan, quarantine: DataFrame, *, flagged: int, commit: _Commit
) -> None:
    """Replace the quarantined sessions of the run's scope. Bots are rare: without quarantine
    rows before or after, there is nothing to write."""
    whole = plan.scope.whole
    if not flagged and not store.live_files(SESSION_QUARANTINE, partitions=plan.computed):
        return
    in_scope = plan.scope.rows_filter
    store.rewrite(
        SESSION_QUARANTINE,
        partitions=plan.computed,
        drop=in_scope
        if in_scope is not None
        else (F.col("session_date").isin(whole) if whole else None),
        drop_keys=None
        if in_scope is not None
        else keys_for_join(plan.scope.pairs, rows=plan.scope.pair_count),
        add=lambda: quarantine,
        commit_metadata=commit.tags,
        read_version=commit.read_version,
    )


def _record_progress(
    store: DeltaStore,
    plan: _Plan,
    updated: list[date],
    run_id: str,
    read_at: Mapping[TableSpec, int],
    report: SessionsReport,
) -> None:
    """Record that `updated` absorbed the events version planned for, with its definition."""
    record_sessions_progress(
        store,
        partitions=updated,
        progress=plan.progress,
        run_id=run_id,
        read_version=read_at[SESSIONS_MANIFEST],
    )
    report.updated = updated
