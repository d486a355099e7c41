"""Delta tables without the Delta jars: Spark writes Parquet, delta-rs commits the log.

Spark writes each change to a staging folder under the table (ignored by Delta readers because
it starts with `_`), the files are renamed into `col=value/` folders, and one delta-rs
transaction adds them and removes the replaced partitions' files. Until that commit succeeds
the table is unchanged; on failure the new files are deleted. Parquet footers are read to give
the log real statistics for data skipping. A change Spark estimates small
(`driver_write_bytes`) is collected with Arrow and its files written from the driver, in the
same layout (`_stage`): on a daily batch that is a fifth of Spark's writer job and commit
protocol; a large one never passes through the driver.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, Field, Schema
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import (
    AddAction,
    RemoveAction,
    create_table_with_add_actions,
)
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.lake.location import Location
from sessionize_assets.lake.log_commits import (
    check_advances,
    check_unchanged,
    commit_info,
    commit_properties,
    discard,
    publish,
)
from sessionize_assets.lake.log_files import (
    as_strings,
    file_partitions,
    files_in_range,
    logged_changes,
    read_small_table,
    table_path,
    with_user_metadata,
)
from sessionize_assets.lake.maintenance import STAGING_DIR, maintain_table
from sessionize_assets.lake.parquet_files import read_files, stage_arrow
from sessionize_assets.lake.placement import DEFAULT_DRIVER_WRITE_BYTES, estimated_bytes
from sessionize_assets.lake.store import (
    NOT_CREATED,
    AppTransaction,
    CommitInfo,
    FileChange,
    LakeError,
    MaintenanceResult,
    PartitionValue,
    TableSpec,
    ValuesByPartition,
    WriteConflictError,
    empty_frame,
    partition_string,
)
from sessionize_assets.sql_text import select_columns, sql_identifier, sql_type

log = logging.getLogger(__name__)

_COMMIT_ATTEMPTS = 5
MAX_ROWS_PER_FILE = 2_000_000

_Touched = tuple[str, str, int]  # a data file a rewrite replaces: path, partition value, size
_Staged = tuple[list[_Touched], list[tuple[str, Path]]]  # those, and the new files staged


def delta_schema(spec: TableSpec) -> Schema:
    return Schema.from_arrow(to_arrow_schema(spec.schema))


class EmbeddedDeltaStore:
    """`DeltaStore` for local mode or any cluster whose executors share the lake's file system."""

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

    # -- paths and table state ---------------------------------------------------------------

    def path(self, spec: TableSpec) -> Location:
        return table_path(self._lake, spec)

    def _staging(self, spec: TableSpec) -> Path:
        """A new folder to write a commit's files in before they are published: in the
        table's folder (a rename publishes them), or a local temporary one for a table on an
        object store (an upload does)."""
        if self.path(spec).is_local:
            return self.path(spec).local_path() / STAGING_DIR / uuid.uuid4().hex
        return Path(tempfile.mkdtemp(prefix=f"sessionize-{spec.name}-"))

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

    def maintain(self, spec: TableSpec, *, retention: timedelta) -> MaintenanceResult:
        return maintain_table(self.path(spec).local_path(), spec, retention=retention)

    def ensure(self, spec: TableSpec) -> None:
        table = self._table(spec)
        if table is None:
            self._create(spec)
            return
        new_fields = self._new_fields(spec, table)
        if new_fields:
            # Added columns must be nullable: files written before them hold no values.
            table.alter.add_columns(
                [Field(f.name, f.type, nullable=True, metadata=f.metadata) for f in new_fields]
            )
            log.info("%s: added columns %s", spec.name, [f.name for f in new_fields])

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

    def _create(self, spec: TableSpec) -> bool:
        """Create the empty table; False if another writer created it first."""
        try:
            create_table_with_add_actions(
                str(self.path(spec)),
                delta_schema(spec),
                [],
                mode="error",
                partition_by=[spec.partition_by],
                name=spec.name,
                description=spec.description or None,
            )
        except Exception:
            if self.exists(spec):
                return False
            raise
        return True

    # -- reading -----------------------------------------------------------------------------

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

    def read_files(self, spec: TableSpec, paths: Iterable[str]) -> DataFrame:
        root = self.path(spec)
        files = sorted({str(root / unquote(path)) for path in paths})
        if not files:
            return empty_frame(self._spark, spec.schema)
        df = self._spark.read.schema(spec.schema).option("basePath", str(root)).parquet(*files)
        return select_columns(df, spec.schema.fieldNames())

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

    def partition_values(self, spec: TableSpec) -> list[str]:
        table = self._table(spec)
        if table is None:
            return []
        return sorted({value for _, value in file_partitions(table, spec, None)})

    # -- writing -----------------------------------------------------------------------------

    def replace_partitions(
        self,
        spec: TableSpec,
        df: DataFrame,
        *,
        partitions: Iterable[PartitionValue],
        commit_metadata: Mapping[str, str] | None = None,
        read_version: int | None = None,
    ) -> CommitInfo:
        aligned = align(spec, df)
        return self._replace(
            spec,
            partitions,
            lambda staging: self._stage(spec, aligned, staging),
            commit_metadata,
            read_version=read_version,
        )

    def read_arrow(
        self,
        spec: TableSpec,
        *,
        partitions: Iterable[PartitionValue] | None = None,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """A small table (or some partitions of it), read on the driver."""
        return read_small_table(self.path(spec), spec, partitions=partitions, columns=columns)

    def read_files_arrow(
        self,
        spec: TableSpec,
        paths: Iterable[str],
        *,
        columns: Sequence[str],
        with_file: bool = False,
    ) -> pa.Table:
        return read_files(self.path(spec), spec, paths, columns, with_file=with_file)

    def writes_on_driver(self, df: DataFrame) -> bool:
        size = estimated_bytes(df)
        return size is not None and size <= self._driver_write_bytes

    def replace_partitions_arrow(
        self,
        spec: TableSpec,
        data: pa.Table,
        *,
        partitions: Iterable[PartitionValue],
        commit_metadata: Mapping[str, str] | None = None,
        app_transaction: AppTransaction | None = None,
        read_version: int | None = None,
    ) -> CommitInfo:
        """`replace_partitions` for small bookkeeping rows built on the driver: no Spark job."""
        schema = to_arrow_schema(spec.schema)
        data = data.select(schema.names).cast(schema)
        return self._replace(
            spec,
            partitions,
            lambda staging: stage_arrow(spec, data, staging),
            commit_metadata,
            app_transaction=app_transaction,
            read_version=read_version,
        )

    def _replace(
        self,
        spec: TableSpec,
        partitions: Iterable[PartitionValue],
        stage: Callable[[Path], list[tuple[str, Path]]],
        commit_metadata: Mapping[str, str] | None,
        *,
        app_transaction: AppTransaction | None = None,
        read_version: int | None,
    ) -> CommitInfo:
        targets = sorted({partition_string(p) for p in partitions})
        if not targets:
            return CommitInfo(table=spec.name, version=self.version(spec), partitions=())
        self.ensure(spec)
        staging = self._staging(spec)
        staged = stage(staging)
        try:
            outside = sorted({value for value, _ in staged} - set(targets))
            if outside:
                raise LakeError(
                    f"{spec.name}: rows for partitions {outside[:5]} outside the replaced "
                    f"partitions {targets[:5]}{'...' if len(targets) > 5 else ''}"
                )
            adds = publish(self.path(spec), spec, staged)
            version, removed = self._commit(
                spec, adds, targets, commit_metadata, app_transaction, read_version
            )
        except BaseException:
            discard(self.path(spec), spec, staged)
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return commit_info(spec, version, targets, adds, removed)

    def merge(
        self,
        spec: TableSpec,
        df: DataFrame,
        *,
        keys: Sequence[str],
        search_partitions: Iterable[PartitionValue] | None = None,
        commit_metadata: Mapping[str, str] | None = None,
    ) -> CommitInfo:
        """Upsert on `keys`: a rewrite that drops matching rows and adds the incoming ones."""
        incoming = merge_source(spec, df, keys)
        return self.rewrite(
            spec,
            partitions=search_partitions,
            drop_keys=incoming.select(*keys),
            add=lambda: incoming,
            commit_metadata=commit_metadata,
        )

    def rewrite(
        self,
        spec: TableSpec,
        *,
        add: Callable[[], DataFrame],
        partitions: Iterable[PartitionValue] | None = None,
        drop: Column | None = None,
        drop_keys: DataFrame | None = None,
        files: Collection[str] | None = None,
        commit_metadata: Mapping[str, str] | None = None,
        app_transaction: AppTransaction | None = None,
        read_version: int | None = None,
    ) -> CommitInfo:
        """Copy-on-write at file granularity: drop rows, add rows, one commit.

        Rows in `partitions` (None: all) that match `drop` or whose columns match a row of
        `drop_keys` are removed; only the files holding them are rewritten, with their other
        rows. `add()` supplies new rows (anywhere). The commit is made against the snapshot
        that was read, so a concurrent change makes it fail; the whole rewrite is then redone
        from a fresh snapshot, calling `add()` again.
        """
        searched = None if partitions is None else sorted({partition_string(p) for p in partitions})

        def stage(table: DeltaTable, staging: Path) -> _Staged:
            candidates, marked = self._marked_rows(spec, table, searched, drop, drop_keys, files)
            new_rows = align(spec, add())
            if marked is None:
                return [], self._stage(spec, new_rows, staging)
            small = self._driver_write_bytes - sum(size for _, _, size in candidates.values())
            size = estimated_bytes(new_rows)
            if size is not None and size <= small:
                return self._stage_on_driver(spec, candidates, marked, new_rows, staging)
            touched, kept = self._touched_files(spec, candidates, marked)
            return touched, self._stage(spec, kept.unionByName(new_rows), staging)

        return self._copy_on_write(spec, stage, commit_metadata, app_transaction, read_version)

    def rewrite_arrow(
        self,
        spec: TableSpec,
        *,
        add: pa.Table,
        drop: pa.Table | None = None,
        files: Collection[str] = (),
        commit_metadata: Mapping[str, str] | None = None,
        app_transaction: AppTransaction | None = None,
        read_version: int | None = None,
    ) -> CommitInfo:
        """`rewrite` on the driver: the searched files are read and the new ones written with
        Arrow (no Spark job). A concurrent change redoes it, as `rewrite` does."""
        schema = to_arrow_schema(spec.schema)

        def stage(table: DeltaTable, staging: Path) -> _Staged:
            touched, kept = self._touched_arrow(spec, table, drop, files)
            rows = pa.concat_tables([kept, add.select(schema.names).cast(schema)])
            return touched, stage_arrow(spec, rows, staging) if rows.num_rows else []

        return self._copy_on_write(spec, stage, commit_metadata, app_transaction, read_version)

    def _copy_on_write(
        self,
        spec: TableSpec,
        stage: Callable[[DeltaTable, Path], _Staged],
        commit_metadata: Mapping[str, str] | None,
        app_transaction: AppTransaction | None,
        read_version: int | None,
    ) -> CommitInfo:
        """One commit of the files `stage` writes and the files it says it replaces, redone
        from a fresh snapshot when a concurrent commit fails it."""
        properties = commit_properties(commit_metadata, app_transaction, read_version)
        self.ensure(spec)
        for attempt in range(1, _COMMIT_ATTEMPTS + 1):
            table = self._table(spec)
            assert table is not None
            staging = self._staging(spec)
            try:
                touched, staged = stage(table, staging)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            written = {v for v, _ in staged} | {v for _, v, _ in touched}
            try:
                adds = publish(self.path(spec), spec, staged)
                if not adds and not touched and app_transaction is None:
                    return CommitInfo(table=spec.name, version=table.version(), partitions=())
                removes = [
                    RemoveAction(path, True, int(time.time() * 1000), size, {spec.partition_by: v})
                    for path, v, size in touched
                ]
                check_unchanged(
                    self.path(spec),
                    spec,
                    table,
                    None if app_transaction else written,
                    read_version,
                )
                check_advances(spec, table, app_transaction)
                table.create_write_transaction(
                    [*adds, *removes],
                    mode="append",
                    schema=table.schema(),
                    partition_by=[spec.partition_by],
                    commit_properties=properties,
                )
            except CommitFailedError as exc:
                discard(self.path(spec), spec, staged)
                if attempt == _COMMIT_ATTEMPTS:
                    raise LakeError(f"{spec.name}: rewrite kept conflicting") from exc
                log.warning("%s: concurrent change (attempt %d), redoing", spec.name, attempt)
                time.sleep(0.05 * attempt)
                continue
            except BaseException:
                discard(self.path(spec), spec, staged)
                raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            return commit_info(spec, self._committed(spec), written, adds, len(touched))
        raise LakeError(f"{spec.name}: could not commit")  # pragma: no cover

    def _touched_arrow(
        self, spec: TableSpec, table: DeltaTable, drop: pa.Table | None, files: Collection[str]
    ) -> tuple[list[_Touched], pa.Table]:
        """The `files` holding a row of `drop`, and their other rows."""
        schema = to_arrow_schema(spec.schema)
        if drop is None or not drop.num_rows or not files:
            return [], schema.empty_table()
        live = {
            path: (value, size)
            for path, value, size in file_partitions(
                table,
                spec,
                {unquote(f).split("/", 1)[0].split("=", 1)[1] for f in files},
                sizes=True,
            )
        }
        gone = sorted(set(files) - live.keys())
        if gone:
            raise WriteConflictError(
                f"{spec.name}: files {gone[:2]} were replaced since they were chosen; nothing "
                "was committed: a new run redoes the work from the current version"
            )
        touched, kept = [], []
        keys = drop.select(drop.column_names).cast(
            pa.schema([schema.field(name) for name in drop.column_names])
        )
        for path in sorted(set(files)):
            rows = read_files(self.path(spec), spec, [path], schema.names)
            left = rows.join(keys, keys=drop.column_names, join_type="left anti")
            if left.num_rows < rows.num_rows:
                touched.append((path, *live[path]))
                kept.append(left.select(schema.names).cast(schema))
        return touched, pa.concat_tables(kept) if kept else schema.empty_table()

    def _marked_rows(
        self,
        spec: TableSpec,
        table: DeltaTable,
        searched: list[str] | None,
        drop: Column | None,
        drop_keys: DataFrame | None,
        files: Collection[str] | None,
    ) -> tuple[dict[str, _Touched], DataFrame | None]:
        """The snapshot's files that can hold rows to drop (by local path), and their rows
        with `_file` (Spark's URI of the file) and `_drop` (whether the row goes); None when
        nothing is to be dropped."""
        if drop is None and drop_keys is None:
            return {}, None
        root = self.path(spec)
        allowed = None if files is None else set(files)
        candidates = {
            str(root / unquote(path)): (path, value, size)
            for path, value, size in file_partitions(
                table, spec, None if searched is None else set(searched), sizes=True
            )
            if allowed is None or path in allowed
        }
        if not candidates:
            return {}, None
        rows = (
            self._spark.read.schema(spec.schema)
            .option("basePath", str(root))
            .parquet(*(str(root / unquote(p)) for p, _, _ in candidates.values()))
            .withColumn("_file", F.col("_metadata.file_path"))
        )
        hit = F.lit(False)
        if drop is not None:
            hit = hit | F.coalesce(drop, F.lit(False))
        if drop_keys is not None:
            keys = drop_keys.distinct().withColumn("_key_hit", F.lit(True))
            rows = rows.join(F.broadcast(keys), on=drop_keys.columns, how="left")
            hit = hit | F.col("_key_hit").isNotNull()
        return candidates, rows.withColumn("_drop", hit)

    def _touched_files(
        self, spec: TableSpec, candidates: dict[str, _Touched], marked: DataFrame
    ) -> tuple[list[_Touched], DataFrame]:
        """Files of the snapshot holding rows to drop (a Spark job finds them), and those
        files' rows to keep."""
        hit_uris = {r[0] for r in marked.where("_drop").select("_file").distinct().collect()}
        touched = _candidates_of(spec, candidates, hit_uris)
        kept = marked.where(~F.col("_drop") & F.col("_file").isin(sorted(hit_uris)))
        return touched, select_columns(kept, spec.schema.fieldNames())

    def _stage_on_driver(
        self,
        spec: TableSpec,
        candidates: dict[str, _Touched],
        marked: DataFrame,
        new_rows: DataFrame,
        staging: Path,
    ) -> _Staged:
        """A small rewrite in one Spark job: the candidate files' rows, marked, and the new
        rows are collected together with Arrow; the files holding a dropped row are found,
        and their other rows kept, on the driver, and the new files written from there."""
        names = spec.schema.fieldNames()
        both = select_columns(marked, [*names, "_file", "_drop"]).unionByName(
            new_rows.selectExpr(
                *map(sql_identifier, names), "CAST(NULL AS STRING) AS _file", "false AS _drop"
            )
        )
        rows = both.toArrow()
        drop = rows.column("_drop")  # never null: `_marked_rows` coalesces it
        dropped = rows.filter(drop)
        hit_uris = set(pc.unique(dropped.column("_file")).to_pylist())
        kept = pc.or_(
            pc.is_null(rows.column("_file")),
            pc.and_(
                pc.invert(drop),
                pc.is_in(rows.column("_file"), value_set=pa.array(sorted(hit_uris), pa.string())),
            ),
        )
        schema = to_arrow_schema(spec.schema)
        written = rows.filter(kept).select(schema.names).cast(schema)
        try:
            staged = stage_arrow(spec, written, staging) if written.num_rows else []
        except LakeError:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return _candidates_of(spec, candidates, hit_uris), staged

    def _stage(self, spec: TableSpec, df: DataFrame, staging: Path) -> list[tuple[str, Path]]:
        """Write `df` (aligned to the spec) as the files of a commit, in `staging`.

        A small change is collected with Arrow (one Spark job) and written from the driver
        (`stage_arrow`, the same layout): on a few thousand rows Spark's writer job and its
        commit protocol cost 0.5-1 s, the collect a fifth of that. A change Spark estimates
        above `driver_write_bytes`, or cannot estimate, is written by Spark's executors.
        """
        try:
            if self.writes_on_driver(df):
                schema = to_arrow_schema(spec.schema)
                return stage_arrow(spec, df.toArrow().select(schema.names).cast(schema), staging)
            # One task per partition value, sorted: its files are consecutive ranges of
            # sort_by (split every file_rows rows), not one file per upstream task.
            (
                df.repartition(spec.partition_by)
                .sortWithinPartitions(spec.partition_by, *spec.sort_by)
                .write.options(**parquet_options(spec))
                .option("maxRecordsPerFile", spec.file_rows or MAX_ROWS_PER_FILE)
                .partitionBy(spec.partition_by)
                .parquet(str(staging))
            )
        except LakeError:  # stage_arrow's: rows with a null partition value
            shutil.rmtree(staging, ignore_errors=True)
            raise
        except Exception as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise LakeError(f"{spec.name}: writing data files failed: {exc}") from exc
        staged: list[tuple[str, Path]] = []
        for folder in sorted(staging.glob(f"{spec.partition_by}=*")):
            value = unquote(folder.name.split("=", 1)[1])
            if value == "__HIVE_DEFAULT_PARTITION__":
                shutil.rmtree(staging, ignore_errors=True)
                raise LakeError(f"{spec.name}: rows with a null {spec.partition_by}")
            staged.extend((value, file) for file in sorted(folder.glob("*.parquet")))
        return staged

    def _commit(
        self,
        spec: TableSpec,
        adds: list[AddAction],
        targets: list[str],
        commit_metadata: Mapping[str, str] | None,
        app_transaction: AppTransaction | None,
        read_version: int | None,
    ) -> tuple[int, int]:
        properties = commit_properties(commit_metadata, app_transaction, read_version)
        for attempt in range(1, _COMMIT_ATTEMPTS + 1):
            table = self._table(spec)
            if table is None:
                raise LakeError(f"{spec.name}: table vanished at {self.path(spec)}")
            check_unchanged(
                self.path(spec),
                spec,
                table,
                None if app_transaction else targets,
                read_version,
            )
            check_advances(spec, table, app_transaction)
            removed = len(self.live_files(spec, partitions=targets))
            try:
                table.create_write_transaction(
                    [*adds],
                    mode="overwrite",
                    schema=table.schema(),
                    partition_by=[spec.partition_by],
                    partition_filters=[(spec.partition_by, "in", targets)],
                    commit_properties=properties,
                )
            except CommitFailedError as exc:
                if attempt == _COMMIT_ATTEMPTS:
                    raise LakeError(
                        f"{spec.name}: commit for partitions {targets[:5]} kept conflicting"
                    ) from exc
                log.warning("%s: commit conflict (attempt %d), retrying", spec.name, attempt)
                time.sleep(0.05 * attempt)
                continue
            return self._committed(spec), removed
        raise LakeError(f"{spec.name}: could not commit")  # pragma: no cover


def _candidates_of(
    spec: TableSpec, candidates: dict[str, _Touched], uris: Iterable[str]
) -> list[_Touched]:
    """The candidate files Spark names by these URIs (`_metadata.file_path`)."""
    by_path = {unquote(urlparse(uri).path): uri for uri in uris}
    unknown = by_path.keys() - candidates.keys()
    if unknown:
        raise LakeError(f"{spec.name}: cannot map Spark file paths {sorted(unknown)[:2]}")
    return [candidates[path] for path in sorted(by_path)]


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
