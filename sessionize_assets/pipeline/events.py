"""raw_events -> `events`: SPEC §2's duplicate rule across every date, paying for what arrived.

An input is one batch's rows of one event date; `events_manifest` says which inputs each date
has absorbed. A run reads the copies of its new inputs (and, for a date whose absorbed input
changed or vanished with a re-delivered batch, every input of that date) and settles each id
against all of its copies, on any date, that the id index (`event_ids`) holds:

- an id's winner is its copy in the earliest batch (ingestion keeps one copy per batch);
- a winning copy of this run's inputs is added to `events`;
- every other copy of this run's inputs becomes a `duplicate` rejection;
- a copy in `events` that is no longer its id's winner is *displaced*, whatever its date: only
  the files holding it are rewritten, and it becomes a `duplicate` rejection;
- a rejected copy that has become its id's winner (the copy that beat it vanished with a
  re-delivered batch) is *promoted*: its rejection is removed and it is added to `events`.

Most ids of a batch have no other copy: those are appended, and nothing else is read for
them. The few that do (*contested* ids) are settled on the driver, after one read of where
their copies stand in `events` and `rejected_events`. A copy of another batch that is in
neither table is left to the run that absorbs its input. A date whose inputs are recomputed
is compared row for row (a re-delivered copy can keep its id and change its content). A date
outside the request that a displacement or a promotion changed keeps the inputs it absorbed,
recorded at the new `events` version so its sessions follow (`EventsReport.also_changed`).
`full_refresh` replaces every requested date with its winners: the rebuild path.

Rejections are committed first, then `events`, whose commit names the inputs it absorbed, then
the manifest. A run killed before its manifest commit is recorded from the `events` log by the
next run (`record_unrecorded`); one killed before its `events` commit is redone, and finds its
rejections already made.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import date
from functools import reduce

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.lake.store import CommitInfo, DeltaStore, empty_frame
from sessionize_assets.lake.tables import EVENTS, EVENTS_MANIFEST, RAW_EVENTS, REJECTED_EVENTS
from sessionize_assets.pipeline.event_ids import (
    Contested,
    copies_of,
    index_missing_batches,
    other_copies,
)
from sessionize_assets.pipeline.keyed_reads import isin_texts
from sessionize_assets.pipeline.manifests import (
    ABSORBED_KEY,
    Inputs,
    absorbed_inputs,
    absorbed_metadata,
    batch_inputs,
    indexed_rows,
    plan,
    record_absorbed,
    record_unrecorded,
)
from sessionize_assets.transforms.events import (
    COPY_KEY,
    Contest,
    Copy,
    duplicate_rejections,
    mark_winners,
    raw_to_candidates,
    rejection_keys,
)
from sessionize_assets.transforms.validation import DEDUP

# Recomputing dates from raw: up to this many losing copies are matched to the rows by
# broadcast (about 60 bytes each); more are joined by shuffle.
BROADCAST_LOSING_COPIES = 500_000


@dataclass(kw_only=True)
class EventsReport:
    requested: list[date]
    updated: list[date] = field(default_factory=list)
    recomputed: list[date] = field(default_factory=list)
    # Dates outside the request whose rows this run changed: a copy displaced from them or
    # promoted into them, because of a copy of the same id on a requested date.
    also_changed: list[date] = field(default_factory=list)
    batches_read: int = 0
    raw_rows_read: int = 0
    contested_ids: int = 0  # ids with a copy in another batch, settled on the driver
    new_events: int = 0  # rows added to `events` (winners, promoted copies, changed rows)
    displaced: int = 0  # copies removed from `events` because another copy of the id wins
    promoted: int = 0  # rejected copies that became their id's winner
    duplicates: int = 0  # duplicate rejections added
    rows_written: int = 0  # rows in the files the events commit added
    files_added: int = 0
    files_removed: int = 0
    # Per requested date: the batches holding its events, and those this run absorbed.
    batches_by_date: dict[date, int] = field(default_factory=dict)
    absorbed_by_date: dict[date, int] = field(default_factory=dict)
    events_version: int | None = None


def update_events(
    store: DeltaStore,
    spark: SparkSession,
    *,
    event_dates: Iterable[date],
    run_id: str,
    full_refresh: bool = False,
) -> EventsReport:
    """Bring `events` for these dates up to date with every batch ingested so far.

    Dates with nothing new are skipped; `full_refresh` recomputes all of them from raw. Other
    dates change only where a copy of an id settled here is displaced or promoted.
    """
    dates = sorted(set(event_dates))
    report = EventsReport(requested=dates)
    record_unrecorded(store, run_id=run_id)
    # What this run reads: its commits are made against these versions (WriteConflictError).
    read_at = {
        spec: store.read_version(spec) for spec in (EVENTS, REJECTED_EVENTS, EVENTS_MANIFEST)
    }
    available = batch_inputs(store, dates)
    absorbed = absorbed_inputs(store, partitions=dates)
    plans = {d: plan(available[d], absorbed[d]) for d in dates}
    report.batches_by_date = {d: len({r for _, r in available[d]}) for d in dates}
    if full_refresh:
        recompute, incremental = dates, []
    else:
        recompute = [d for d in dates if plans[d].needs_recompute]
        incremental = [d for d in dates if plans[d].pending and d not in recompute]
    if not recompute and not incremental:
        return report
    index_missing_batches(store, run_id=run_id)
    new_inputs: Inputs = {k: v for d in incremental for k, v in plans[d].new.items()}
    all_inputs: Inputs = {k: v for d in recompute for k, v in available[d].items()}
    # The batches whose rejections of the recomputed dates are written again.
    involved = sorted({r for d in recompute for _, r in (*available[d], *absorbed[d])})
    own = _read_raw(store, {**new_inputs, **all_inputs}).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        if full_refresh:
            change = _replace(store, own, dates=recompute, involved=involved)
        else:
            change = _settle(
                store,
                spark,
                own,
                recompute=recompute,
                involved=involved,
                new_rows=indexed_rows(store, new_inputs),
            )
        also_changed = sorted(change.dates_touched - set(dates))
        manifest = {d: available[d] for d in (*incremental, *recompute)}
        # A date outside the request keeps the inputs it absorbed, now held by this version.
        manifest |= absorbed_inputs(store, partitions=also_changed)
        tags = {"dagster_run_id": run_id}
        try:
            _commit_rejections(
                store,
                spark,
                change,
                tags={**tags, "table": REJECTED_EVENTS.name},
                read_version=read_at[REJECTED_EVENTS],
            )
            commit = _commit_events(
                store,
                spark,
                change,
                dates=recompute,
                tags={**tags, "table": EVENTS.name, ABSORBED_KEY: absorbed_metadata(manifest)},
                read_version=read_at[EVENTS],
            )
        finally:
            change.release()
    finally:
        own.unpersist()
    record_absorbed(
        store,
        absorbed=manifest,
        events_version=commit.version,
        run_id=run_id,
        read_version=read_at[EVENTS_MANIFEST],
    )
    report.updated = sorted([*incremental, *recompute])
    report.recomputed = recompute
    report.also_changed = also_changed
    report.absorbed_by_date = {
        d: len(available[d]) if d in recompute else len(plans[d].new) for d in report.updated
    }
    report.batches_read = len({r for _, r in (*new_inputs, *all_inputs)})
    report.raw_rows_read = indexed_rows(store, [*new_inputs, *all_inputs])
    report.contested_ids = change.contested
    report.new_events = change.added
    report.displaced = change.displaced
    report.promoted = change.promoted
    report.duplicates = change.rejected
    report.rows_written = commit.rows_written
    report.files_added = commit.files_added
    report.files_removed = commit.files_removed
    report.events_version = commit.version
    return report


def _read_raw(store: DeltaStore, inputs: Inputs) -> DataFrame:
    """The raw copies behind these inputs, in the shape of `events` plus the raw line."""
    dates_of: dict[date, set[date]] = {}
    for event_date, received_date in inputs:
        dates_of.setdefault(received_date, set()).add(event_date)
    raw = store.read(RAW_EVENTS, partitions=dates_of)
    return raw_to_candidates(raw.where(_per_batch("event_date", dates_of)) if dates_of else raw)


def _per_batch(column: str, values: dict[date, set]) -> Column:
    """Rows whose `column` is one of the values listed for their batch: a filter, no join."""
    return reduce(
        lambda a, b: a | b,
        (
            (F.col("received_date") == received) & F.col(column).isin(sorted(wanted))
            for received, wanted in sorted(values.items())
        ),
        F.lit(False),
    )


def _is_copy(copies: Collection[Copy]) -> Column:
    """Rows (`event_id`, `received_date`) that are one of these copies: a filter, no join.
    One copy per (id, batch) makes those two columns its key."""
    ids_by_batch: dict[date, set[str]] = {}
    for _, event_id, received_date in copies:
        ids_by_batch.setdefault(received_date, set()).add(event_id)
    return _per_batch("event_id", ids_by_batch)


@dataclass(kw_only=True)
class _Change:
    """What one run commits: rows to add and keys to drop, in `events` and `rejected_events`."""

    events_add: DataFrame  # rows in the shape of `events`
    events_drop: list[Copy]
    rejections_add: DataFrame | None  # rows in the shape of `rejected_events`
    rejections_drop: list[Copy]  # duplicate rejections to remove, by copy
    # Duplicate rejections removed whole: (batches, event dates) of the recomputed dates.
    rejections_replaced: tuple[list[date], list[date]] | None = None
    replace: bool = False  # `full_refresh`: the requested dates become `events_add` whole
    dates_touched: set[date] = field(default_factory=set)  # known before the commit
    contested: int = 0
    added: int = 0
    displaced: int = 0
    promoted: int = 0
    rejected: int = 0
    persisted: list[DataFrame] = field(default_factory=list)

    def release(self) -> None:
        for frame in self.persisted:
            frame.unpersist()


def _settle(
    store: DeltaStore,
    spark: SparkSession,
    own: DataFrame,
    *,
    recompute: list[date],
    involved: list[date],
    new_rows: int,
) -> _Change:
    """The change that settles every id of `own` (this run's copies) and of the recomputed
    dates against every copy of those ids (see the module docstring)."""
    on_recomputed = F.col("event_date").isin(recompute)
    mine = own.select(*COPY_KEY)
    current = store.read(EVENTS, partitions=recompute)
    if recompute:
        # An id the recomputed dates hold but this run no longer has a copy of (it vanished
        # with a re-delivered batch) is settled too: another copy of it may win now.
        held = (
            current.select("event_id")
            .unionByName(
                rejection_keys(store.read(REJECTED_EVENTS, partitions=involved))
                .where(on_recomputed)
                .select("event_id")
            )
            .join(mine, on="event_id", how="left_anti")
            .select(
                F.lit(None).cast("date").alias("event_date"),
                "event_id",
                F.lit(None).cast("date").alias("received_date"),
            )
        )
        mine = mine.unionByName(held)
    contest = _contest(store, other_copies(store, mine))
    settled = contest.settle(recompute)

    # This run's winners elsewhere than the recomputed dates: appended, all but those already
    # there and those that lose.
    kept_out = settled.lose | settled.present
    appended = own.where(~on_recomputed)
    if kept_out:
        appended = appended.where(~_is_copy(kept_out))
    foreign = sorted(settled.promote | (settled.reject - contest.own))
    foreign_rows = _raw_copies(store, foreign).persist(StorageLevel.MEMORY_AND_DISK)
    events_add = appended.unionByName(
        foreign_rows.where(_is_copy(settled.promote)) if settled.promote else foreign_rows.limit(0)
    ).select(*EVENTS.schema.fieldNames())
    events_drop = set(settled.drop)
    added = new_rows - len(kept_out & _not_on(contest.own, recompute)) + len(settled.promote)
    if recompute:
        # The recomputed dates hold their winners, row for row.
        wanted = own.where(on_recomputed)
        losing_here = settled.lose - _not_on(settled.lose, recompute)
        if losing_here:
            wanted = wanted.where(~_is_copy(losing_here))
        wanted = wanted.select(*EVENTS.schema.fieldNames())
        to_add = wanted.exceptAll(current)
        to_drop = current.exceptAll(wanted)
        diff = _collect_copies(drop=to_drop, add=to_add)
        events_drop |= diff["drop"]
        if diff["drop"]:
            # A key is dropped with every row holding it: one both dropped and wanted (an
            # extra copy of a row, left by writers that raced) is written again, once.
            dropped = _is_copy(diff["drop"])
            to_add = to_add.where(~dropped).unionByName(wanted.where(dropped))
        events_add = events_add.unionByName(to_add)
        added += len(diff["add"])
    reject_rows = own.unionByName(foreign_rows).where(_is_copy(settled.reject))
    return _Change(
        events_add=events_add,
        events_drop=sorted(events_drop),
        rejections_add=duplicate_rejections(reject_rows) if settled.reject else None,
        rejections_drop=sorted(settled.unreject),
        rejections_replaced=(involved, recompute) if recompute else None,
        dates_touched={d for d, _, _ in events_drop | settled.promote},
        contested=len(contest.copies),
        added=added,
        displaced=len(settled.displace),
        promoted=len(settled.promote),
        rejected=len(settled.reject),
        persisted=[foreign_rows],
    )


def _not_on(copies: set[Copy], dates: list[date]) -> set[Copy]:
    excluded = set(dates)
    return {c for c in copies if c[0] not in excluded}


def _contest(store: DeltaStore, found: Contested) -> Contest:
    """Where the contested ids' copies stand, read in one small Spark job over the dates and
    batches they are in (none when no id is contested)."""
    if not found.copies:
        return Contest(copies={}, own=set(), in_events=set(), rejected=set())
    ids = sorted(found.copies)
    everywhere = [c for group in found.copies.values() for c in group]
    standing = (
        store.read(EVENTS, partitions={d for d, _, _ in everywhere})
        .where(isin_texts(F.col("event_id"), ids))
        .select(*COPY_KEY, F.lit("events").alias("_in"))
        .unionByName(
            rejection_keys(store.read(REJECTED_EVENTS, partitions={r for _, _, r in everywhere}))
            .where(isin_texts(F.col("event_id"), ids))
            .select(*COPY_KEY, F.lit("rejected").alias("_in"))
        )
        .collect()
    )
    where: dict[str, set[Copy]] = {"events": set(), "rejected": set()}
    for row in standing:
        where[row["_in"]].add((row["event_date"], row["event_id"], row["received_date"]))
    return Contest(
        copies=found.copies,
        own=found.held,
        in_events=where["events"],
        rejected=where["rejected"],
    )


def _collect_copies(**frames: DataFrame) -> dict[str, set[Copy]]:
    """The COPY_KEYs of several frames, brought to the driver in one Spark job, by name."""
    tagged = [frame.select(*COPY_KEY, F.lit(name).alias("_kind")) for name, frame in frames.items()]
    out: dict[str, set[Copy]] = {name: set() for name in frames}
    for row in reduce(DataFrame.unionByName, tagged).collect():
        out[row["_kind"]].add((row["event_date"], row["event_id"], row["received_date"]))
    return out


def _keys_frame(spark: SparkSession, copies: list[Copy]) -> DataFrame:
    """A small frame of COPY_KEY rows (what a commit drops by key)."""
    return spark.createDataFrame(copies, "event_date date, event_id string, received_date date")


def _raw_copies(store: DeltaStore, copies: list[Copy]) -> DataFrame:
    """The raw rows (shape of `events` plus the line) of these copies, from their batches."""
    raw = raw_to_candidates(store.read(RAW_EVENTS, partitions={r for _, _, r in copies}))
    return raw.where(_is_copy(copies)) if copies else raw


def _replace(
    store: DeltaStore, own: DataFrame, *, dates: list[date], involved: list[date]
) -> _Change:
    """`full_refresh`: the requested dates hold exactly their winners, against every copy;
    the duplicate rejections of those dates in the `involved` batches are written again."""
    keep = StorageLevel.MEMORY_AND_DISK
    ids = own.select("event_id").distinct().persist(keep)
    index = copies_of(store, ids)
    # Raw rows are wide and few copies lose: the losing keys are found on narrow columns and
    # matched to the rows by broadcast when they fit, so the rows are not shuffled for it.
    losing = (
        mark_winners(index.rows)
        .where(~F.col("wins") & F.col("event_date").isin(dates))
        .select(*COPY_KEY)
        .persist(keep)
    )
    lost = losing.count()
    matched = F.broadcast(losing) if lost <= BROADCAST_LOSING_COPIES else losing
    winners = own.join(matched, on=list(COPY_KEY), how="left_anti")
    return _Change(
        events_add=winners.select(*EVENTS.schema.fieldNames()),
        events_drop=[],
        rejections_add=duplicate_rejections(own.join(matched, on=list(COPY_KEY), how="left_semi")),
        rejections_drop=[],
        rejections_replaced=(sorted({*involved, *index.batches}), dates),
        replace=True,
        dates_touched=set(dates),
        rejected=lost,
        persisted=[ids, losing],
    )


def _commit_rejections(
    store: DeltaStore,
    spark: SparkSession,
    change: _Change,
    *,
    tags: dict[str, str],
    read_version: int | None,
) -> CommitInfo | None:
    """Duplicate rejections: the recomputed dates' written again, the others added and
    removed by copy. Nothing is committed when nothing changes."""
    drop, keys, batches = None, None, {r for _, _, r in change.rejections_drop}
    if change.rejections_replaced is not None:
        replaced_batches, dates = change.rejections_replaced
        drop = (F.col("origin") == DEDUP) & F.col("event_date").isin(dates)
        batches |= set(replaced_batches)
    if change.rejections_drop:
        keys = _keys_frame(spark, change.rejections_drop).select(
            "event_date",
            F.col("event_id").alias("message_id"),
            "received_date",
            F.lit(DEDUP).alias("origin"),
        )
    if drop is None and keys is None and change.rejections_add is None:
        return None
    rows = change.rejections_add
    return store.rewrite(
        REJECTED_EVENTS,
        partitions=sorted(batches),
        drop=drop,
        drop_keys=keys,
        add=lambda: rows if rows is not None else empty_frame(spark, REJECTED_EVENTS.schema),
        commit_metadata=tags,
        read_version=read_version,
    )


def _commit_events(
    store: DeltaStore,
    spark: SparkSession,
    change: _Change,
    *,
    dates: list[date],
    tags: dict[str, str],
    read_version: int | None,
) -> CommitInfo:
    if change.replace:
        return store.replace_partitions(
            EVENTS,
            change.events_add,
            partitions=dates,
            commit_metadata=tags,
            read_version=read_version,
        )
    drop = change.events_drop
    keys = None
    if drop:
        keys = _keys_frame(spark, drop)
    return store.rewrite(
        EVENTS,
        partitions=sorted({d for d, _, _ in drop}),
        drop_keys=keys,
        add=lambda: change.events_add,
        commit_metadata=tags,
        read_version=read_version,
    )
