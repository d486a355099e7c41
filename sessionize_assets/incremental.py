"""Bookkeeping of what each asset partition has absorbed (Snowplow-style manifests).

An input is one batch's rows for one event date: (event_date, received_date) at the
raw_events version that wrote the batch. Comparing what is available with what a partition
has absorbed says exactly what to do: new inputs are read incrementally; an absorbed input
that changed or vanished (a re-delivered batch) forces a recompute of that partition.
Bookkeeping tables are tiny, so they are read and written on the driver with delta-rs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from sessionize_assets.lake.store import DeltaStore, TableSpec
from sessionize_assets.lake.tables import BATCH_EVENT_DATES, EVENTS_MANIFEST, SESSIONS_MANIFEST

InputKey = tuple[date, date]  # (event_date, received_date)
Inputs = dict[InputKey, int]  # -> ingest_version

MANIFESTS: dict[str, TableSpec] = {"events": EVENTS_MANIFEST, "sessions": SESSIONS_MANIFEST}


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
    wanted = set(event_dates)
    out: dict[date, Inputs] = {d: {} for d in wanted}
    for row in store.read_arrow(BATCH_EVENT_DATES).to_pylist():
        if row["event_date"] in wanted:
            key = (row["event_date"], row["received_date"])
            out[row["event_date"]][key] = row["ingest_version"]
    return out


def indexed_rows(store: DeltaStore, inputs: Iterable[InputKey]) -> int:
    """Raw rows behind these inputs, from the index (no scan)."""
    wanted = set(inputs)
    return sum(
        row["events"]
        for row in store.read_arrow(BATCH_EVENT_DATES).to_pylist()
        if (row["event_date"], row["received_date"]) in wanted
    )


def batch_event_dates(store: DeltaStore, received: date) -> list[date]:
    """Event dates the index holds for one batch."""
    rows = store.read_arrow(BATCH_EVENT_DATES, partitions=[received]).to_pylist()
    return sorted({row["event_date"] for row in rows})


def absorbed_inputs(
    store: DeltaStore, *, asset: str, partitions: Iterable[date]
) -> dict[date, Inputs]:
    wanted = sorted(set(partitions))
    out: dict[date, Inputs] = {d: {} for d in wanted}
    for row in store.read_arrow(MANIFESTS[asset], partitions=wanted).to_pylist():
        key = (row["event_date"], row["received_date"])
        out[row["partition_date"]][key] = row["ingest_version"]
    return out


def record_absorbed(
    store: DeltaStore, *, asset: str, absorbed: Mapping[date, Inputs], run_id: str
) -> None:
    """Replace the manifest of `absorbed`'s partitions with exactly these inputs."""
    if not absorbed:
        return
    now = datetime.now(UTC)
    rows = [
        {
            "partition_date": partition,
            "event_date": event_date,
            "received_date": received_date,
            "ingest_version": version,
            "run_id": run_id,
            "processed_at": now,
        }
        for partition, inputs in sorted(absorbed.items())
        for (event_date, received_date), version in sorted(inputs.items())
    ]
    spec = MANIFESTS[asset]
    store.replace_partitions_arrow(
        spec,
        pa.Table.from_pylist(rows, schema=_arrow_schema(spec)),
        partitions=sorted(absorbed),
        commit_metadata={"dagster_run_id": run_id, "asset": asset},
    )


def _arrow_schema(spec: TableSpec) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spec.schema)


def input_pairs(spark: SparkSession, inputs: Iterable[InputKey]) -> DataFrame:
    """A small frame of (event_date, received_date) to semi-join data against."""
    return spark.createDataFrame(sorted(set(inputs)), "event_date date, received_date date").hint(
        "broadcast"
    )
