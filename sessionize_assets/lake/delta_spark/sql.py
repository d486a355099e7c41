"""How the delta-spark backend's changes become Delta Spark operations, and back: a MERGE's
source and condition (one string key a target row, so a hash join), `replaceWhere`'s
predicate, what a commit did from its actions, and Delta's errors as the store's."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import date
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from sessionize_assets.lake.store import (
    CommitInfo,
    LakeError,
    TableSpec,
    WriteConflictError,
)
from sessionize_assets.sql_text import sql_identifier

# Delta's errors for a commit that conflicted with a concurrent one (nothing committed).
_CONFLICTS = (
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
    "MetadataChangedException",
    "ProtocolChangedException",
    "DELTA_CONCURRENT_",
)
# The MERGE source's columns: the table's, renamed (a `drop` predicate names the target's),
# and what a source row is: NULL for a row to add, else the key it drops target rows by.
SOURCE_PREFIX = "_source_"
SOURCE_MATCH = "_source_match"
_BY_PREDICATE = "\u0000predicate"  # no JSON object (a key's form) equals it

_CAUSE = re.compile(r"^[A-Za-z_.]*(Error|Exception): ")


class DeltaConflict(WriteConflictError):
    """Delta's conflict detection failed the commit (not the check of a read version)."""


def merge_source_and_condition(
    spec: TableSpec,
    new_rows: DataFrame,
    drop: Column | None,
    drop_keys: DataFrame | None,
    searched: Sequence[str] | None,
) -> tuple[DataFrame, Column]:
    """The source and condition of a MERGE that deletes the target rows in `searched` matching
    `drop` or a row of `drop_keys`, and inserts `new_rows`.

    Each target row is matched on one string, an equi-join key (a hash join, not a loop over
    every pair): the predicate marker when `drop` holds for it, else its keys as JSON. The
    source holds one marker row, the keys, and the new rows, whose key is NULL: they match
    nothing and are inserted. A target row matched by several source rows is deleted once.
    """
    renamed = [F.col(f.name).alias(SOURCE_PREFIX + f.name) for f in spec.schema]
    parts = [new_rows.select(*renamed, F.lit(None).cast(StringType()).alias(SOURCE_MATCH))]
    target_key: Column = F.lit(None).cast(StringType())
    if drop_keys is not None:
        columns = drop_keys.columns
        types = {f.name: f.dataType for f in spec.schema}
        keys = drop_keys.select(*(F.col(c).cast(types[c]).alias(c) for c in columns))
        parts.append(keys.select(F.to_json(F.struct(*columns)).alias(SOURCE_MATCH)))
        target_key = F.to_json(F.struct(*columns))
    if drop is not None:
        spark = new_rows.sparkSession
        parts.append(spark.range(1).select(F.lit(_BY_PREDICATE).alias(SOURCE_MATCH)))
        target_key = F.when(F.coalesce(drop, F.lit(False)), F.lit(_BY_PREDICATE)).otherwise(
            target_key
        )
    source = parts[0]
    for part in parts[1:]:
        source = source.unionByName(part, allowMissingColumns=True)
    condition = F.col(SOURCE_MATCH) == target_key
    if searched is not None:
        condition = F.col(spec.partition_by).isin(partition_literals(spec, searched)) & condition
    return source, condition


def partition_literals(spec: TableSpec, values: Sequence[str]) -> list[Any]:
    """Partition values (as Delta stores them) as typed Python values for `isin`."""
    if spec.partition_is_date:
        return [date.fromisoformat(v) for v in values]
    return list(values)


def partitions_predicate(spec: TableSpec, values: Sequence[str]) -> str:
    """`replaceWhere`'s predicate (Delta takes only SQL text): the partition column IN typed
    literals. A date is re-rendered from `date` and a string quoted, so no value can change
    the predicate's shape."""
    column = sql_identifier(spec.partition_by)
    literals = [
        f"DATE'{v.isoformat()}'"
        if isinstance(v, date)
        else "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"
        for v in partition_literals(spec, values)
    ]
    return f"{column} IN ({', '.join(literals)})"


def commit_info_of(spec: TableSpec, version: int, actions: list[dict[str, Any]]) -> CommitInfo:
    """What one commit did, from its actions (files that change no row are not counted)."""
    changed = [a for a in actions if a.get("add", a.get("remove", {})).get("dataChange", True)]
    adds = [a["add"] for a in changed if "add" in a]
    removes = [a["remove"] for a in changed if "remove" in a]
    partitions = {
        str((f.get("partitionValues") or {}).get(spec.partition_by)) for f in (*adds, *removes)
    }
    return CommitInfo(
        table=spec.name,
        version=version,
        partitions=tuple(sorted(partitions)),
        files_added=len(adds),
        files_removed=len(removes),
        rows_written=sum(json.loads(a.get("stats") or "{}").get("numRecords", 0) for a in adds),
    )


def lake_error(spec: TableSpec, exc: Exception) -> LakeError:
    """Delta Spark's error as the store's: a conflict, or a failed write (nothing committed)."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    # A failed task's error (a Python worker's traceback) ends with its cause: name it too.
    causes = [line for line in lines[1:] if _CAUSE.match(line)]
    if causes:
        first = f"{first} ({causes[-1]})"
    if any(name in text for name in _CONFLICTS):
        return DeltaConflict(
            f"{spec.name}: a concurrent commit conflicted with this one ({first}); nothing "
            "was committed: a new run redoes the work from the current version"
        )
    if "DELTA_REPLACE_WHERE_MISMATCH" in text:
        return LakeError(f"{spec.name}: rows outside the replaced partitions ({first})")
    return LakeError(f"{spec.name}: the Delta write failed: {first}")
