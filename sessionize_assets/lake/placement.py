"""Where a write's rows are turned into Parquet files: on the driver or on Spark's executors.

A light module of its own, so that `settings` reads the default without importing Spark.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sessionize_assets.resources.spark import SHUFFLE_PARTITIONS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from sessionize_assets.lake.store import TableSpec

# The embedded backend collects a write whose plan Spark's optimizer estimates at most this
# size (bytes of its inputs) with Arrow and writes it from the driver
# (`Settings.driver_write_bytes`, `DeltaRsTables._stage`). The rows are then held in Python;
# Spark's heap holds a partition at a time (`COLLECTED_BYTES_PER_PARTITION`). What 32 MiB
# saves and costs, measured: docs/storage.md.
DEFAULT_DRIVER_WRITE_BYTES = 32 << 20

# A write collected to the driver comes over a partition at a time, and Spark's task builds
# each partition's Arrow rows whole, in the driver's heap, several times its Parquet bytes:
# past this much estimated input a partition, the rows are spread over more partitions
# before they are collected (`spread_for_collect`).
COLLECTED_BYTES_PER_PARTITION = 8 << 20

# A write by Spark's executors sorts each task's rows (`laid_out`). Past this much of Spark's
# estimate (its inputs' bytes) a task, the partition values are spread over more tasks than the
# shuffle's: in local mode a shuffle makes one partition per core, and the raw rows of a 59-day
# backlog (737 MB of text) were sorted about 310 MB a task with the default 1 GB driver, and
# spilled. At most WRITE_TASKS_AT_MOST tasks: the estimate of a plan above a join can be any
# size, and each task costs its scheduling.
ESTIMATED_BYTES_PER_WRITE_TASK = 32 << 20
WRITE_TASKS_AT_MOST = 64

# Spark reckons a source without statistics at `spark.sql.defaultSizeInBytes` (Long.MaxValue):
# sizes from here on are no estimate.
NO_ESTIMATE_FROM = 1 << 62
# The optimized plan's root size in an `explain("cost")` text (`Utils.bytesToString`).
_COST_SIZE = re.compile(r"Statistics\(sizeInBytes=([0-9.]+(?:E[+-]?[0-9]+)?) ?([KMGTPE]i)?B")
_UNITS = {None: 0, "Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}


def estimated_bytes(df: DataFrame) -> int | None:
    """The size Spark's optimizer reckons `df`'s plan at, from its inputs (files' sizes, a
    local relation's rows), with no job; None where it has no estimate (a source without
    statistics).

    Classic sessions read it from the plan in the JVM. A Spark Connect client has no JVM: it
    asks the server for the plan's cost explanation (one round trip, no job) and reads the
    root's size from it, rounded as Spark prints it (three significant digits), which is
    close enough to compare with a threshold.
    """
    java = getattr(df, "_jdf", None)
    if java is not None:
        size = int(java.queryExecution().optimizedPlan().stats().sizeInBytes())
    else:
        # Connect's DataFrame: typed through __getattr__ (a column), a method at run time.
        explained = df._explain_string(mode="cost")  # type: ignore[operator]
        optimized = explained.partition("== Optimized Logical Plan ==")[2]
        found = _COST_SIZE.search(optimized)
        if found is None:
            return None
        size = int(float(found.group(1)) * 1024 ** _UNITS[found.group(2)])
    return size if size < NO_ESTIMATE_FROM else None


def spread_for_collect(
    df: DataFrame,
    size: int,
    *,
    per_partition: int = COLLECTED_BYTES_PER_PARTITION,
    keys: Sequence[str] = (),
) -> DataFrame:
    """`df` over enough partitions that each holds at most `per_partition` of its `size`
    (bytes, as the caller reckons them), when the shuffle partitions would hold more; `df`
    itself otherwise (no shuffle added to a small write). Spread by `keys` when given (the
    keys the caller's next shuffle is by, so that it is the only one), round robin otherwise.
    """
    needed = -(-size // per_partition)
    if needed <= shuffle_partitions(df):
        return df
    return df.repartition(needed, *keys) if keys else df.repartition(needed)


def laid_out(spec: TableSpec, df: DataFrame) -> DataFrame:
    """`df` as Spark's executors write it: one task per partition value (several values a
    task), sorted, so that a value's files are consecutive ranges of `sort_by`; as many tasks
    as its estimated size needs (ESTIMATED_BYTES_PER_WRITE_TASK), the shuffle's at least."""
    tasks = shuffle_partitions(df)
    size = estimated_bytes(df)
    if size is not None:
        needed = -(-size // ESTIMATED_BYTES_PER_WRITE_TASK)
        tasks = max(tasks, min(needed, WRITE_TASKS_AT_MOST))
    return df.repartition(tasks, spec.partition_by).sortWithinPartitions(
        spec.partition_by, *spec.sort_by
    )


def shuffle_partitions(df: DataFrame) -> int:
    """The partitions a shuffle of `df`'s session makes (`spark.sql.shuffle.partitions`)."""
    return int(df.sparkSession.conf.get(SHUFFLE_PARTITIONS) or 0)
