"""How an events run settles ids into a change: its copies read from raw, each contested id
settled on the driver against every copy the id index holds (or, with `full_refresh`, every
requested date replaced by its winners), as the rows to add and drop in `events` and
`rejected_events`. The module docstring of `pipeline/events` states the rule."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import date
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.lake.fingerprints import partitions_differing
from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import EVENTS, RAW_EVENTS, REJECTED_EVENTS
from sessionize_assets.pipeline.event_ids import (
    Contested,
    copies_of,
    other_copies,
    other_copies_on_driver,
)
from sessionize_assets.pipeline.keyed_reads import (
    isin_texts,
    pair_filter,
    pair_keys,
    pair_texts,
    rows_with_keys,
    rows_with_values,
)
from sessionize_assets.pipeline.manifests import (
    Inputs,
)
from sessionize_assets.transforms.events import (
    COPY_KEY,
    Contest,
    Copy,
    copies_in,
    duplicate_rejections,
    mark_winners,
    raw_to_candidates,
    rejection_keys,
)

# The most copies a run lists on the driver to look their ids up in the id index there
# (`held_on_driver`): a daily batch's, up to the full size's (100,000-130,000).
HELD_ON_DRIVER = 200_000
# Recomputing dates from raw: up to this many losing copies are matched to the rows by
# broadcast (about 60 bytes each); more are joined by shuffle.
BROADCAST_LOSING_COPIES = 500_000


def read_raw(store: DeltaStore, inputs: Inputs) -> DataFrame:
    """The raw copies behind these inputs, in the shape of `events` plus the raw line."""
    dates_of = _dates_by_batch(inputs)
    raw = store.read(RAW_EVENTS, partitions=dates_of)
    return raw_to_candidates(raw.where(_per_batch("event_date", dates_of)) if dates_of else raw)


def _dates_by_batch(inputs: Inputs) -> dict[date, set[date]]:
    """The event dates of these inputs, by batch."""
    dates_of: dict[date, set[date]] = {}
    for event_date, received_date in inputs:
        dates_of.setdefault(received_date, set()).add(event_date)
    return dates_of


def _per_batch(column: str, values: dict[date, set]) -> Column:
    """Rows whose `column` is one of the values listed for their batch: a filter, no join.

    The values' own IN goes to the Parquet reader (row group statistics); the (batch, value)
    pairs are one flat IN over their text (`keyed_reads.pair_filter`), so the expression's
    depth does not grow with the number of batches (a backlog's 59 batches as a chain of ORs
    was deeper than Spark Connect's plan message carries)."""
    pairs = [(received, value) for received, wanted in values.items() for value in wanted]
    listed = isin_texts(F.col(column), {value for _, value in pairs})
    return listed & pair_filter(pairs, partition="received_date", key=column)


def _copies(rows: DataFrame, copies: Collection[Copy], *, keep: bool = True) -> DataFrame:
    """The rows of `rows` that are one of these copies (`keep`), or the others. One copy per
    (id, batch) makes (`event_id`, `received_date`) its key. A filter for a few copies, a
    join for many (`keyed_reads.rows_with_keys`)."""
    return rows_with_keys(
        rows,
        {(event_id, received_date) for _, event_id, received_date in copies},
        schema="event_id string, received_date date",
        keep=keep,
        listed=lambda: _is_copy(copies),
    )


def _is_copy(copies: Collection[Copy]) -> Column:
    """Rows (`event_id`, `received_date`) that are one of these copies: a filter, no join."""
    ids_by_batch: dict[date, set[str]] = {}
    for _, event_id, received_date in copies:
        ids_by_batch.setdefault(received_date, set()).add(event_id)
    return _per_batch("event_id", ids_by_batch)


@dataclass(frozen=True, kw_only=True)
class DriverFiles:
    """The live files holding the copies a change made on the driver drops, in each table
    (what `rewrite_arrow` searches)."""

    events: list[str]
    rejections: list[str]


@dataclass(kw_only=True)
class EventsChange:
    """What one run commits: rows to add and keys to drop, in `events` and `rejected_events`.
    Spark frames, or Arrow rows made on the driver (`on_driver`, `pipeline/events_on_driver`)."""

    events_add: DataFrame | pa.Table  # rows in the shape of `events`
    events_drop: list[Copy]
    rejections_add: DataFrame | pa.Table | None  # rows in the shape of `rejected_events`
    rejections_drop: list[Copy]  # duplicate rejections to remove, by copy
    on_driver: DriverFiles | None = None
    # Duplicate rejections removed whole: (batches, event dates) of the recomputed dates.
    rejections_replaced: tuple[list[date], list[date]] | None = None
    # `full_refresh`: these dates become `events_add` whole (None: rows added and dropped).
    replaced: list[date] | None = None
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


def held_on_driver(store: DeltaStore, inputs: Inputs, *, rows: int) -> set[Copy] | None:
    """The copies behind these inputs (COPY_KEY), read from raw with Arrow, when they are at
    most HELD_ON_DRIVER (`rows`, the index's count of them); None otherwise."""
    if rows > HELD_ON_DRIVER:
        return None
    return set(copies_in(raw_on_driver(store, inputs, columns=list(COPY_KEY))))


def raw_on_driver(store: DeltaStore, inputs: Inputs, *, columns: Sequence[str]) -> pa.Table:
    """`columns` of the raw copies behind these inputs, read with Arrow, in the shape of
    `events` (`message_id` named `event_id`): the batches' partitions, filtered to the inputs'
    event dates as the files are read, then to each batch's own."""
    dates_of = _dates_by_batch(inputs)
    names = in_raw(columns)
    if not dates_of:
        return store.read_arrow(RAW_EVENTS, partitions=[], columns=names).rename_columns(columns)
    raw = store.read_arrow(
        RAW_EVENTS,
        partitions=sorted(dates_of),
        columns=sorted({*names, "event_date", "received_date"}),
        where=pc.field("event_date").isin(
            pa.array(sorted(set().union(*dates_of.values())), pa.date32())
        ),
    )
    wanted = pair_texts((r, d) for r, dates in dates_of.items() for d in dates)
    raw = raw.filter(
        pc.is_in(
            pair_keys(raw, partition="received_date", key="event_date"),
            value_set=pa.array(wanted, pa.string()),
        )
    )
    return raw.select(names).rename_columns(columns)


def in_raw(columns: Sequence[str]) -> list[str]:
    """The names in `raw_events` of these columns of `events` (and `raw_line`)."""
    return ["message_id" if name == "event_id" else name for name in columns]


def settle(
    store: DeltaStore,
    spark: SparkSession,
    own: DataFrame,
    *,
    recompute: list[date],
    involved: list[date],
    new_rows: int,
    held_rows: int,
    listed: set[Copy] | None = None,
) -> EventsChange:
    """The change that settles every id of `own` (this run's copies) and of the recomputed
    dates against every copy of those ids (see the module docstring). `new_rows` is the rows
    of `own` off the recomputed dates; `held_rows` at least the ids settled (`own`'s rows
    and the recomputed dates' rows in `events`). `listed`, `own`'s copies listed on the
    driver (`held_on_driver`; with no recomputed date only), has their other copies found
    there."""
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
    contest = _contest(
        store,
        other_copies(store, mine, rows=held_rows)
        if listed is None or recompute
        else other_copies_on_driver(store, listed),
    )
    settled = contest.settle(recompute)

    # This run's winners elsewhere than the recomputed dates: appended, all but those already
    # there and those that lose.
    kept_out = settled.lose | settled.present
    appended = own.where(~on_recomputed)
    if kept_out:
        appended = _copies(appended, kept_out, keep=False)
    foreign = sorted(settled.promote | (settled.reject - contest.own))
    foreign_rows = _raw_copies(store, foreign).persist(StorageLevel.MEMORY_AND_DISK)
    events_add = appended.unionByName(
        _copies(foreign_rows, settled.promote) if settled.promote else foreign_rows.limit(0)
    ).select(*EVENTS.schema.fieldNames())
    events_drop = set(settled.drop)
    added = new_rows - len(kept_out & _not_on(contest.own, recompute)) + len(settled.promote)
    if recompute:
        # The recomputed dates hold their winners, row for row.
        wanted = own.where(on_recomputed)
        losing_here = settled.lose - _not_on(settled.lose, recompute)
        if losing_here:
            wanted = _copies(wanted, losing_here, keep=False)
        wanted = wanted.select(*EVENTS.schema.fieldNames())
        to_add = wanted.exceptAll(current)
        to_drop = current.exceptAll(wanted)
        diff = _collect_copies(drop=to_drop, add=to_add)
        events_drop |= diff["drop"]
        if diff["drop"]:
            # A key is dropped with every row holding it: one both dropped and wanted (an
            # extra copy of a row, left by writers that raced) is written again, once.
            to_add = _copies(to_add, diff["drop"], keep=False).unionByName(
                _copies(wanted, diff["drop"])
            )
        events_add = events_add.unionByName(to_add)
        added += len(diff["add"])
    reject_rows = _copies(own.unionByName(foreign_rows), settled.reject)
    return EventsChange(
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
        rows_with_values(
            store.read(EVENTS, partitions={d for d, _, _ in everywhere}),
            ids,
            column="event_id",
            data_type="string",
        )
        .select(*COPY_KEY, F.lit("events").alias("_in"))
        .unionByName(
            rows_with_values(
                rejection_keys(
                    store.read(REJECTED_EVENTS, partitions={r for _, _, r in everywhere})
                ),
                ids,
                column="event_id",
                data_type="string",
            ).select(*COPY_KEY, F.lit("rejected").alias("_in"))
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


def keys_frame(spark: SparkSession, copies: list[Copy]) -> DataFrame:
    """A small frame of COPY_KEY rows (what a commit drops by key)."""
    return spark.createDataFrame(copies, "event_date date, event_id string, received_date date")


def _raw_copies(store: DeltaStore, copies: list[Copy]) -> DataFrame:
    """The raw rows (shape of `events` plus the line) of these copies, from their batches."""
    raw = raw_to_candidates(store.read(RAW_EVENTS, partitions={r for _, _, r in copies}))
    return _copies(raw, copies) if copies else raw


def replace_dates(
    store: DeltaStore,
    own: DataFrame,
    *,
    dates: list[date],
    involved: list[date],
    every_copy: bool = False,
) -> EventsChange:
    """`full_refresh`: the requested dates hold exactly their winners, against every copy;
    the duplicate rejections of those dates in the `involved` batches are written again.
    A date whose winners `events` holds already is not written (`partitions_differing`, one
    job): a rebuild whose rules changed nothing writes no event.

    `every_copy`: `own` holds every copy of its ids (the dates are every date the
    received -> event index lists: a rebuild of the whole history). The winners are then
    found from `own`'s narrow columns in one pass, as the floor's script finds them, and the
    id index is not read (two jobs over all of it, and a join of every copy with its id)."""
    keep = StorageLevel.MEMORY_AND_DISK
    persisted: list[DataFrame] = []
    if every_copy:
        copies, index_batches = own.select(*COPY_KEY), []
    else:
        ids = own.select("event_id").distinct().persist(keep)
        index = copies_of(store, ids)
        copies, index_batches = index.rows, index.batches
        persisted.append(ids)
    # Raw rows are wide and few copies lose: the losing keys are found on narrow columns and
    # matched to the rows by broadcast when they fit, so the rows are not shuffled for it.
    losing = (
        mark_winners(copies)
        .where(~F.col("wins") & F.col("event_date").isin(dates))
        .select(*COPY_KEY)
        .persist(keep)
    )
    persisted.append(losing)
    lost = losing.count()
    matched = F.broadcast(losing) if lost <= BROADCAST_LOSING_COPIES else losing
    winners = own.join(matched, on=list(COPY_KEY), how="left_anti").select(
        *EVENTS.schema.fieldNames()
    )
    # The dates whose winners `events` holds already are left as they are: a rebuild that
    # changes nothing writes no event, and one that changes a few dates writes those.
    replaced = partitions_differing(
        winners,
        store.read(EVENTS, partitions=dates) if store.exists(EVENTS) else None,
        spec=EVENTS,
        partitions=dates,
    )
    return EventsChange(
        events_add=winners.where(F.col("event_date").isin(replaced)),
        events_drop=[],
        rejections_add=duplicate_rejections(own.join(matched, on=list(COPY_KEY), how="left_semi")),
        rejections_drop=[],
        rejections_replaced=(sorted({*involved, *index_batches}), dates),
        replaced=replaced,
        dates_touched=set(dates),
        rejected=lost,
        persisted=persisted,
    )
