"""raw_events -> `events`: SPEC §2's cross-batch duplicate rule, paying only for what arrived.

Per event date the manifest says which inputs (one batch's rows of that date) are new. Their
copies are ranked against the copies already in `events` that share an id (of `events` only
the ids and ranking columns are read), and then:
- a new copy that wins and whose id is new is appended, in a new file;
- a new copy that wins against a copy already in `events` (an earlier-received copy that
  arrived later) displaces it: only the files holding displaced rows are rewritten, and the
  displaced copy becomes a `duplicate` rejection;
- a new copy that loses is appended to `rejected_events` as a `duplicate`.
A date whose absorbed input changed or vanished (a re-delivered batch) is recomputed from all
its batches, and only the difference is committed. `full_refresh` recomputes every requested
date from raw and replaces it whole: the rebuild path.

Rejections are committed before events. A crash in between leaves the manifest untouched, so
the next run redoes the same work: copies already in `events` or already rejected are
recognised by (event_id, received_date) and not added twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import EVENTS, EVENTS_MANIFEST, RAW_EVENTS, REJECTED_EVENTS
from sessionize_assets.pipeline.keyed_reads import KeyedRead, read_by_keys
from sessionize_assets.pipeline.manifests import (
    Inputs,
    absorbed_inputs,
    batch_inputs,
    indexed_rows,
    input_pairs,
    plan,
    record_absorbed,
)
from sessionize_assets.transforms.events import (
    COPY_KEY,
    WINNER_ORDER,
    duplicate_rejections,
    losing_copies,
    raw_to_candidates,
    split_copies,
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
    batches_read: int = 0
    raw_rows_read: int = 0
    # How the duplicate rule found the copies already in `events`: dates with few new ids
    # are searched by id (Parquet skips row groups), the others read whole (their ids only).
    dates_searched_by_id: int = 0
    ids_looked_up: int = 0
    events_rows_scanned: int = 0  # rows of the dates read whole
    new_events: int = 0  # winners added
    displaced: int = 0  # winners that lost to an earlier-received copy that came later
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

    Dates with nothing new are skipped; `full_refresh` recomputes all of them from raw.
    """
    dates = sorted(set(event_dates))
    report = EventsReport(requested=dates)
    # What this run reads: its commits are made against these versions (WriteConflictError).
    read_at = {spec: store.version(spec) for spec in (EVENTS, REJECTED_EVENTS, EVENTS_MANIFEST)}
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
    new_inputs: Inputs = {k: v for d in incremental for k, v in plans[d].new.items()}
    all_inputs: Inputs = {k: v for d in recompute for k, v in available[d].items()}
    tags = {"dagster_run_id": run_id, "table": EVENTS.name}

    arrived = _read_raw(store, spark, new_inputs).persist(StorageLevel.MEMORY_AND_DISK)
    change = _rank_new_copies(store, arrived)
    report.dates_searched_by_id = len(change.lookup.searched)
    report.ids_looked_up = change.lookup.keys_pushed
    report.events_rows_scanned = sum(
        store.row_counts(EVENTS, partitions=change.lookup.scanned).values()
    )
    persisted = [arrived, change.ranked, change.present]
    try:
        counts = change.counts() if new_inputs else (0, 0, 0)
        displaced = change.displaced_keys() if new_inputs else []
        rebuilt = _recomputed(store, spark, all_inputs, dates=recompute, replace=full_refresh)
        persisted += [rebuilt.kept] if rebuilt.kept is not None else []
        involved = {r for d in recompute for _, r in (*available[d], *absorbed[d])}

        def rejections() -> DataFrame:
            new = duplicate_rejections(change.losers(arrived)).unionByName(
                _displaced_rejections(store, spark, displaced)
            )
            batches = {r for _, r in new_inputs} | {row[2] for row in displaced}
            already = (
                store.read(REJECTED_EVENTS, partitions=batches)
                .where(F.col("origin") == DEDUP)
                .select("message_id", "received_date")
            )
            new = new.join(already, on=["message_id", "received_date"], how="left_anti")
            return new.unionByName(duplicate_rejections(rebuilt.losers))

        store.rewrite(
            REJECTED_EVENTS,
            partitions=involved,
            drop=(F.col("origin") == DEDUP) & F.col("event_date").isin(recompute)
            if recompute
            else None,
            add=rejections,
            commit_metadata=tags,
            read_version=read_at[REJECTED_EVENTS],
        )
        added = change.winners(arrived).unionByName(rebuilt.added)
        if full_refresh:
            commit = store.replace_partitions(
                EVENTS,
                added,
                partitions=recompute,
                commit_metadata=tags,
                read_version=read_at[EVENTS],
            )
        else:
            drop_keys = rebuilt.removed_keys.unionByName(_copies(spark, displaced))
            commit = store.rewrite(
                EVENTS,
                partitions=sorted({row[0] for row in displaced} | set(recompute)),
                drop_keys=drop_keys.select("event_id", "received_date"),
                add=lambda: added,
                commit_metadata=tags,
                read_version=read_at[EVENTS],
            )
    finally:
        for frame in persisted:
            frame.unpersist()
    record_absorbed(
        store,
        absorbed={d: available[d] for d in (*incremental, *recompute)},
        events_version=commit.version,
        run_id=run_id,
        read_version=read_at[EVENTS_MANIFEST],
    )
    report.updated = sorted([*incremental, *recompute])
    report.recomputed = recompute
    report.absorbed_by_date = {
        d: len(available[d]) if d in recompute else len(plans[d].new) for d in report.updated
    }
    report.batches_read = len({r for _, r in (*new_inputs, *all_inputs)})
    report.raw_rows_read = indexed_rows(store, [*new_inputs, *all_inputs])
    report.new_events, report.duplicates, report.displaced = counts
    report.rows_written = commit.rows_written
    report.files_added = commit.files_added
    report.files_removed = commit.files_removed
    report.events_version = commit.version
    return report


def _read_raw(store: DeltaStore, spark: SparkSession, inputs: Inputs) -> DataFrame:
    """The raw copies behind these inputs, in the shape of `events` plus the raw line."""
    raw = store.read(RAW_EVENTS, partitions={r for _, r in inputs}).join(
        input_pairs(spark, inputs), on=["event_date", "received_date"], how="left_semi"
    )
    return raw_to_candidates(raw)


@dataclass(frozen=True)
class _NewCopies:
    """New copies ranked against the copies of the same ids already in `events`."""

    ranked: DataFrame  # COPY_KEY + is_new + rank, for the ids the new copies carry
    lookup: KeyedRead  # how the copies already in `events` were found
    present: DataFrame  # those copies (ranking columns), persisted

    def counts(self) -> tuple[int, int, int]:
        """(new winners, losing new copies, displaced copies)."""
        row = self.ranked.agg(
            F.count(F.when(_new_winner(), 1)).alias("winners"),
            F.count(F.when(F.col("_new") & (F.col("_rank") > 1), 1)).alias("losers"),
            F.count(F.when(~F.col("_new") & (F.col("_rank") > 1), 1)).alias("displaced"),
        ).first()
        return (row["winners"], row["losers"], row["displaced"]) if row else (0, 0, 0)

    def winners(self, arrived: DataFrame) -> DataFrame:
        keys = self.ranked.where(_new_winner()).select(*COPY_KEY)
        winners = arrived.join(keys, on=list(COPY_KEY), how="left_semi")
        return winners.select(*EVENTS.schema.fieldNames())

    def losers(self, arrived: DataFrame) -> DataFrame:
        keys = self.ranked.where(F.col("_new") & (F.col("_rank") > 1)).select(*COPY_KEY)
        return arrived.join(keys, on=list(COPY_KEY), how="left_semi")

    def displaced_keys(self) -> list[tuple[date, str, date]]:
        """Copies in `events` that lose to a new copy: few, so they come to the driver."""
        rows = (
            self.ranked.where(~F.col("_new") & (F.col("_rank") > 1))
            .select(*COPY_KEY)
            .orderBy(*COPY_KEY)
            .collect()
        )
        return [(r.event_date, r.event_id, r.received_date) for r in rows]


def _new_winner() -> Column:
    return F.col("_new") & (F.col("_rank") == 1)


def _rank_new_copies(store: DeltaStore, arrived: DataFrame) -> _NewCopies:
    ranking = ["event_date", "event_id", *WINNER_ORDER]
    # Of `events`, only the ranking columns of the ids that arrived again, found by id.
    wanted = arrived.select("event_date", "event_id")
    lookup = read_by_keys(store, EVENTS, wanted=wanted, key="event_id", columns=ranking)
    # Read once: it is both excluded from the new copies and ranked with them.
    present = lookup.rows.persist(StorageLevel.MEMORY_AND_DISK)
    # A copy already in `events` was absorbed by an earlier attempt: it is not new.
    fresh = arrived.select(*ranking).join(
        present.select(*COPY_KEY), on=list(COPY_KEY), how="left_anti"
    )
    contenders = fresh.withColumn("_new", F.lit(True)).unionByName(
        present.withColumn("_new", F.lit(False))
    )
    order = Window.partitionBy("event_date", "event_id").orderBy(*WINNER_ORDER)
    ranked = contenders.withColumn("_rank", F.row_number().over(order)).select(
        *COPY_KEY, "_new", "_rank"
    )
    outcome = ranked.where(F.col("_new") | (F.col("_rank") > 1))
    return _NewCopies(outcome.persist(StorageLevel.MEMORY_AND_DISK), lookup, present)


def _copies(spark: SparkSession, keys: list[tuple[date, str, date]]) -> DataFrame:
    """A small frame of COPY_KEY rows."""
    schema = "event_date date, event_id string, received_date date"
    return spark.createDataFrame(keys, schema).hint("broadcast")


def _displaced_rejections(
    store: DeltaStore, spark: SparkSession, displaced: list[tuple[date, str, date]]
) -> DataFrame:
    """Rejection rows for displaced copies, with their raw lines from their own batch."""
    raw = raw_to_candidates(store.read(RAW_EVENTS, partitions={r for _, _, r in displaced}))
    return duplicate_rejections(
        raw.join(_copies(spark, displaced), on=list(COPY_KEY), how="left_semi")
    )


@dataclass(frozen=True)
class _Recomputed:
    """Dates recomputed from all their batches: the difference to commit."""

    added: DataFrame  # rows to add (all winners when replacing whole dates)
    removed_keys: DataFrame  # COPY_KEY of rows to drop
    losers: DataFrame  # every losing copy of these dates
    kept: DataFrame | None = None  # persisted: unpersist after the commits


def _recomputed(
    store: DeltaStore, spark: SparkSession, inputs: Inputs, *, dates: list[date], replace: bool
) -> _Recomputed:
    columns = EVENTS.schema.fieldNames()
    candidates = _read_raw(store, spark, inputs)
    if not dates:
        empty = candidates.limit(0)
        return _Recomputed(
            added=empty.select(*columns), removed_keys=_copies(spark, []), losers=empty
        )
    # Few copies lose: their keys are found once (narrow columns) and kept, and matched to the
    # wide rows by broadcast when they fit, so those rows are not shuffled for it.
    losing = losing_copies(candidates).persist(StorageLevel.MEMORY_AND_DISK)
    matched = F.broadcast(losing) if losing.count() <= BROADCAST_LOSING_COPIES else losing
    winners, losers = split_copies(candidates, matched)
    winners = winners.select(*columns)
    if replace:
        return _Recomputed(
            added=winners, removed_keys=_copies(spark, []), losers=losers, kept=losing
        )
    current = store.read(EVENTS, partitions=dates)
    return _Recomputed(
        added=winners.exceptAll(current),
        removed_keys=current.exceptAll(winners).select(*COPY_KEY),
        losers=losers,
        kept=losing,
    )
