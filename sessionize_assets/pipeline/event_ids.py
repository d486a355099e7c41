"""The id index (`event_ids`): where every copy of a messageId is, whatever its event date.

SPEC §2's winner among the copies of one messageId is the copy in the earliest received batch,
on whatever date each copy's timestamp puts it (a client that re-stamps a retry, an id reused
by a server library). So the duplicate rule needs, for each id a run settles, every copy of it
in every batch. `event_ids` holds one row per valid copy (ingestion keeps one per batch),
partitioned by batch like `raw_events` and written by the same ingest run, right after it.

A lookup does not depend on how many dates the copies are spread over: it reads the 8-byte
`id_hash` column of every batch, joined with the ids' hashes, which names the copies that can
match; only the batches holding one are then read for their `event_id`s, matched exactly (a
hash collision matches nothing). That first read is the one cost that grows with the history,
at 8 bytes a copy (160 MB for 20 M events), in one Spark job, or on the driver with Arrow for
a daily batch's copies (`other_copies_on_driver`); a layout by hash bucket would not shrink it
for a daily batch, whose ids fall in every bucket.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import BATCH_EVENT_DATES, EVENT_IDS, RAW_EVENTS
from sessionize_assets.pipeline.keyed_reads import keys_for_join, rows_with_values
from sessionize_assets.transforms.events import COPY_KEY, Copy, copies_in
from sessionize_assets.transforms.id_hash import xxhash64


def id_hash(column: str) -> Column:
    """The index's `id_hash` of an id column: Spark's `xxhash64` (`transforms.id_hash` computes
    the same on the driver)."""
    return F.xxhash64(column)


def index_rows(accepted: DataFrame) -> DataFrame:
    """The `event_ids` rows of a batch's accepted raw rows."""
    return accepted.select(
        id_hash("message_id").alias("id_hash"),
        F.col("message_id").alias("event_id"),
        "event_date",
        "received_date",
    )


@dataclass(frozen=True)
class Contested:
    """The ids with copies in more than one batch, among those a run holds or settles."""

    copies: dict[str, set[Copy]]  # every copy of each such id
    held: set[Copy]  # of those, the copies the caller holds


def other_copies(store: DeltaStore, held: DataFrame, *, rows: int) -> Contested:
    """The ids of `held` that have a copy in another batch than the caller's, with all their
    copies, on the driver.

    `held` has COPY_KEY columns: the copies the caller holds, or an id with nulls for one it
    holds no copy of (then every copy of it is another); `rows` is at least its row count
    (the caller knows it from the manifests). In a daily batch most ids have no other copy
    and are left out; those that do are few. Two small Spark jobs: the hash matches, then
    their ids, read from the batches holding a match only.

    The held ids are broadcast to the index's scan up to `keyed_reads.BROADCAST_KEYS` rows (a
    daily batch: the index is not shuffled); a backlog's are joined by sort-merge, which
    spills, whatever Spark estimates from the files' sizes.
    """
    mine = held.select(
        id_hash("event_id").alias("id_hash"),
        F.col("event_id").alias("_id"),
        F.col("event_date").alias("_held_date"),
        F.col("received_date").alias("_held_in"),
    )
    mine = keys_for_join(mine, rows=rows)
    matches = (
        store.read(EVENT_IDS)
        .select("id_hash", "event_date", "received_date")
        .join(mine, on="id_hash")
        .where(F.col("_held_in").isNull() | (F.col("received_date") != F.col("_held_in")))
        .distinct()
        .collect()
    )
    if not matches:
        return Contested(copies={}, held=set())
    # A hash match is a copy of the id only if its event_id is the id itself.
    # Sent to the JVM in one call (`isin_texts`), not a literal at a time: 2.8 s for the 6,915
    # hashes of the mid-size backlog; a backlog's many, as a join (`rows_with_values`).
    hashes = sorted({row["id_hash"] for row in matches})
    found = {
        (row["event_date"], row["event_id"], row["received_date"])
        for row in rows_with_values(
            store.read(EVENT_IDS, partitions={row["received_date"] for row in matches}),
            hashes,
            column="id_hash",
            data_type="bigint",
        )
        .select(*COPY_KEY)
        .collect()
    }
    copies: dict[str, set[Copy]] = {}
    mine_held: set[Copy] = set()
    for row in matches:
        copy = (row["event_date"], row["_id"], row["received_date"])
        if copy not in found:
            continue
        copies.setdefault(row["_id"], set()).add(copy)
        if row["_held_in"] is not None:
            mine_held.add((row["_held_date"], row["_id"], row["_held_in"]))
    for copy in mine_held:
        copies[copy[1]].add(copy)
    return Contested(copies=copies, held=mine_held)


def other_copies_on_driver(store: DeltaStore, held: Iterable[Copy]) -> Contested:
    """`other_copies` of copies the driver lists (a daily batch's), with Arrow: the index's
    hash, date and batch of the rows whose hash is a held id's, filtered as the files are
    read; then the ids of those rows, from the batches holding one in another batch than a
    held copy of its id, matched exactly. No Spark job; the driver holds the matches only."""
    held_of: dict[str, set[Copy]] = {}
    for copy in held:
        held_of.setdefault(copy[1], set()).add(copy)
    batches_of: dict[int, set[date]] = {}
    for event_id, of_id in held_of.items():
        batches_of.setdefault(xxhash64(event_id), set()).update(r for _, _, r in of_id)
    if not batches_of:
        return Contested(copies={}, held=set())
    matches = store.read_arrow(
        EVENT_IDS,
        columns=["id_hash", "received_date"],
        where=pc.field("id_hash").isin(pa.array(sorted(batches_of), pa.int64())),
    )
    elsewhere = {
        received
        for id_hash, received in zip(
            matches.column("id_hash").to_pylist(),
            matches.column("received_date").to_pylist(),
            strict=True,
        )
        if batches_of[id_hash] != {received}
    }
    if not elsewhere:
        return Contested(copies={}, held=set())
    rows = store.read_arrow(
        EVENT_IDS,
        partitions=sorted(elsewhere),
        columns=list(COPY_KEY),
        where=pc.field("event_id").isin(pa.array(sorted(held_of), pa.string())),
    )
    copies: dict[str, set[Copy]] = {}
    mine: set[Copy] = set()
    for copy in copies_in(rows):
        ours = {h for h in held_of[copy[1]] if h[2] != copy[2]}
        if ours:  # a copy in another batch than one the caller holds
            copies.setdefault(copy[1], set()).add(copy)
            mine |= ours
    for copy in mine:
        copies[copy[1]].add(copy)
    return Contested(copies=copies, held=mine)


@dataclass(frozen=True)
class IdCopies:
    """Every copy of some ids, and the batches of the index that were read to find them."""

    rows: DataFrame  # COPY_KEY
    batches: list[date]


def copies_of(store: DeltaStore, ids: DataFrame) -> IdCopies:
    """Every copy, in every batch ingested, of the ids in `ids` (an `event_id` column), as a
    lazy frame: for many ids (a rebuild, a check), where `other_copies` would bring too much to
    the driver. One Spark job brings the batches holding a hash match to the driver; the rows
    are read from those batches only. Persist `ids`: it is read twice.
    """
    wanted = ids.select("event_id").distinct()
    hashes = wanted.select(id_hash("event_id").alias("id_hash"))
    holding = sorted(
        row[0]
        for row in store.read(EVENT_IDS)
        .select("id_hash", "received_date")
        .join(hashes, on="id_hash", how="left_semi")
        .select("received_date")
        .distinct()
        .collect()
    )
    rows = (
        store.read(EVENT_IDS, partitions=holding)
        .select(*COPY_KEY)
        .join(wanted, on="event_id", how="left_semi")
    )
    return IdCopies(rows=rows, batches=holding)


def index_copies(store: DeltaStore, ids: Iterable[str]) -> set[Copy]:
    """Every copy of `ids` in the index (COPY_KEY), on the driver: for a small run's ids (its
    check), where `copies_of` would make a frame of them. The index's `id_hash`, `event_date`
    and batch are read with Arrow, filtered by the ids' hashes (`transforms.id_hash`, as
    Spark computes them) as the files are read: no Spark job, and the driver holds the matches
    only. (With Spark, a mid-size daily batch's 32,000 ids took about 5 s: the job, and their
    hash set sent to it; a full-size batch's 128,000 take 2.3 s here, of a 20 M-row index.)

    Matched by hash only: an id whose hash another id's copy shares is given that copy's date
    and batch too, where the caller finds nothing unless the id is there.
    """
    by_hash: dict[int, list[str]] = {}
    for event_id in sorted(set(ids)):
        by_hash.setdefault(xxhash64(event_id), []).append(event_id)
    if not by_hash:
        return set()
    copies = store.read_arrow(
        EVENT_IDS,
        columns=["id_hash", "event_date", "received_date"],
        where=pc.field("id_hash").isin(pa.array(sorted(by_hash), pa.int64())),
    )
    return {
        (event_date, event_id, received_date)
        for id_hash, event_date, received_date in zip(
            copies.column("id_hash").to_pylist(),
            copies.column("event_date").to_pylist(),
            copies.column("received_date").to_pylist(),
            strict=True,
        )
        for event_id in by_hash[id_hash]
    }


def index_missing_batches(store: DeltaStore, *, run_id: str) -> list[date]:
    """Write the index of every batch the received -> event index lists but `event_ids` lacks
    (a lake written before the id index existed), from `raw_events`; returns those batches.

    Both indexes are written by the ingest run, `event_ids` first, so on a lake written since
    this is a comparison of two Delta logs and reads no data.
    """
    indexed = set(store.row_counts(EVENT_IDS))
    missing = sorted(
        day
        for day in {date.fromisoformat(d) for d in store.row_counts(BATCH_EVENT_DATES)}
        if day.isoformat() not in indexed
    )
    if missing:
        store.replace_partitions(
            EVENT_IDS,
            index_rows(store.read(RAW_EVENTS, partitions=missing)),
            partitions=missing,
            commit_metadata={"dagster_run_id": run_id, "table": EVENT_IDS.name},
        )
    return missing
