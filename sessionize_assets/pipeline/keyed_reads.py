"""Reading a few rows of many partitions: the keys of a change, pushed down to Parquet.

A late batch adds a handful of events to many old dates. The duplicate rule must find the
copies of those few ids already in `events`, and sessions need the events of the few users a
change touched; reading those dates whole would cost what the history holds, not what
changed. So, per partition: with few wanted keys, the keys go to the Parquet reader as
`key IN (...)`, where row group statistics (`events` is sorted by user) and bloom filters (on
`event_id`) skip every row group that cannot hold one of them; with many (today's date), the
partition is read whole. Either way the rows are then matched exactly on (partition, key).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import date
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import SparkContext
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sessionize_assets.lake.store import DeltaStore, PartitionValue, TableSpec, ValuesByPartition
from sessionize_assets.sql_text import sql_identifier

# A partition with more wanted keys than this is read whole: the keys of a change are spread
# over the users, so a few already fall in most row groups (about 16 on a date of the full
# size, of 1,600 users each), and Parquet's test of a long IN list against each row group and
# page costs more than the rows it skips. The touched users of the full size's `uniform`
# dates, read with the session columns: pushed down (at the former bound of 1,000) 35-42 s
# at 17, 43 or 145 users a date, read whole and matched 11-13 s; at 2 a date, pushed down,
# 11.5 s against 18.4 s (docs/benchmarks.md, "Daily batches at the full size").
PUSHED_KEYS_PER_PARTITION = 8
# A key the files are not sorted by (an id, found by its bloom filters) is pushed down for a
# partition with at most this many: each random key lies in a row group of its own, so a few
# keys already keep most of a partition's row groups (about 16 for a date of the full size),
# and every row group tests every key of the shared IN list. A daily batch's 32,000 new ids
# over 60 dates (docs/benchmarks.md, the mid size) took 12 s to look up pushed down, 3.4 s as
# a hash set in the query; a full-size batch's 130,000 ids, about 40 a date on 180 dates,
# 18-20 s pushed down at 50 a partition, 11-15 s at 4 or 5 (docs/benchmarks.md, "Daily batches
# at the full size").
PUSHED_UNSORTED_KEYS_PER_PARTITION = 4
# The longest IN list one read pushes down (it is shared by the partitions it covers), and
# the most keys any query holds as a filter: past it, keys are a join (`rows_with_keys`).
PUSHED_KEYS_TOTAL = 20_000
# A frame of keys a run made or found is broadcast to its join up to this many rows (about 100
# bytes each in the hash table Spark builds for it on the driver, outside its memory manager:
# a range run's hundreds of thousands of (date, user) pairs would hold a good part of a 1 GB
# driver); more are joined by sort-merge, which spills (`keys_for_join`).
BROADCAST_KEYS = 200_000
# More (partition, key) pairs than this are not brought to the driver to choose files by their
# statistics (`keys_by_partition`): the caller searches those partitions whole.
PRUNING_PAIRS_LIMIT = 200_000
# From this many texts on, an IN list is built in the JVM from one joined string (a fixed
# seven round trips; a literal sent on its own costs four).
JVM_LIST_FROM = 3
# Joins the texts for the JVM: the first of these that no text holds.
_SEPARATORS = ("\x1f", "\x1e", "\x00", "\n")


@dataclass(frozen=True)
class KeyedRead:
    """Rows found, and how: the partitions searched by key and those read whole."""

    rows: DataFrame
    searched: list[str]  # partitions read with the keys pushed down
    keys_pushed: int
    scanned: list[str]  # partitions read whole


def read_by_keys(
    store: DeltaStore,
    spec: TableSpec,
    *,
    wanted: DataFrame | ValuesByPartition,
    key: str,
    columns: list[str],
) -> KeyedRead:
    """The rows (`columns`) of `spec` whose (partition column, `key`) is a row of `wanted`.

    `wanted` holds those two columns, or is already on the driver: the keys of each partition
    value (for about PUSHED_KEYS_TOTAL pairs at most). A frame is read twice: persist it.
    `columns` must include both. For a frame, one small Spark job brings each partition's key
    count to the driver, with the keys of those with few (at most PUSHED_KEYS_PER_PARTITION
    each, PUSHED_UNSORTED_KEYS_PER_PARTITION for a key the files are not sorted by): bounded
    by the change (and by PUSHED_KEYS_TOTAL); only partitions read whole are
    then matched by a join. Keys on the driver start no job: the partitions read whole are
    matched by a hash set of their pairs.
    """
    part = spec.partition_by
    pushed = (
        PUSHED_KEYS_PER_PARTITION
        if spec.sort_by[:1] == (key,)
        else PUSHED_UNSORTED_KEYS_PER_PARTITION
    )
    counts: list[dict[str, Any]]
    if isinstance(wanted, Mapping):
        listed = {value: sorted(set(keys)) for value, keys in wanted.items() if keys}
        counts = [
            {part: value, "count": len(keys), "keys": keys if len(keys) <= pushed else None}
            for value, keys in listed.items()
        ]
    else:
        wanted = wanted.select(part, key).distinct()
        few = F.count(F.lit(1)) <= pushed
        collected = (
            wanted.groupBy(part)
            .agg(F.count(F.lit(1)).alias("count"), F.when(few, F.collect_list(key)).alias("keys"))
            .collect()
        )
        counts = [row.asDict() for row in collected]
    searched: list[PartitionValue] = []
    pairs: list[tuple[PartitionValue, str]] = []
    budget = PUSHED_KEYS_TOTAL
    for row in sorted(counts, key=lambda r: (r["count"], r[part])):
        if row["count"] <= min(pushed, budget):
            searched.append(row[part])
            budget -= row["count"]
            pairs.extend((row[part], value) for value in row["keys"])
    scanned = sorted({row[part] for row in counts} - set(searched))
    keys = sorted({value for _, value in pairs})
    frames = []
    if searched:
        # The keys go to the Parquet reader; the exact pairs are a hash set in the query.
        frames.append(
            store.read(spec, partitions=searched)
            .select(*columns)
            .where(isin_texts(F.col(key), keys))
            .where(pair_filter(pairs, partition=part, key=key))
        )
    if scanned:
        whole = store.read(spec, partitions=scanned).select(*columns)
        if isinstance(wanted, Mapping):
            listed_pairs = [(value, k) for value in scanned for k in listed[value]]
            frames.append(whole.where(pair_filter(listed_pairs, partition=part, key=key)))
        else:
            frames.append(
                whole.join(wanted.where(F.col(part).isin(scanned)), on=[part, key], how="left_semi")
            )
    rows = (
        reduce(DataFrame.unionByName, frames)
        if frames
        else store.read(spec, partitions=[]).select(*columns)
    )
    return KeyedRead(
        rows=rows,
        searched=sorted(str(v) for v in searched),
        keys_pushed=len(keys),
        scanned=[str(v) for v in scanned],
    )


def isin_texts(column: Column, texts: Collection[str | int | date]) -> Column:
    """`column.isin(texts)`, built with a fixed number of driver round trips for texts and
    integers (other values, such as dates, go as `isin`'s literals).

    PySpark sends each literal of an IN list to the JVM on its own, four py4j round trips
    apiece: 20,000 keys cost seconds before the query even starts. From JVM_LIST_FROM texts on
    (and when a separator can join them), the texts travel as one string that the JVM splits
    and hands to `Column.isInCollection`: the same `In` expression, which the optimizer turns
    into the same hash set. Integers (the id index's hashes) go the same way, as their decimal
    text matched against the column's: a hash set of strings, where Parquet could not skip a
    row group for thousands of random values anyway. Spark Connect puts the list in its plan
    message: `isin` there.
    """
    values = sorted(set(texts))
    if len(values) >= JVM_LIST_FROM and all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        column, values = column.cast("string"), sorted(str(v) for v in values)
    strings = [v for v in values if isinstance(v, str)]
    context = SparkContext._active_spark_context
    java = getattr(column, "_jc", None)  # None on Spark Connect, which has no JVM here
    if len(values) < JVM_LIST_FROM or java is None or context is None or strings != values:
        return column.isin(values)
    separator = next((s for s in _SEPARATORS if not any(s in v for v in strings)), None)
    if separator is None:
        return column.isin(values)
    pattern = getattr(context._jvm, "java.util.regex.Pattern")
    # Sorted, the only empty text can be the first, which the split keeps (only trailing empty
    # strings are dropped).
    listed = pattern.compile(pattern.quote(separator)).splitAsStream(separator.join(strings))
    return Column(java.isInCollection(listed.toList()))


def rows_with_keys(
    rows: DataFrame,
    keys: Collection[tuple[Any, ...]],
    *,
    schema: str,
    keep: bool = True,
    listed: Callable[[], Column],
) -> DataFrame:
    """The rows of `rows` whose key columns (`schema`, a DDL string naming them) hold one of
    `keys` (`keep`), or none of them.

    Up to PUSHED_KEYS_TOTAL keys, the filter `listed()` builds (a hash set in the query, which
    starts no job). More are a left semi or anti join with a frame of the keys made on the
    driver (`keys_for_join`: broadcast, one Spark job, up to BROADCAST_KEYS): a filter holds
    an expression per key, about 800 bytes with its call site, in the query's plans and again
    in every task's binary, all on the driver's heap outside Spark's memory manager. A range of
    89 days at the bench's full size held 373,000 such literals, a third of the 1 GB default
    driver, when it ran out of memory (docs/spark.md, "Memory")."""
    if len(keys) <= PUSHED_KEYS_TOTAL:
        test = listed()
        return rows.where(test if keep else ~test)
    frame = rows.sparkSession.createDataFrame(list(keys), schema)
    return rows.join(
        keys_for_join(frame, rows=len(keys)),
        on=frame.columns,
        how="left_semi" if keep else "left_anti",
    )


def keys_for_join(keys: DataFrame, *, rows: int) -> DataFrame:
    """`keys` (`rows` of them) as the small side of a join: broadcast up to BROADCAST_KEYS rows,
    so the other side is not shuffled; past them a sort-merge join, which spills, whatever
    Spark estimates from the files' sizes. The hint holds through the frame's later selects and
    `distinct` (`DeltaStore.rewrite`'s `drop_keys` are joined so)."""
    return F.broadcast(keys) if rows <= BROADCAST_KEYS else keys.hint("merge")


def rows_with_values(
    rows: DataFrame, values: Collection[str | int], *, column: str, data_type: str
) -> DataFrame:
    """The rows of `rows` whose `column` (of the SQL type `data_type`) holds one of `values`:
    `isin_texts` for up to PUSHED_KEYS_TOTAL, a broadcast join past them (`rows_with_keys`)."""
    return rows_with_keys(
        rows,
        [(value,) for value in set(values)],
        schema=f"{sql_identifier(column)} {data_type}",
        listed=lambda: isin_texts(F.col(column), values),
    )


def pair_texts(pairs: Iterable[tuple[PartitionValue, str | date]]) -> list[str]:
    """The text `pair_filter` matches a (date, key) pair by: `date|key`."""
    return [f"{day}|{value}" for day, value in pairs]


def pair_keys(rows: pa.Table, *, partition: str, key: str) -> pa.ChunkedArray:
    """Each row's (`partition`, `key`) as `pair_texts` writes a pair: `date|key`, to match
    Arrow rows with `pc.is_in` (Arrow's joins take no struct columns, and events have two)."""
    return pc.binary_join_element_wise(
        pc.cast(rows[partition], pa.string()), pc.cast(rows[key], pa.string()), "|"
    )


def pair_filter(
    pairs: Iterable[tuple[PartitionValue, str | date]], *, partition: str, key: str
) -> Column:
    """Whether a row's (`partition`, `key`) is one of `pairs`: a hash set of their text
    (`date|key`: a date's text has no `|`; a date key is its ISO text too) in the query, where
    a join with a frame of them would be a broadcast job of its own. One flat IN however many
    partitions the pairs span (an OR per partition nests as deep as there are partitions,
    past what Spark Connect's plan message carries). For up to PUSHED_KEYS_TOTAL pairs."""
    texts = pair_texts(pairs)
    pair = F.expr(
        f"concat_ws('|', CAST({sql_identifier(partition)} AS STRING), "
        f"CAST({sql_identifier(key)} AS STRING))"
    )
    return isin_texts(pair, texts)


def files_for_pairs(
    store: DeltaStore, spec: TableSpec, *, pairs: DataFrame, key: str
) -> tuple[list[PartitionValue], list[str] | None]:
    """The partitions of `pairs` ((partition column, `key`) rows), and the files of them whose
    log statistics can hold their keys: for a table written sorted by `key`, a few files of
    each partition, chosen without opening any. The files are None past PRUNING_PAIRS_LIMIT
    pairs: the caller then takes those partitions whole. One small Spark job (two past the
    limit) brings the pairs to the driver.
    """
    part = spec.partition_by
    by_partition = keys_by_partition(pairs, partition=part, key=key, limit=PRUNING_PAIRS_LIMIT)
    if by_partition is None:
        return sorted(r[0] for r in pairs.select(part).distinct().collect()), None
    files = store.files_with_values(spec, column=key, values=by_partition)
    return sorted(by_partition), files


def read_pairs(store: DeltaStore, spec: TableSpec, *, pairs: DataFrame, key: str) -> DataFrame:
    """The rows of `spec` whose (partition column, `key`) is a row of `pairs`, read from the
    files `files_for_pairs` chooses. Persist `pairs`, it is read twice."""
    partitions, files = files_for_pairs(store, spec, pairs=pairs, key=key)
    rows = (
        store.read(spec, partitions=partitions) if files is None else store.read_files(spec, files)
    )
    part = spec.partition_by
    return rows.join(pairs.select(part, key).distinct(), on=[part, key], how="left_semi")


def keys_by_partition(
    pairs: DataFrame, *, partition: str, key: str, limit: int
) -> dict[date, list[str]] | None:
    """The distinct `key` values of each `partition` value, on the driver, to choose files by
    their log statistics (`DeltaStore.files_with_values`); None when there are more than
    `limit` pairs (the caller then reads the partitions whole)."""
    # The limit under a repartition runs as one job: collected directly, a limit is Spark's
    # `take`, which scans the partitions a few at a time, one job for each round.
    rows = pairs.select(partition, key).distinct().limit(limit + 1).repartition(1).collect()
    if len(rows) > limit:
        return None
    found: dict[date, list[str]] = {}
    for row in sorted(rows, key=lambda r: (r[0], r[1])):
        found.setdefault(row[0], []).append(row[1])
    return found
