"""Delta tables without the Delta jars: Spark writes Parquet, delta-rs commits the log.

Spark writes each change to a staging folder under the table (ignored by Delta readers because
it starts with `_`), the files are renamed into `col=value/` folders, and one delta-rs
transaction adds them and removes the replaced partitions' files. Until that commit succeeds
the table is unchanged; on failure the new files are deleted. Table data never passes through
the driver: only Parquet footers are read, to give the log real statistics for data skipping.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, Field, Schema
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import (
    AddAction,
    CommitProperties,
    RemoveAction,
    create_table_with_add_actions,
)
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.lake.store import (
    CommitInfo,
    LakeError,
    PartitionValue,
    TableSpec,
    partition_string,
)

log = logging.getLogger(__name__)

_STAGING = "_staging"
_MAX_STRING_STAT = 32  # Delta's default prefix length for string statistics
_COMMIT_ATTEMPTS = 5
_MAX_ROWS_PER_FILE = 2_000_000


def delta_schema(spec: TableSpec) -> Schema:
    return Schema.from_arrow(to_arrow_schema(spec.schema))


class EmbeddedDeltaStore:
    """`DeltaStore` for local mode or any cluster whose executors share the lake's file system."""

    def __init__(self, *, spark: SparkSession, lake_dir: Path | str) -> None:
        self._spark = spark
        self._lake_dir = Path(lake_dir).absolute()

    # -- paths and table state ---------------------------------------------------------------

    def path(self, spec: TableSpec) -> Path:
        return self._lake_dir / spec.name

    def uri(self, spec: TableSpec) -> str:
        return self.path(spec).as_uri()

    def exists(self, spec: TableSpec) -> bool:
        return DeltaTable.is_deltatable(str(self.path(spec)))

    def _table(self, spec: TableSpec) -> DeltaTable | None:
        try:
            return DeltaTable(str(self.path(spec)))
        except TableNotFoundError:
            return None

    def version(self, spec: TableSpec) -> int | None:
        table = self._table(spec)
        return None if table is None else table.version()

    def history(self, spec: TableSpec, *, limit: int | None = None) -> list[dict[str, Any]]:
        table = self._table(spec)
        return [] if table is None else table.history(limit)

    def ensure(self, spec: TableSpec) -> None:
        table = self._table(spec)
        if table is None:
            self._create(spec)
            return
        self._check_partitioning(spec, table)
        existing = {f.name: f for f in table.schema().fields}
        wanted = delta_schema(spec).fields
        new_fields = [f for f in wanted if f.name not in existing]
        changed = [f.name for f in wanted if f.name in existing and existing[f.name].type != f.type]
        if changed:
            raise LakeError(
                f"{spec.name}: columns {changed} changed type; only adding columns is supported"
            )
        if new_fields:
            # Added columns must be nullable: files written before them hold no values.
            table.alter.add_columns(
                [Field(f.name, f.type, nullable=True, metadata=f.metadata) for f in new_fields]
            )
            log.info("%s: added columns %s", spec.name, [f.name for f in new_fields])

    def _check_partitioning(self, spec: TableSpec, table: DeltaTable) -> None:
        found = list(table.metadata().partition_columns)
        if found != [spec.partition_by]:
            raise LakeError(
                f"{spec.name} at {self.path(spec)} is partitioned by {found}, "
                f"expected [{spec.partition_by!r}]"
            )

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
            return self._spark.createDataFrame([], spec.schema)
        df = (
            self._spark.read.schema(spec.schema)
            .option("basePath", str(self.path(spec)))
            .parquet(*files)
        )
        return df.select(*spec.schema.fieldNames())

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
        files = [
            str(root / unquote(path))
            for path, value in _file_partitions(table, spec)
            if wanted is None or value in wanted
        ]
        return sorted(files)

    def row_counts(
        self, spec: TableSpec, *, partitions: Iterable[PartitionValue] | None = None
    ) -> dict[str, int]:
        """Rows per partition from the log's file statistics: no data is read."""
        table = self._table(spec)
        if table is None:
            return {}
        wanted = None if partitions is None else {partition_string(p) for p in partitions}
        actions = pa.table(table.get_add_actions(flatten=True))
        counts: dict[str, int] = {}
        for value, rows in zip(
            actions.column(f"partition.{spec.partition_by}").to_pylist(),
            actions.column("num_records").to_pylist(),
            strict=True,
        ):
            key = partition_string(value)
            if wanted is None or key in wanted:
                counts[key] = counts.get(key, 0) + int(rows or 0)
        return dict(sorted(counts.items()))

    def partition_values(self, spec: TableSpec) -> list[str]:
        table = self._table(spec)
        if table is None:
            return []
        return sorted({value for _, value in _file_partitions(table, spec)})

    # -- writing -----------------------------------------------------------------------------

    def replace_partitions(
        self,
        spec: TableSpec,
        df: DataFrame,
        *,
        partitions: Iterable[PartitionValue],
        commit_metadata: Mapping[str, str] | None = None,
    ) -> CommitInfo:
        aligned = _align(spec, df)
        return self._replace(
            spec,
            partitions,
            lambda staging: self._stage(spec, aligned, staging),
            commit_metadata,
        )

    def read_arrow(
        self, spec: TableSpec, *, partitions: Iterable[PartitionValue] | None = None
    ) -> pa.Table:
        """A small bookkeeping table (or some partitions of it), read on the driver."""
        table = self._table(spec)
        schema = to_arrow_schema(spec.schema)
        if table is None:
            return schema.empty_table()
        wanted = None if partitions is None else sorted({partition_string(p) for p in partitions})
        if wanted == []:
            return schema.empty_table()
        filters = None if wanted is None else [(spec.partition_by, "in", wanted)]
        data = pa.table(table.to_pyarrow_table(filters=filters))
        return data.select(schema.names).cast(schema)

    def replace_partitions_arrow(
        self,
        spec: TableSpec,
        data: pa.Table,
        *,
        partitions: Iterable[PartitionValue],
        commit_metadata: Mapping[str, str] | None = None,
    ) -> CommitInfo:
        """`replace_partitions` for small bookkeeping rows built on the driver: no Spark job."""
        schema = to_arrow_schema(spec.schema)
        data = data.select(schema.names).cast(schema)
        return self._replace(
            spec,
            partitions,
            lambda staging: _stage_arrow(spec, data, staging),
            commit_metadata,
        )

    def _replace(
        self,
        spec: TableSpec,
        partitions: Iterable[PartitionValue],
        stage: Callable[[Path], list[tuple[str, Path]]],
        commit_metadata: Mapping[str, str] | None,
    ) -> CommitInfo:
        targets = sorted({partition_string(p) for p in partitions})
        if not targets:
            return CommitInfo(table=spec.name, version=self.version(spec), partitions=())
        self.ensure(spec)
        staging = self.path(spec) / _STAGING / uuid.uuid4().hex
        staged = stage(staging)
        try:
            outside = sorted({value for value, _ in staged} - set(targets))
            if outside:
                raise LakeError(
                    f"{spec.name}: rows for partitions {outside[:5]} outside the replaced "
                    f"partitions {targets[:5]}{'...' if len(targets) > 5 else ''}"
                )
            adds = self._publish(spec, staged)
            version, removed = self._commit(spec, adds, targets, commit_metadata)
        except BaseException:
            self._discard(spec, staged)
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return _commit_info(spec, version, targets, adds, removed)

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
        if not keys:
            raise ValueError("merge needs at least one key column")
        incoming = _align(spec, df)
        if incoming.groupBy(*keys).count().where(F.col("count") > 1).limit(1).count():
            raise LakeError(f"{spec.name}: merge source has duplicate keys {list(keys)}")
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
        commit_metadata: Mapping[str, str] | None = None,
    ) -> CommitInfo:
        """Copy-on-write at file granularity: drop rows, add rows, one commit.

        Rows in `partitions` (None: all) that match `drop` or whose columns match a row of
        `drop_keys` are removed; only the files holding them are rewritten, with their other
        rows. `add()` supplies new rows (anywhere). The commit is made against the snapshot
        that was read, so a concurrent change makes it fail; the whole rewrite is then redone
        from a fresh snapshot, calling `add()` again.
        """
        self.ensure(spec)
        searched = None if partitions is None else sorted({partition_string(p) for p in partitions})
        for attempt in range(1, _COMMIT_ATTEMPTS + 1):
            table = self._table(spec)
            assert table is not None
            touched, kept = self._touched_files(spec, table, searched, drop, drop_keys)
            new_rows = _align(spec, add())
            if kept is not None:
                new_rows = kept.unionByName(new_rows)
            staging = self.path(spec) / _STAGING / uuid.uuid4().hex
            staged = self._stage(spec, new_rows, staging)
            try:
                adds = self._publish(spec, staged)
                if not adds and not touched:
                    return CommitInfo(table=spec.name, version=table.version(), partitions=())
                removes = [
                    RemoveAction(path, True, int(time.time() * 1000), size, {spec.partition_by: v})
                    for path, v, size in touched
                ]
                table.create_write_transaction(
                    [*adds, *removes],
                    mode="append",
                    schema=table.schema(),
                    partition_by=[spec.partition_by],
                    commit_properties=CommitProperties(custom_metadata=dict(commit_metadata or {})),
                )
            except CommitFailedError as exc:
                self._discard(spec, staged)
                if attempt == _COMMIT_ATTEMPTS:
                    raise LakeError(f"{spec.name}: rewrite kept conflicting") from exc
                log.warning("%s: concurrent change (attempt %d), redoing", spec.name, attempt)
                time.sleep(0.05 * attempt)
                continue
            except BaseException:
                self._discard(spec, staged)
                raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            return _commit_info(
                spec,
                DeltaTable(str(self.path(spec))).version(),
                {v for v, _ in staged} | {v for _, v, _ in touched},
                adds,
                len(touched),
            )
        raise LakeError(f"{spec.name}: could not commit")  # pragma: no cover

    def _touched_files(
        self,
        spec: TableSpec,
        table: DeltaTable,
        searched: list[str] | None,
        drop: Column | None,
        drop_keys: DataFrame | None,
    ) -> tuple[list[tuple[str, str, int]], DataFrame | None]:
        """Files of the snapshot holding rows to drop, and those files' rows to keep."""
        if drop is None and drop_keys is None:
            return [], None
        root = self.path(spec)
        candidates = {
            str(root / unquote(path)): (path, value, size)
            for path, value, size in _file_partitions(table, spec, sizes=True)
            if searched is None or value in searched
        }
        if not candidates:
            return [], None
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
        marked = rows.withColumn("_drop", hit)
        hit_uris = {r[0] for r in marked.where("_drop").select("_file").distinct().collect()}
        hit_files = {unquote(urlparse(uri).path): uri for uri in hit_uris}
        unknown = hit_files.keys() - candidates.keys()
        if unknown:
            raise LakeError(f"{spec.name}: cannot map Spark file paths {sorted(unknown)[:2]}")
        touched = [candidates[path] for path in sorted(hit_files)]
        kept = marked.where(~F.col("_drop") & F.col("_file").isin(sorted(hit_uris)))
        return touched, kept.select(*spec.schema.fieldNames())

    def _stage(self, spec: TableSpec, df: DataFrame, staging: Path) -> list[tuple[str, Path]]:
        try:
            # One task per partition value: a file per partition (split past the row cap)
            # rather than one per upstream task.
            if spec.buckets > 1:
                # Spread each partition over a few files by key hash, so a rewrite of some
                # keys leaves the other files alone.
                bucket = F.pmod(F.xxhash64(*spec.sort_by[:1]), F.lit(spec.buckets))
                df = df.repartition(spec.buckets, spec.partition_by, bucket)
            else:
                df = df.repartition(spec.partition_by)
            (
                df.sortWithinPartitions(spec.partition_by, *spec.sort_by)
                .write.option("maxRecordsPerFile", _MAX_ROWS_PER_FILE)
                .partitionBy(spec.partition_by)
                .parquet(str(staging))
            )
        except Exception as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise LakeError(f"{spec.name}: writing data files failed: {exc}") from exc
        staged = []
        for folder in sorted(staging.glob(f"{spec.partition_by}=*")):
            value = unquote(folder.name.split("=", 1)[1])
            if value == "__HIVE_DEFAULT_PARTITION__":
                shutil.rmtree(staging, ignore_errors=True)
                raise LakeError(f"{spec.name}: rows with a null {spec.partition_by}")
            staged.extend((value, file) for file in sorted(folder.glob("*.parquet")))
        return staged

    def _publish(self, spec: TableSpec, staged: list[tuple[str, Path]]) -> list[AddAction]:
        """Move staged files to their partition folders and describe them for the log."""
        root = self.path(spec)
        adds = []
        for value, file in staged:
            relative = f"{spec.partition_by}={value}/{file.name}"
            target = root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(file, target)
            stat = target.stat()
            adds.append(
                AddAction(
                    relative,
                    stat.st_size,
                    {spec.partition_by: value},
                    int(stat.st_mtime * 1000),
                    True,
                    json.dumps(_file_stats(target)),
                )
            )
        return adds

    def _commit(
        self,
        spec: TableSpec,
        adds: list[AddAction],
        targets: list[str],
        commit_metadata: Mapping[str, str] | None,
    ) -> tuple[int, int]:
        properties = CommitProperties(custom_metadata=dict(commit_metadata or {}))
        for attempt in range(1, _COMMIT_ATTEMPTS + 1):
            table = self._table(spec)
            if table is None:
                raise LakeError(f"{spec.name}: table vanished at {self.path(spec)}")
            removed = len(self.live_files(spec, partitions=targets))
            try:
                table.create_write_transaction(
                    adds,
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
            return DeltaTable(str(self.path(spec))).version(), removed
        raise LakeError(f"{spec.name}: could not commit")  # pragma: no cover

    def _discard(self, spec: TableSpec, staged: list[tuple[str, Path]]) -> None:
        root = self.path(spec)
        for value, file in staged:
            for candidate in (file, root / f"{spec.partition_by}={value}" / file.name):
                candidate.unlink(missing_ok=True)


def _commit_info(
    spec: TableSpec, version: int, partitions: Iterable[str], adds: list[AddAction], removed: int
) -> CommitInfo:
    return CommitInfo(
        table=spec.name,
        version=version,
        partitions=tuple(sorted(partitions)),
        files_added=len(adds),
        files_removed=removed,
        rows_written=sum(json.loads(a.stats)["numRecords"] for a in adds),
    )


def _stage_arrow(spec: TableSpec, data: pa.Table, staging: Path) -> list[tuple[str, Path]]:
    """Write one Parquet file per partition value, laid out as Spark would."""
    staged = []
    column = spec.partition_by
    values = data.column(column).to_pylist()
    if any(v is None for v in values):
        raise LakeError(f"{spec.name}: rows with a null {column}")
    order = sorted(range(len(values)), key=lambda i: partition_string(values[i]))
    data = data.take(pa.array(order, type=pa.int64()))
    for value in sorted({partition_string(v) for v in values}):
        mask = pa.array([partition_string(v) == value for v in data.column(column).to_pylist()])
        part = data.filter(mask).drop_columns([column])
        folder = staging / f"{column}={value}"
        folder.mkdir(parents=True, exist_ok=True)
        file = folder / f"part-{uuid.uuid4().hex}.snappy.parquet"
        pq.write_table(part, file, compression="snappy", coerce_timestamps="us")
        staged.append((value, file))
    return staged


def _file_partitions(table: DeltaTable, spec: TableSpec, *, sizes: bool = False) -> list[tuple]:
    """(path, partition value[, size]) of every live file."""
    actions = pa.table(table.get_add_actions(flatten=True))
    paths = actions.column("path").to_pylist()
    values = [
        partition_string(v) for v in actions.column(f"partition.{spec.partition_by}").to_pylist()
    ]
    if not sizes:
        return list(zip(paths, values, strict=True))
    return list(zip(paths, values, actions.column("size_bytes").to_pylist(), strict=True))


def _align(spec: TableSpec, df: DataFrame) -> DataFrame:
    missing = [name for name in spec.schema.fieldNames() if name not in df.columns]
    if missing:
        raise LakeError(f"{spec.name}: data is missing columns {missing}")
    return df.select(*(F.col(f.name).cast(f.dataType).alias(f.name) for f in spec.schema))


def _file_stats(path: Path) -> dict[str, Any]:
    """numRecords, min/max and null counts from the Parquet footer (Delta's stats format)."""
    metadata = pq.read_metadata(path)
    schema = metadata.schema.to_arrow_schema()
    stats: dict[str, Any] = {"numRecords": metadata.num_rows}
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for index, arrow_field in enumerate(schema):
        if pa.types.is_nested(arrow_field.type):
            continue
        low = high = None
        null_count = 0
        complete = metadata.num_row_groups > 0
        for group in range(metadata.num_row_groups):
            column = metadata.row_group(group).column(index)
            s = column.statistics
            if s is None or not s.has_null_count:
                complete = False
                break
            null_count += s.null_count
            if s.has_min_max:
                low = s.min if low is None else min(low, s.min)
                high = s.max if high is None else max(high, s.max)
        if not complete:
            continue
        nulls[arrow_field.name] = null_count
        if low is None or pa.types.is_boolean(arrow_field.type):
            continue
        low_json, high_json = _stat_value(low, up=False), _stat_value(high, up=True)
        if low_json is not None and high_json is not None:
            mins[arrow_field.name] = low_json
            maxs[arrow_field.name] = high_json
    stats.update(minValues=mins, maxValues=maxs, nullCount=nulls)
    return stats


def _stat_value(value: Any, *, up: bool) -> Any:
    """JSON form of a statistic; timestamps at millisecond precision, rounded outward."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        floor = value.replace(microsecond=value.microsecond // 1000 * 1000)
        if up and floor != value:
            floor += timedelta(milliseconds=1)
        return floor.strftime("%Y-%m-%dT%H:%M:%S.") + f"{floor.microsecond // 1000:03d}Z"
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if isinstance(value, str):
        return value if len(value) <= _MAX_STRING_STAT else None
    if isinstance(value, int | float):
        return value
    return None
