"""The incremental work behind `events` and `sessions`, as plain functions of a store.

Assets call these with their partition keys; the property tests call them directly, so the
logic is exercised on real Spark and Delta without the Dagster machinery in the loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.incremental import (
    Inputs,
    absorbed_inputs,
    batch_inputs,
    indexed_rows,
    input_pairs,
    plan,
    record_absorbed,
)
from sessionize_assets.incremental import (
    batch_event_dates as indexed_event_dates,
)
from sessionize_assets.lake.store import CommitInfo, DeltaStore, LakeError
from sessionize_assets.lake.tables import (
    BATCH_EVENT_DATES,
    EVENTS,
    RAW_EVENTS,
    REJECTED_EVENTS,
    SESSION_CHANGES,
    SESSION_QUARANTINE,
    SESSIONS,
    USER_LIFECYCLE_SNAPSHOT,
    USER_LIFECYCLE_STATE,
)
from sessionize_assets.partitions import ONE_DAY, days_between, event_window
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.events import (
    batch_event_dates,
    duplicate_rejections,
    raw_to_candidates,
    resolve_duplicates,
)
from sessionize_assets.transforms.lifecycle import (
    STATE_SCHEMA,
    STATES,
    advance_lifecycle,
    lifecycle_counts,
)
from sessionize_assets.transforms.sessions import build_sessions
from sessionize_assets.transforms.validation import DEDUP, INGEST, parse_lines, split_batch


@dataclass(frozen=True, kw_only=True)
class IngestResult:
    raw: CommitInfo
    rejected: CommitInfo
    index: CommitInfo
    # Event dates whose inputs changed: the batch's dates now, and any it held before.
    touched_event_dates: list[date]


def ingest_batch_lines(
    store: DeltaStore, lines: DataFrame, *, received: date, settings: Settings, run_id: str
) -> IngestResult:
    """Validate one batch's lines; replace its raw rows, its rejections and its index entry."""
    parsed = parse_lines(
        lines, start_date=settings.start_date, future_tolerance=settings.future_tolerance
    ).persist(StorageLevel.MEMORY_AND_DISK)
    tags = {"dagster_run_id": run_id, "received_date": received.isoformat()}
    try:
        accepted, rejected = split_batch(parsed)
        raw = store.replace_partitions(
            RAW_EVENTS, accepted, partitions=[received], commit_metadata=tags
        )
        # rejected_events also holds the cross-batch duplicates `events` owns: keep those.
        rejected_commit = store.rewrite(
            REJECTED_EVENTS,
            partitions=[received],
            drop=F.col("origin") == INGEST,
            add=lambda: rejected,
            commit_metadata=tags,
        )
    finally:
        parsed.unpersist()
    before = set(indexed_event_dates(store, received))
    index_rows = [
        row.asDict()
        for row in batch_event_dates(
            store.read(RAW_EVENTS, partitions=[received]), ingest_version=raw.version or 0
        ).collect()
    ]
    index = store.replace_partitions_arrow(
        BATCH_EVENT_DATES,
        pa.Table.from_pylist(index_rows, schema=to_arrow_schema(BATCH_EVENT_DATES.schema)),
        partitions=[received],
        commit_metadata=tags,
    )
    after = {row["event_date"] for row in index_rows}
    return IngestResult(
        raw=raw,
        rejected=rejected_commit,
        index=index,
        touched_event_dates=sorted(before | after),
    )


EVENTS_ASSET = "events"
SESSIONS_ASSET = "sessions"


@dataclass(kw_only=True)
class EventsReport:
    requested: list[date]
    updated: list[date] = field(default_factory=list)
    recomputed: list[date] = field(default_factory=list)
    batches_read: int = 0
    raw_rows_read: int = 0
    events_by_date: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    events_version: int | None = None


@dataclass(kw_only=True)
class SessionsReport:
    requested: list[date]
    updated: list[date] = field(default_factory=list)
    changed: list[date] = field(default_factory=list)  # dates whose sessions rows changed
    recomputed: list[date] = field(default_factory=list)
    users_recomputed: int = 0
    users_total: int = 0
    events_read: int = 0
    inserted: int = 0
    replaced: int = 0
    removed: int = 0
    quarantined: int = 0
    sessions_by_date: dict[str, int] = field(default_factory=dict)
    files_rewritten: int = 0
    files_total: int = 0
    sessions_version: int | None = None


def update_events(
    store: DeltaStore, spark: SparkSession, *, event_dates: Iterable[date], run_id: str
) -> EventsReport:
    """Bring `events` for these dates up to date with every batch ingested so far."""
    dates = sorted(set(event_dates))
    report = EventsReport(requested=dates)
    available = batch_inputs(store, dates)
    absorbed = absorbed_inputs(store, asset=EVENTS_ASSET, partitions=dates)
    plans = {d: plan(available[d], absorbed[d]) for d in dates}
    pending = [d for d in dates if plans[d].pending]
    if not pending:
        return report
    recompute = [d for d in pending if plans[d].needs_recompute]
    incremental = [d for d in pending if not plans[d].needs_recompute]
    # Inputs to read from raw: everything for a recompute, only the new batches otherwise.
    to_read: Inputs = {}
    for d in pending:
        to_read.update(plans[d].available if d in recompute else plans[d].new)
    pairs = input_pairs(spark, to_read)
    raw = store.read(RAW_EVENTS, partitions={r for _, r in to_read}).join(
        pairs, on=["event_date", "received_date"], how="left_semi"
    )
    base = (
        store.read(EVENTS, partitions=incremental)
        .join(pairs, on=["event_date", "received_date"], how="left_anti")
        .withColumn("raw_line", F.lit(None).cast("string"))
    )
    candidates = raw_to_candidates(raw).unionByName(base).persist(StorageLevel.MEMORY_AND_DISK)
    tags = {"dagster_run_id": run_id, "asset": EVENTS_ASSET}
    try:
        winners, losers = resolve_duplicates(candidates)
        commit = store.replace_partitions(EVENTS, winners, partitions=pending, commit_metadata=tags)
        found = losers.agg(
            F.count(F.lit(1)).alias("n"),
            F.collect_set(F.when(F.col("raw_line").isNull(), F.col("received_date"))).alias("d"),
        ).first()
        report.duplicates = found["n"]
        if found["n"] or recompute:
            losers = _with_raw_lines(store, losers, displaced_batches=found["d"])
            involved = {r for d in pending for _, r in (*plans[d].available, *absorbed[d])}

            def duplicates() -> DataFrame:
                earlier = store.read(REJECTED_EVENTS, partitions=involved).where(
                    (F.col("origin") == DEDUP) & F.col("event_date").isin(incremental)
                )
                return (
                    duplicate_rejections(losers)
                    .unionByName(earlier)
                    .dropDuplicates(["message_id", "received_date"])
                )

            # Owned rows of these dates are replaced whole, so a re-run cannot add them twice.
            store.rewrite(
                REJECTED_EVENTS,
                partitions=involved,
                drop=(F.col("origin") == DEDUP) & F.col("event_date").isin(pending),
                add=duplicates,
                commit_metadata=tags,
            )
    finally:
        candidates.unpersist()
    record_absorbed(
        store, asset=EVENTS_ASSET, absorbed={d: available[d] for d in pending}, run_id=run_id
    )
    report.updated = pending
    report.recomputed = recompute
    report.batches_read = len({r for _, r in to_read})
    report.raw_rows_read = indexed_rows(store, to_read)
    report.events_by_date = store.row_counts(EVENTS, partitions=pending)
    report.events_version = commit.version
    return report


def _with_raw_lines(
    store: DeltaStore, losers: DataFrame, *, displaced_batches: list[date]
) -> DataFrame:
    """Displaced winners come from `events`, which has no raw line: fetch it from raw."""
    if not displaced_batches:
        return losers
    lines = store.read(RAW_EVENTS, partitions=displaced_batches).select(
        F.col("message_id").alias("event_id"), "received_date", F.col("raw_line").alias("_line")
    )
    return (
        losers.join(lines, on=["event_id", "received_date"], how="left")
        .withColumn("raw_line", F.coalesce("raw_line", "_line"))
        .drop("_line")
    )


def update_sessions(
    store: DeltaStore,
    spark: SparkSession,
    *,
    session_dates: Iterable[date],
    settings: Settings,
    run_id: str,
) -> SessionsReport:
    """Recompute the sessions of users touched by events absorbed since the last run."""
    dates = sorted(set(session_dates))
    report = SessionsReport(requested=dates)
    windows = {d: event_window([d], settings) for d in dates}
    events_absorbed = absorbed_inputs(
        store, asset=EVENTS_ASSET, partitions=event_window(dates, settings)
    )
    available = {
        d: {k: v for e in windows[d] for k, v in events_absorbed[e].items()} for d in dates
    }
    absorbed = absorbed_inputs(store, asset=SESSIONS_ASSET, partitions=dates)
    plans = {d: plan(available[d], absorbed[d]) for d in dates}
    pending = [d for d in dates if plans[d].pending]
    if not pending:
        return report
    recompute = any(plans[d].needs_recompute for d in pending)
    window = event_window(pending, settings)
    events = store.read(EVENTS, partitions=window)
    old = store.read(SESSIONS, partitions=pending)
    if recompute:
        touched = None
    else:
        new_inputs = {k for d in pending for k in plans[d].new}
        touched = (
            store.read(EVENTS, partitions={e for e, _ in new_inputs})
            .join(
                input_pairs(spark, new_inputs), on=["event_date", "received_date"], how="left_semi"
            )
            .select("user_id")
            .distinct()
            .persist()
        )
        events = events.join(touched, on="user_id", how="left_semi")
        old = old.join(touched, on="user_id", how="left_semi")
    events = events.persist(StorageLevel.MEMORY_AND_DISK)
    sessions, quarantine = build_sessions(
        events,
        gap=settings.session_gap,
        max_length=settings.max_session_length,
        session_dates=pending,
    )
    sessions = sessions.persist(StorageLevel.MEMORY_AND_DISK)
    tags = {"dagster_run_id": run_id, "asset": SESSIONS_ASSET}
    drop = F.lit(True) if touched is None else None
    # The corrections: old rows that are gone or changed, new rows that are new or changed.
    diff = _diff(old, sessions).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        changed = diff.select("change", "session_id", "session_date").collect()
        removed_ids = {r.session_id for r in changed if r.change == "removed"}
        added_ids = {r.session_id for r in changed if r.change == "added"}
        files_before = len(store.live_files(SESSIONS, partitions=pending))
        commit = None
        if changed:
            commit = store.rewrite(
                SESSIONS,
                partitions=pending,
                drop=drop,
                drop_keys=touched,
                add=lambda: sessions,
                commit_metadata=tags,
            )
            version = commit.version or 0
            # A log: each run appends its own rows once (a retried run finds no difference).
            store.rewrite(
                SESSION_CHANGES,
                add=lambda: _changes(diff, commit_version=version, run_id=run_id),
                commit_metadata=tags,
            )
        store.rewrite(
            SESSION_QUARANTINE,
            partitions=pending,
            drop=drop,
            drop_keys=touched,
            add=lambda: quarantine,
            commit_metadata=tags,
        )
        read = events.agg(
            F.count(F.lit(1)).alias("events"), F.countDistinct("user_id").alias("users")
        ).first()
        report.changed = sorted({r.session_date for r in changed})
        report.replaced = len(removed_ids & added_ids)
        report.inserted = len(added_ids - removed_ids)
        report.removed = len(removed_ids - added_ids)
        report.events_read = read["events"]
        report.users_recomputed = read["users"]
        report.files_rewritten = commit.files_removed if commit else 0
        report.files_total = files_before
        report.sessions_version = commit.version if commit else store.version(SESSIONS)
    finally:
        for frame in (events, sessions, diff, touched):
            if frame is not None:
                frame.unpersist()
    record_absorbed(
        store,
        asset=SESSIONS_ASSET,
        absorbed={d: available[d] for d in pending},
        run_id=run_id,
    )
    totals = (
        store.read(SESSIONS, partitions=pending)
        .agg(
            F.countDistinct("user_id").alias("users"),
            F.count(F.when(F.col("is_quarantined"), 1)).alias("quarantined"),
        )
        .first()
    )
    report.users_total = totals["users"]
    report.quarantined = totals["quarantined"]
    report.sessions_by_date = store.row_counts(SESSIONS, partitions=pending)
    report.updated = pending
    report.recomputed = pending if recompute else []
    return report


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


_CONTENT = ("session_id", "user_id", "session_date", "session_start", "session_end", "event_count")


def _diff(old: DataFrame, new: DataFrame) -> DataFrame:
    columns = SESSIONS.schema.fieldNames()
    old_rows, new_rows = old.select(*columns), new.select(*columns)
    return (
        old_rows.exceptAll(new_rows)
        .withColumn("change", F.lit("removed"))
        .unionByName(new_rows.exceptAll(old_rows).withColumn("change", F.lit("added")))
    )


def _changes(diff: DataFrame, *, commit_version: int, run_id: str) -> DataFrame:
    now = datetime.now(UTC).replace(tzinfo=None)
    return diff.select(
        "change",
        *_CONTENT,
        F.lit(commit_version).cast("long").alias("commit_version"),
        F.lit(run_id).alias("run_id"),
        F.lit(now).cast("timestamp").alias("changed_at"),
    )
