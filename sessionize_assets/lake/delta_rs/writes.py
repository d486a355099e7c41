"""Delta commits made with delta-rs from staged Parquet files: what both backends share.

Each change is written to a staging folder (under the table, ignored by Delta readers because it
starts with `_`; a local temporary one for a table on an object store), the files are renamed
(or uploaded) into `col=value/` folders, and one delta-rs transaction adds them and removes the
replaced files. Until that commit succeeds the table is unchanged; on failure the new files are
deleted. Parquet footers give the log real statistics for data skipping. A change Spark
estimates small (`writes_on_driver`) is collected with Arrow and its files written from the
driver, in the same layout (`_stage`); a large one never passes through the driver. The
delta-spark backend makes its Spark writes with Delta's own operations, and these driver-side
writes (`*_arrow`) with delta-rs, as the embedded backend does.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import (
    AddAction,
    RemoveAction,
)
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.lake.delta_rs.log_commits import (
    check_advances,
    check_unchanged,
    commit_info,
    commit_properties,
    discard,
    publish,
)
from sessionize_assets.lake.delta_rs.log_files import (
    file_partitions,
)
from sessionize_assets.lake.delta_rs.reads import DeltaRsReads
from sessionize_assets.lake.maintenance import STAGING_DIR
from sessionize_assets.lake.parquet_files import FILE_COLUMN, read_files, stage_arrow
from sessionize_assets.lake.placement import laid_out, spread_for_collect
from sessionize_assets.lake.store import (
    AppTransaction,
    CommitInfo,
    LakeError,
    PartitionValue,
    TableSpec,
    WriteConflictError,
    partition_string,
)
from sessionize_assets.lake.table_frames import parquet_options
from sessionize_assets.sql_text import select_columns, sql_identifier

log = logging.getLogger(__name__)

_COMMIT_ATTEMPTS = 5
# The column of row numbers `rewrite_arrow` matches dropped rows by (no table has it).
_ROW_NUMBER = "__row_number"
MAX_ROWS_PER_FILE = 2_000_000

_Touched = tuple[str, str, int]  # a data file a rewrite replaces: path, partition value, size
Staged = tuple[list[_Touched], list[tuple[str, Path]]]  # those, and the new files staged


class DeltaRsTables(DeltaRsReads, ABC):
    """The reads, and the driver-side and staged writes both backends make with delta-rs. A
    backend adds how a table is created and extended (`ensure`), when a change is written from
    the driver (`driver_write_size`), and its Spark writes."""

    @abstractmethod
    def ensure(self, spec: TableSpec) -> None: ...

    @abstractmethod
    def driver_write_size(self, df: DataFrame) -> int | None:
        """Spark's estimate of `df`'s size when a change built from it is written from the
        driver; None when Spark's executors write it."""

    def writes_on_driver(self, df: DataFrame) -> bool:
        return self.driver_write_size(df) is not None

    def rewrites_on_driver(
        self, spec: TableSpec, rows: DataFrame | pa.Table, *, files: Collection[str]
    ) -> bool:
        if isinstance(rows, DataFrame):
            size = self.driver_write_size(rows)
        else:
            size = rows.nbytes if self.collects_on_driver(rows.nbytes) else None
        table = self._table(spec)
        if size is None or table is None:
            return size is not None
        wanted = set(files)
        held = sum(
            file_size
            for path, _, file_size in file_partitions(
                table, spec, _partitions_of(wanted), sizes=True
            )
            if path in wanted
        )
        return self.fits_on_driver(held + size)

    def collects_on_driver(self, size: int) -> bool:
        return self.fits_on_driver(size)

    def fits_on_driver(self, size: int) -> bool:
        """Whether `size` bytes (files read and rows added) are within `driver_write_bytes`."""
        return size <= self._driver_write_bytes

    def _staging(self, spec: TableSpec) -> Path:
        """A new folder to write a commit's files in before they are published: in the
        table's folder (a rename publishes them), or a local temporary one for a table on an
        object store (an upload does)."""
        if self.path(spec).is_local:
            return self.path(spec).local_path() / STAGING_DIR / uuid.uuid4().hex
        return Path(tempfile.mkdtemp(prefix=f"sessionize-{spec.name}-"))

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

    def rewrite_arrow(
        self,
        spec: TableSpec,
        *,
        add: pa.Table | None = None,
        drop: pa.Table | None = None,
        files: Collection[str] = (),
        commit_metadata: Mapping[str, str] | None = None,
        app_transaction: AppTransaction | None = None,
        read_version: int | None = None,
    ) -> CommitInfo:
        """`rewrite` on the driver: the searched files are read and the new ones written with
        Arrow (no Spark job). A concurrent change redoes it, as `rewrite` does."""
        schema = to_arrow_schema(spec.schema)

        def stage(table: DeltaTable, staging: Path) -> Staged:
            touched, kept = self._touched_arrow(spec, table, drop, files)
            added = [] if add is None else [add.select(schema.names).cast(schema)]
            rows = pa.concat_tables([kept, *added])
            return touched, stage_arrow(spec, rows, staging) if rows.num_rows else []

        return self._copy_on_write(spec, stage, commit_metadata, app_transaction, read_version)

    def _copy_on_write(
        self,
        spec: TableSpec,
        stage: Callable[[DeltaTable, Path], Staged],
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
            for path, value, size in file_partitions(table, spec, _partitions_of(files), sizes=True)
        }
        gone = sorted(set(files) - live.keys())
        if gone:
            raise WriteConflictError(
                f"{spec.name}: files {gone[:2]} were replaced since they were chosen; nothing "
                "was committed: a new run redoes the work from the current version"
            )
        names = drop.column_names
        keys = drop.select(names).cast(pa.schema([schema.field(name) for name in names]))
        # One read of all the files (in parallel), then the files that hold a key, then
        # their other rows.
        rows = read_files(self.path(spec), spec, files, schema.names, with_file=True)
        hits = rows.select([*names, FILE_COLUMN]).join(keys, keys=names, join_type="left semi")
        hit_files = pc.unique(hits.column(FILE_COLUMN))
        in_hit_files = rows.filter(pc.is_in(rows.column(FILE_COLUMN), value_set=hit_files))
        # Arrow's joins carry no struct column (`events` has two): the keys are joined with
        # the rows' numbers, and the rows filtered by them, in their order.
        numbers = pa.array(range(in_hit_files.num_rows), pa.int64())
        dropped = (
            in_hit_files.select(names)
            .append_column(_ROW_NUMBER, numbers)
            .join(keys, keys=names, join_type="left semi")
            .column(_ROW_NUMBER)
        )
        kept = in_hit_files.filter(pc.invert(pc.is_in(numbers, value_set=dropped)))
        touched = [(path, *live[path]) for path in sorted(hit_files.to_pylist())]
        return touched, kept.select(schema.names).cast(schema)

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
            rows = rows.join(keys, on=drop_keys.columns, how="left")  # as the caller hints
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
        *,
        size: int,
    ) -> Staged:
        """A small rewrite in one Spark job: the candidate files' rows, marked, and the new
        rows are collected together with Arrow; the files holding a dropped row are found,
        and their other rows kept, on the driver, and the new files written from there."""
        names = spec.schema.fieldNames()
        both = select_columns(marked, [*names, "_file", "_drop"]).unionByName(
            new_rows.selectExpr(
                *map(sql_identifier, names), "CAST(NULL AS STRING) AS _file", "false AS _drop"
            )
        )
        rows = spread_for_collect(both, size).toArrow()
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
            size = self.driver_write_size(df)
            if size is not None:
                schema = to_arrow_schema(spec.schema)
                rows = spread_for_collect(df, size).toArrow()
                return stage_arrow(spec, rows.select(schema.names).cast(schema), staging)
            # Files split every file_rows rows, not one file per upstream task.
            (
                laid_out(spec, df)
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


def _partitions_of(files: Iterable[str]) -> set[str]:
    """The partition values of these relative paths (`column=value/name.parquet`)."""
    return {unquote(f).split("/", 1)[0].split("=", 1)[1] for f in files}
