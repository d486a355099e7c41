"""Every user's lifecycle restated from the start date, by Spark: the first run, or a run whose
`sessions` history since the absorbed version is gone. The same rule (`restate_intervals`)
runs on the executors.
"""

from __future__ import annotations

from datetime import date

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import functions as F

from sessionize_assets.lake.placement import shuffle_partitions
from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import SESSIONS, USER_LIFECYCLE_STATE
from sessionize_assets.partitions import days_between
from sessionize_assets.pipeline.keyed_reads import files_for_pairs, keys_for_join
from sessionize_assets.pipeline.lifecycle.bookkeeping import (
    IntervalCommit,
    LifecycleReport,
)
from sessionize_assets.pipeline.touched import PAIR
from sessionize_assets.transforms.lifecycle import (
    INTERVAL_COLUMNS,
    INTERVAL_SCHEMA,
    restate_intervals,
)


def restate_everyone(
    store: DeltaStore,
    report: LifecycleReport,
    commit: IntervalCommit,
    *,
    start: date,
    as_of: date,
) -> None:
    """Every user restated from the start date, by Spark; only the rows that differ from the
    table are committed."""
    session_days = store.read(SESSIONS, partitions=days_between(start, as_of)).select(*PAIR)
    buckets = shuffle_partitions(session_days)

    def restate(group: pa.Table) -> pa.Table:
        users = pc.unique(group.column("user_id"))
        return restate_intervals(
            balances=pa.table(
                {
                    "user_id": users,
                    "anchor": pa.array([start] * len(users), pa.date32()),
                    "prior_state": pa.nulls(len(users), pa.string()),
                    "prior_from": pa.nulls(len(users), pa.date32()),
                }
            ),
            session_days=group,
            as_of=as_of,
        )

    new = (
        session_days.withColumn("_bucket", F.abs(F.hash("user_id")) % buckets)
        .groupBy("_bucket")
        .applyInArrow(restate, INTERVAL_SCHEMA)
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    old = store.read(USER_LIFECYCLE_STATE).persist(StorageLevel.MEMORY_AND_DISK)
    removed = old.join(new, on=INTERVAL_COLUMNS, how="left_anti").persist(
        StorageLevel.MEMORY_AND_DISK
    )
    added = new.join(old, on=INTERVAL_COLUMNS, how="left_anti").persist(
        StorageLevel.MEMORY_AND_DISK
    )
    frames = [new, old, removed, added]
    try:
        # One job computes (and caches) both sides while their inputs are cached.
        stats = (
            removed.select("user_id", F.lit(-1).alias("sign"))
            .unionByName(added.select("user_id", F.lit(1).alias("sign")))
            .unionByName(new.select("user_id", F.lit(0).alias("sign")))
            .agg(
                F.count(F.when(F.col("sign") > 0, 1)),
                F.count(F.when(F.col("sign") < 0, 1)),
                F.countDistinct(F.when(F.col("sign") != 0, F.col("user_id"))),
                F.countDistinct(F.when(F.col("sign") == 0, F.col("user_id"))),
            )
            .first()
        )
        assert stats is not None  # an aggregate has one row
        (
            report.intervals_added,
            report.intervals_removed,
            report.users_changed,
            report.users_restated,
        ) = stats
        partitions, files = files_for_pairs(
            store, USER_LIFECYCLE_STATE, pairs=removed, key="user_id"
        )
        done = store.rewrite(
            USER_LIFECYCLE_STATE,
            partitions=partitions,
            drop_keys=keys_for_join(removed, rows=report.intervals_removed)
            if report.intervals_removed
            else None,
            files=files,
            add=lambda: added,
            commit_metadata=commit.tags,
            app_transaction=commit.mark,
            read_version=commit.read_version,
        )
    finally:
        for frame in frames:
            frame.unpersist()
    report.state_rows_written = done.rows_written
    report.state_files_rewritten = done.files_removed
