"""A lake's Delta tables read with delta-rs on the driver: what both backends share.

Paths, table state (versions, application transactions, history), the live files the log names
with their partition values and column statistics, changes between versions, row counts, and
the rows themselves (Spark reads the files the log names; small tables are read with Arrow, no
Spark job). One delta-rs snapshot per table lives as long as the store (a run's step).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, Field, Schema
from deltalake.exceptions import TableNotFoundError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.lake.delta_rs.log_files import (
    as_strings,
    file_partitions,
    files_in_range,
    logged_changes,
    read_small_table,
    table_path,
    with_user_metadata,
)
from sessionize_assets.lake.location import Location
from sessionize_assets.lake.parquet_files import FILE_COLUMN, read_files
from sessionize_assets.lake.placement import DEFAULT_DRIVER_WRITE_BYTES
from sessionize_assets.lake.store import (
    NOT_CREATED,
    FileChange,
    LakeError,
    PartitionValue,
    TableSpec,
    ValuesByPartition,
    empty_frame,
    partition_string,
)
from sessionize_assets.sql_text import select_columns

log = logging.getLogger(__name__)


def delta_schema(spec: TableSpec) -> Schema:
    return Schema.from_arrow(to_arrow_schema(spec.schema))


class DeltaRsReads:
    """The reads of `DeltaStore` (lake/store.py), on delta-rs and Spark's Parquet reader."""

    # Whether the store's own writes work on an object store (no renames, no shared folder).
    OBJECT_STORAGE = False

    def __init__(
        self,
        *,
        spark: SparkSession | Callable[[], SparkSession],
        lake: Location | Path | str,
        driver_write_bytes: int = DEFAULT_DRIVER_WRITE_BYTES,
    ) -> None:
        """`spark` is the session, or a function that gives it: called when the store first
        needs Spark, so that work done with Arrow alone (a lifecycle run that restates a few
        users) starts none."""
        self._session = spark
        self._lake = Location.of(lake)
        self._driver_write_bytes = driver_write_bytes
        if not (self._lake.is_local or self.OBJECT_STORAGE):
            raise LakeError(
                f"the lake at {self._lake} is not a local or shared folder, and the embedded "
                "backend commits files it renames into place: use the delta-spark backend "
                "(SESSIONIZE_LAKE_BACKEND=delta-spark) for a lake on an object store"
            )
        # One delta-rs snapshot per table for the store's life (a run's step): see `_table`.
        self._snapshots: dict[str, DeltaTable] = {}

    @property
    def _spark(self) -> SparkSession:
        if callable(self._session):
            self._session = self._session()
        return self._session

    def path(self, spec: TableSpec) -> Location:
        return table_path(self._lake, spec)

    def uri(self, spec: TableSpec) -> str:
        return self.path(spec).as_uri()

    def exists(self, spec: TableSpec) -> bool:
        return DeltaTable.is_deltatable(str(self.path(spec)))

    def _table(self, spec: TableSpec) -> DeltaTable | None:
        """The table at its latest version, None before it exists.

        A step asks this a hundred times or more. Loading the log each time costs 5-10 ms, and
        more as the log grows; bringing the store's own snapshot up to date costs about 1 ms:
        delta-rs reads only the commit files written since, by this store or any other writer.
        (A table folder deleted and created again under a live store is not noticed: a store
        lives for one step, and nothing in a step deletes a table.)
        """
        path = str(self.path(spec))
        table = self._snapshots.get(path)
        if table is not None:
            table.update_incremental()
            return table
        try:
            table = DeltaTable(path)
        except TableNotFoundError:
            return None
        self._snapshots[path] = table
        return table

    def _committed(self, spec: TableSpec) -> int:
        """The version a commit just made (the table's latest; it exists once committed to)."""
        version = self.version(spec)
        assert version is not None, spec.name
        return version

    def version(self, spec: TableSpec) -> int | None:
        table = self._table(spec)
        return None if table is None else table.version()

    def read_version(self, spec: TableSpec) -> int:
        version = self.version(spec)
        return NOT_CREATED if version is None else version

    def applied_version(self, spec: TableSpec, app_id: str) -> int | None:
        table = self._table(spec)
        return None if table is None else table.transaction_version(app_id)

    def history(self, spec: TableSpec, *, limit: int | None = None) -> list[dict[str, Any]]:
        table = self._table(spec)
        return [] if table is None else [with_user_metadata(c) for c in table.history(limit)]

    def _new_fields(self, spec: TableSpec, table: DeltaTable) -> list[Field]:
        """The spec's columns the table lacks; `LakeError` when the table is partitioned
        otherwise or a column changed type (only adding columns is supported)."""
        found = list(table.metadata().partition_columns)
        if found != [spec.partition_by]:
            raise LakeError(
                f"{spec.name} at {self.path(spec)} is partitioned by {found}, "
                f"expected [{spec.partition_by!r}]"
            )
        existing = {f.name: f for f in table.schema().fields}
        wanted = delta_schema(spec).fields
        changed = [f.name for f in wanted if f.name in existing and existing[f.name].type != f.type]
        if changed:
            raise LakeError(
                f"{spec.name}: columns {changed} changed type; only adding columns is supported"
            )
        return [f for f in wanted if f.name not in existing]

    def read(
        self, spec: TableSpec, *, partitions: Iterable[PartitionValue] | None = None
    ) -> DataFrame:
        files = self.live_files(spec, partitions=partitions)
        if not files:
            return empty_frame(self._spark, spec.schema)
        df = (
            self._spark.read.schema(spec.schema)
            .option("basePath", str(self.path(spec)))
            .parquet(*files)
        )
        return select_columns(df, spec.schema.fieldNames())

    def live_files(
        self, spec: TableSpec, *, partitions: Iterable[PartitionValue] | None = None
    ) -> list[str]:
        table = self._table(spec)
        if table is None:
            return []
        wanted = None if partitions is None else {partition_string(p) for p in partitions}
        if wanted is not None and not wanted:
            return []
        root = self.path(spec)
        return sorted(str(root / unquote(path)) for path, _ in file_partitions(table, spec, wanted))

    def files_with_values(
        self,
        spec: TableSpec,
        *,
        column: str,
        values: ValuesByPartition,
        whole: Iterable[PartitionValue] = (),
    ) -> list[str]:
        table = self._table(spec)
        if table is None:
            return []
        return files_in_range(
            table,
            spec,
            column=column,
            values={partition_string(p): v for p, v in values.items()},
            whole={partition_string(p) for p in whole},
        )

    def read_files(
        self, spec: TableSpec, paths: Iterable[str], *, with_file: bool = False
    ) -> DataFrame:
        root = self.path(spec)
        files = sorted({str(root / unquote(path)) for path in paths})
        if not files:
            frame = empty_frame(self._spark, spec.schema)
            return frame.withColumn(FILE_COLUMN, F.lit(None).cast("string")) if with_file else frame
        df = self._spark.read.schema(spec.schema).option("basePath", str(root)).parquet(*files)
        names = spec.schema.fieldNames()
        if with_file:
            df = df.withColumn(FILE_COLUMN, F.col("_metadata.file_path"))
            names.append(FILE_COLUMN)
        return select_columns(df, names)

    def changes(
        self, spec: TableSpec, *, since_version: int, through_version: int
    ) -> list[FileChange] | None:
        """Read from the commit files themselves: proportional to what changed, not the table."""
        root = self.path(spec)
        found = logged_changes(root, spec, since_version=since_version, through=through_version)
        if found is None or any(not (root / unquote(c.path)).exists() for c in found):
            return None  # vacuumed: the rows those files held can no longer be read
        return found

    def row_counts(
        self, spec: TableSpec, *, partitions: Iterable[PartitionValue] | None = None
    ) -> dict[str, int]:
        """Rows per partition from the log's file statistics: no data is read."""
        table = self._table(spec)
        if table is None:
            return {}
        wanted = None if partitions is None else {partition_string(p) for p in partitions}
        actions = pa.table(table.get_add_actions(flatten=True))
        values = as_strings(actions.column(f"partition.{spec.partition_by}"))
        rows = pa.table({"value": values, "rows": pc.fill_null(actions.column("num_records"), 0)})
        if wanted is not None:
            allowed = pa.array(sorted(wanted), type=pa.string())
            rows = rows.filter(pc.is_in(rows.column("value"), value_set=allowed))
        totals = rows.group_by("value").aggregate([("rows", "sum")]).sort_by("value")
        return dict(
            zip(
                totals.column("value").to_pylist(),
                (int(n) for n in totals.column("rows_sum").to_pylist()),
                strict=True,
            )
        )

    def partition_files(
        self, spec: TableSpec, *, partitions: Iterable[PartitionValue] | None = None
    ) -> dict[str, list[str]]:
        table = self._table(spec)
        if table is None:
            return {}
        wanted = None if partitions is None else {partition_string(p) for p in partitions}
        if wanted is not None and not wanted:
            return {}
        files: dict[str, list[str]] = {}
        for path, value in sorted(file_partitions(table, spec, wanted)):
            files.setdefault(value, []).append(path)
        return files

    def partition_values(self, spec: TableSpec) -> list[str]:
        table = self._table(spec)
        if table is None:
            return []
        return sorted({value for _, value in file_partitions(table, spec, None)})

    def read_arrow(
        self,
        spec: TableSpec,
        *,
        partitions: Iterable[PartitionValue] | None = None,
        columns: Sequence[str] | None = None,
        where: pc.Expression | None = None,
    ) -> pa.Table:
        """A small table (or some partitions of it), read on the driver."""
        return read_small_table(
            self.path(spec), spec, partitions=partitions, columns=columns, where=where
        )

    def read_files_arrow(
        self,
        spec: TableSpec,
        paths: Iterable[str],
        *,
        columns: Sequence[str],
        with_file: bool = False,
    ) -> pa.Table:
        return read_files(self.path(spec), spec, paths, columns, with_file=with_file)
