"""A DataFrame shaped for a table: its columns in the spec's order and types, a merge's source
with unique keys, and the Parquet writer's settings of the spec. Both backends use them."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sessionize_assets.lake.store import LakeError, TableSpec
from sessionize_assets.sql_text import sql_identifier, sql_type


def parquet_options(spec: TableSpec) -> dict[str, str]:
    """The Parquet writer's settings of the spec: row group size and bloom filters."""
    options = {}
    if spec.row_group_bytes:
        options["parquet.block.size"] = str(spec.row_group_bytes)
    for column in spec.bloom_filter_columns:
        options[f"parquet.bloom.filter.enabled#{column}"] = "true"
        options[f"parquet.bloom.filter.expected.ndv#{column}"] = str(spec.bloom_filter_ndv)
    return options


def merge_source(spec: TableSpec, df: DataFrame, keys: Sequence[str]) -> DataFrame:
    """`df` aligned to the spec, as a merge's source: `LakeError` if two rows share `keys`
    (one Spark job), since a target row can take only one of them."""
    if not keys:
        raise ValueError("merge needs at least one key column")
    incoming = align(spec, df)
    if incoming.groupBy(*keys).count().where(F.col("count") > 1).limit(1).count():
        raise LakeError(f"{spec.name}: merge source has duplicate keys {list(keys)}")
    return incoming


def align(spec: TableSpec, df: DataFrame) -> DataFrame:
    """`df`'s columns of the spec, in its order, cast to its types (`LakeError` if one is
    missing). The casts are SQL text, one JVM call for the row: a column cast from a
    `DataType` costs several calls each, a tenth of a second on a wide table's every write."""
    present = set(df.columns)  # one schema lookup: each `df.columns` asks the JVM
    missing = [name for name in spec.schema.fieldNames() if name not in present]
    if missing:
        raise LakeError(f"{spec.name}: data is missing columns {missing}")
    return df.selectExpr(
        *(
            f"CAST({sql_identifier(f.name)} AS {sql_type(f.dataType)}) AS {sql_identifier(f.name)}"
            for f in spec.schema
        )
    )
