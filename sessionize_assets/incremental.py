"""Bookkeeping of what each asset partition has absorbed (Snowplow-style manifests).

An input is one batch's rows for one event date: (event_date, received_date) at the
raw_events version that wrote the batch. Comparing what is available with what a partition
has absorbed says exactly what to do: new inputs are read incrementally; an absorbed input
that changed or vanished (a re-delivered batch) forces a recompute of that partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import BATCH_EVENT_DATES, INCREMENTAL_MANIFEST

InputKey = tuple[date, date]  # (event_date, received_date)
Inputs = dict[InputKey, int]  # -> ingest_version


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What one partition must do."""

    available: Inputs
    new: Inputs = field(default_factory=dict)
    gone: Inputs = field(default_factory=dict)

    @property
    def pending(self) -> bool:
        return bool(self.new or self.gone)

    @property
    def needs_recompute(self) -> bool:
        return bool(self.gone)


def plan(available: Inputs, absorbed: Inputs) -> Plan:
    new = {k: v for k, v in available.items() if absorbed.get(k) != v}
    gone = {k: v for k, v in absorbed.items() if available.get(k) != v}
    return Plan(available=available, new=new, gone=gone)


def batch_inputs(store: DeltaStore, event_dates: Iterable[date]) -> dict[date, Inputs]:
    """Per event date, the batches that hold events for it (the received -> event index)."""
    wanted = sorted(set(event_dates))
    out: dict[date, Inputs] = {d: {} for d in wanted}
    if not wanted:
        return out
    rows = (
        store.read(BATCH_EVENT_DATES)
        .where(F.col("event_date").isin(wanted))
        .select("event_date", "received_date", "ingest_version")
        .collect()
    )
    for row in rows:
        out[row.event_date][(row.event_date, row.received_date)] = row.ingest_version
    return out


def absorbed_inputs(
    store: DeltaStore, *, asset: str, partitions: Iterable[date]
) -> dict[date, Inputs]:
    wanted = sorted(set(partitions))
    out: dict[date, Inputs] = {d: {} for d in wanted}
    if not wanted:
        return out
    rows = (
        store.read(INCREMENTAL_MANIFEST, partitions=[asset])
        .where(F.col("partition_date").isin(wanted))
        .select("partition_date", "event_date", "received_date", "ingest_version")
        .collect()
    )
    for row in rows:
        out[row.partition_date][(row.event_date, row.received_date)] = row.ingest_version
    return out


def record_absorbed(
    store: DeltaStore,
    spark: SparkSession,
    *,
    asset: str,
    absorbed: Mapping[date, Inputs],
    run_id: str,
) -> None:
    """Replace the manifest of `absorbed`'s partitions with exactly these inputs."""
    if not absorbed:
        return
    now = datetime.now(UTC).replace(tzinfo=None)
    rows = [
        (asset, partition, event_date, received_date, version, run_id, now)
        for partition, inputs in sorted(absorbed.items())
        for (event_date, received_date), version in sorted(inputs.items())
    ]
    store.rewrite(
        INCREMENTAL_MANIFEST,
        partitions=[asset],
        drop=F.col("partition_date").isin(sorted(absorbed)),
        add=lambda: spark.createDataFrame(rows, INCREMENTAL_MANIFEST.schema),
        commit_metadata={"dagster_run_id": run_id, "asset": asset},
    )


def input_pairs(spark: SparkSession, inputs: Iterable[InputKey]) -> DataFrame:
    """A small frame of (event_date, received_date) to semi-join data against."""
    return spark.createDataFrame(sorted(set(inputs)), "event_date date, received_date date").hint(
        "broadcast"
    )
