"""The storage interface every asset uses, independent of how Delta commits are made.

Two backends fit behind it: the embedded one (delta-rs commits the log, Spark moves the data;
works without the Delta jars) and delta-spark on clusters that have the jars. Keep it narrow:
assets only create, read, replace partitions, merge on a key and ask for the version.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, StructType


class LakeError(RuntimeError):
    """A storage operation failed; the table is left at its previous version."""


class WriteConflictError(LakeError):
    """Another commit changed partitions this one writes after the version it was derived
    from (its `read_version`). Nothing was committed: redo the work from the current version.
    """


NOT_CREATED = -1
"""The read version of a table that did not exist when a run read it. A commit made against it
is checked against every commit since the table was created: two runs that both found the
table missing cannot both append the same new rows (`None` means no check at all)."""


@dataclass(frozen=True, kw_only=True)
class TableSpec:
    """A Delta table: its name (folder under the lake), Spark schema and partition column."""

    name: str
    schema: StructType
    partition_by: str
    sort_by: tuple[str, ...] = ()  # order within files: tighter min/max stats for skipping
    # At most this many rows per file. Files of a partition are then contiguous ranges of
    # `sort_by`, so a copy-on-write change rewrites only the ranges holding changed rows.
    file_rows: int | None = None
    # Parquet bloom filters on these columns: an `IN (few values)` filter on one of them skips
    # every row group that cannot hold a value (how a lookup of new ids avoids a scan).
    bloom_filter_columns: tuple[str, ...] = ()
    # Distinct values a bloom filter is sized for (1% false positives), per row group. Unset,
    # the Parquet writer gives every filter its maximum, 1 MiB a row group: more than the data.
    bloom_filter_ndv: int | None = None
    # Parquet row group size: with `sort_by`, a row group is a narrow range of the sort key,
    # so its min/max statistics skip it for a filter on that key.
    row_group_bytes: int | None = None
    # Table maintenance may merge a partition's small files into larger ones. Only for tables
    # whose file layout is not deliberate: compaction keeps neither `sort_by` ranges, nor
    # `file_rows`, nor bloom filters.
    compact: bool = False
    description: str = ""

    def __post_init__(self) -> None:
        names = self.schema.fieldNames()
        if self.partition_by not in names:
            raise ValueError(f"{self.name}: partition column {self.partition_by!r} not in schema")
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: duplicate column names")
        if self.file_rows is not None and (self.file_rows < 1 or not self.sort_by):
            raise ValueError(f"{self.name}: file_rows needs a positive count and a sort_by key")
        unknown = set(self.bloom_filter_columns) - set(names)
        if unknown:
            raise ValueError(f"{self.name}: bloom filter columns {sorted(unknown)} not in schema")
        if self.bloom_filter_columns and not (self.bloom_filter_ndv or 0) > 0:
            raise ValueError(f"{self.name}: bloom filters need a positive bloom_filter_ndv")

    @property
    def partition_is_date(self) -> bool:
        return isinstance(self.schema[self.partition_by].dataType, DateType)


PartitionValue = date | str
# Wanted values (of a column) per partition value: keyed by dates or by their strings.
ValuesByPartition = Mapping[date, Collection[str]] | Mapping[str, Collection[str]]


def partition_string(value: PartitionValue) -> str:
    """The form Delta stores partition values in (ISO dates)."""
    return value.isoformat() if isinstance(value, date) else str(value)


def empty_frame(spark: SparkSession, schema: StructType | str) -> DataFrame:
    """A frame of no rows that Spark's optimizer knows is empty (a local relation of size 0).

    `createDataFrame([])` alone is an RDD that Spark cannot size: it reckons it at
    `spark.sql.defaultSizeInBytes` (2^63), so a write whose rows include it is sent to
    Spark's writer (`driver_write_bytes`), and a join with it is never broadcast.
    """
    return spark.createDataFrame([], schema).where(F.lit(False))


@dataclass(frozen=True, kw_only=True)
class FileChange:
    """A data file that a commit added or removed (compaction, which changes no rows, is not)."""

    path: str  # relative to the table root
    partition: str
    version: int  # the commit
    added: bool
    size: int | None = None  # bytes, when the log says (a remove action may not)


@dataclass(frozen=True, kw_only=True)
class AppTransaction:
    """Delta's idempotent-commit marker (a `txn` action): `app_id` has applied up to `version`.

    It is committed in the same atomic commit as the data it accounts for, so "what has this
    table absorbed" is read from the table itself (`DeltaStore.applied_version`), never from a
    run that may have died between two commits.

    A commit records at most one, and its version must be above the one `app_id` recorded
    before (else `LakeError`, nothing committed): Delta Spark sets one per commit
    (`txnAppId` / `txnVersion`) and skips, without an error, a write whose version is not
    above the recorded one. Both backends keep that contract.
    """

    app_id: str
    version: int


@dataclass(frozen=True, kw_only=True)
class CommitInfo:
    """What one commit did; assets put it in their materialization metadata."""

    table: str
    version: int | None
    partitions: tuple[str, ...]
    files_added: int = 0
    files_removed: int = 0
    rows_written: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class MaintenanceResult:
    """What maintenance did to one table."""

    table: str
    version: int | None  # the table's version afterwards (a checkpoint is written for it)
    files_compacted: int = 0  # small files merged (removed from the table, not yet deleted)
    files_written: int = 0  # the files they were merged into
    files_deleted: int = 0  # files no version within the retention period reads, deleted


class DeltaStore(Protocol):
    """What assets may do with the lake."""

    def uri(self, spec: TableSpec) -> str: ...

    def exists(self, spec: TableSpec) -> bool: ...

    def ensure(self, spec: TableSpec) -> None:
        """Create the table if it is missing, or add the spec's new columns to it."""
        ...

    def read(
        self, spec: TableSpec, *, partitions: Iterable[PartitionValue] | None = None
    ) -> DataFrame:
        """The live rows, pruned to `partitions` when given (an empty frame if none)."""
        ...

    def replace_partitions(
        self,
        spec: TableSpec,
        df: DataFrame,
        *,
        partitions: Iterable[PartitionValue],
        commit_metadata: Mapping[str, str] | None = None,
        read_version: int | None = None,
    ) -> CommitInfo:
        """Atomically make `partitions` hold exactly `df` (replaceWhere semantics).

        Partitions listed but absent from `df` become empty; a row outside `partitions` is an
        error and nothing is committed. `read_version` is the version of this table that `df`
        was derived from (a read-modify-write, `read_version(spec)`): if a later commit changed
        one of `partitions`, nothing is committed and `WriteConflictError` is raised; with
        an `app_transaction` (a mark of the whole table), any later commit does. The check and
        the commit are one step: the commit is made at the version checked, or checked again
        (delta-spark: one step for the writers of a process, see `lake/delta_spark/store.py`).
        """
        ...

    def read_arrow(
        self,
        spec: TableSpec,
        *,
        partitions: Iterable[PartitionValue] | None = None,
        columns: Sequence[str] | None = None,
        where: pc.Expression | None = None,
    ) -> pa.Table:
        """A small table, or a few partitions of one, read on the driver (no Spark job);
        only `columns` when given, and only the rows `where` holds for (filtered as the files
        are read: a lookup in a large table holds its matches only)."""
        ...

    def read_files_arrow(
        self,
        spec: TableSpec,
        paths: Iterable[str],
        *,
        columns: Sequence[str],
        with_file: bool = False,
    ) -> pa.Table:
        """`read_files` on the driver: `columns` of the rows of these data files, and with
        `with_file` the path of each row's file (`parquet_files.FILE_COLUMN`)."""
        ...

    def writes_on_driver(self, df: DataFrame) -> bool:
        """Whether a change built from `df` is small enough to be collected once and written
        with the `*_arrow` methods: on the embedded backend, when Spark's size estimate of
        `df` (its inputs, no job) is at most `driver_write_bytes`; never on the delta-spark
        backend, which writes its data tables with Delta Spark."""
        ...

    def collects_on_driver(self, size: int) -> bool:
        """Whether a change of `size` bytes, known exactly (a landing batch's text), is
        collected once and written with the `*_arrow` methods: on the embedded backend, when
        it is at most `driver_write_bytes`; never on the delta-spark backend."""
        ...

    def rewrites_on_driver(
        self, spec: TableSpec, rows: DataFrame | pa.Table, *, files: Collection[str]
    ) -> bool:
        """Whether a rewrite of `files` (relative paths) that adds a change built from `rows`
        fits the driver, for `rewrite_arrow`: on the embedded backend, when the files' bytes on
        disk (from the log) and Spark's estimate of `rows` (or the Arrow rows' own size)
        together are at most `driver_write_bytes`, the bound `rewrite` itself collects within;
        never on the delta-spark backend."""
        ...

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
        """`replace_partitions` for small bookkeeping rows built on the driver.

        `app_transaction` is recorded in the same commit.
        """
        ...

    def merge(
        self,
        spec: TableSpec,
        df: DataFrame,
        *,
        keys: Sequence[str],
        search_partitions: Iterable[PartitionValue] | None = None,
        commit_metadata: Mapping[str, str] | None = None,
    ) -> CommitInfo:
        """Upsert `df` on `keys` in one commit: matching rows are replaced, others inserted.

        `search_partitions` limits where existing matches are looked for (None: everywhere).
        """
        ...

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
        """Drop matching rows in `partitions` and add `add()`'s rows in one commit.

        Only files holding dropped rows are rewritten; `files` (relative paths), when given,
        are the only ones searched for such rows. `drop_keys` are joined with the searched
        rows as the caller hints them (`keyed_reads.keys_for_join`: a broadcast holds them all
        on the driver). A concurrent change redoes the whole rewrite from a fresh snapshot.
        With an `app_transaction`, the commit is made even when no row changes: it then records
        only that marker. With `read_version`, a commit after it that changed a partition this
        one writes or removes from raises `WriteConflictError`, as for `replace_partitions`.
        """
        ...

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
        """`rewrite` for a few rows built on the driver: the rows equal to a row of `drop` (on
        all of its columns) are removed from `files` (relative paths, the only files searched),
        which are rewritten with their other rows if they held one, and `add`'s rows (None:
        none) are appended, in one commit. `app_transaction` and `read_version` as for `rewrite`; a
        file that is no longer live raises `WriteConflictError`.
        """
        ...

    def live_files(
        self, spec: TableSpec, *, partitions: Iterable[PartitionValue] | None = None
    ) -> list[str]:
        """Data files of the current version (for metadata and tests)."""
        ...

    def row_counts(
        self, spec: TableSpec, *, partitions: Iterable[PartitionValue] | None = None
    ) -> dict[str, int]:
        """Rows per partition value, from the Delta log's statistics."""
        ...

    def partition_files(
        self, spec: TableSpec, *, partitions: Iterable[PartitionValue] | None = None
    ) -> dict[str, list[str]]:
        """Per partition value, its live data files (relative paths, sorted), from the log:
        a partition's rows can only have changed if this list did."""
        ...

    def changes(
        self, spec: TableSpec, *, since_version: int, through_version: int
    ) -> list[FileChange] | None:
        """Files added or removed by the commits after `since_version` through
        `through_version`, oldest first.

        None when that history is no longer available (log entries or removed files cleaned
        up): the caller must then treat everything as changed.
        """
        ...

    def files_with_values(
        self,
        spec: TableSpec,
        *,
        column: str,
        values: ValuesByPartition,
        whole: Iterable[PartitionValue] = (),
    ) -> list[str]:
        """Live files (relative paths) that can hold rows with these values of `column`.

        `values` gives, per partition, the wanted values (a date's as its ISO text): a file is
        kept when the min..max of `column` in its log statistics includes one of them (or it
        has no statistics). Every file of the `whole` partitions is kept. Read on the driver
        from the log: no data.
        """
        ...

    def read_files(
        self, spec: TableSpec, paths: Iterable[str], *, with_file: bool = False
    ) -> DataFrame:
        """The rows of these data files (relative paths), live or removed but not yet vacuumed.
        `with_file` adds `_file`: Spark's URI of the file each row is in (`files_named` maps
        it back to the relative path)."""
        ...

    def version(self, spec: TableSpec) -> int | None: ...

    def read_version(self, spec: TableSpec) -> int:
        """The version a run reads `spec` at, for its later commits' `read_version`:
        `NOT_CREATED` when the table does not exist yet."""
        ...

    def applied_version(self, spec: TableSpec, app_id: str) -> int | None:
        """The version the latest `AppTransaction` of `app_id` recorded (None: never)."""
        ...

    def history(self, spec: TableSpec, *, limit: int | None = None) -> list[dict[str, Any]]: ...

    def maintain(self, spec: TableSpec, *, retention: timedelta) -> MaintenanceResult:
        """Merge small files (when `spec.compact`), write a checkpoint, and delete the files
        that no version committed within `retention` reads. Readers of any such version, the
        current one included, are unaffected; a compaction changes no row."""
        ...
