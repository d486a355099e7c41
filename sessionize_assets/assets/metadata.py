"""What every asset that writes the lake declares: its spec (key, kinds, owners, the table's
schema), its pool and its range runs; the Markdown tables of its metadata."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dagster import (
    AssetsDefinition,
    AssetSpec,
    BackfillPolicy,
    PartitionsDefinition,
    TableColumn,
    TableSchema,
    multi_asset,
)

from sessionize_assets.lake.store import TableSpec


def column_schema(spec: TableSpec) -> TableSchema:
    return TableSchema(
        columns=[
            TableColumn(
                name=field.name,
                type=field.dataType.simpleString(),
                description=field.metadata.get("comment"),
            )
            for field in spec.schema
        ]
    )


def definition_metadata(spec: TableSpec) -> dict[str, Any]:
    """Static metadata on the asset definition: what the UI shows before any run."""
    return {
        "dagster/column_schema": column_schema(spec),
        "dagster/table_name": spec.name,
        "partitioned_by": spec.partition_by,
    }


OWNERS = ["team:data-platform"]
# The concurrency pool of every asset that writes the lake. dagster.yaml limits it to one, so
# runs that write the same tables never interleave their read-modify-write commits.
LAKE_POOL = "lake"
KINDS = {"spark", "delta"}


def lake_asset_spec(
    table: TableSpec, *, description: str, group: str, layer: str, **extra: Any
) -> AssetSpec:
    """An asset backed by one Delta table: the same key, kinds, owners and schema metadata."""
    return AssetSpec(
        table.name,
        description=description,
        group_name=group,
        kinds=KINDS,
        owners=OWNERS,
        tags={"layer": layer},
        metadata=definition_metadata(table),
        **extra,
    )


def lake_multi_asset(
    *,
    name: str,
    specs: list[AssetSpec],
    partitions_def: PartitionsDefinition | None = None,
    **extra: Any,
) -> Callable[[Callable[..., Any]], AssetsDefinition]:
    """A multi-asset that writes the lake: in the lake's pool and, when partitioned, one run
    over all the partitions a backfill selects (a range run)."""
    return multi_asset(
        name=name,
        specs=specs,
        partitions_def=partitions_def,
        backfill_policy=BackfillPolicy.single_run() if partitions_def else None,
        pool=LAKE_POOL,
        **extra,
    )


def markdown_table(rows: Mapping[str, Any], *, key: str, value: str) -> str:
    lines = [f"| {key} | {value} |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in rows.items()]
    return "\n".join(lines)
