"""Delta tables written by Delta Lake's own Spark operations (the `delta-spark` backend).

Every change of a table made from a Spark DataFrame is one Delta Spark operation, so its commit
is Delta's own (`engineInfo` Delta-Lake/4.0.x in the log), with Delta's conflict checks and
nothing staged or renamed outside it:
- `replace_partitions`: an overwrite with `replaceWhere` on the partition values, which Delta
  checks every written row against (a row outside them commits nothing);
- `rewrite`: one `MERGE` whose source is the rows to add and markers of the rows to drop
  (`_merge_source`); Delta rewrites the files holding dropped rows, with their other rows;
  a rewrite that drops nothing is an append;
- `merge`: a `MERGE` that updates the rows matching on the keys and inserts the others;
- `maintain`: `OPTIMIZE` and `VACUUM`.

The rest is the embedded store's, through delta-rs on the driver, so it needs no Spark job: the
reads (the files the log names), the log's bookkeeping (versions, changes, file statistics,
history) and the writes of small tables built on the driver (`*_arrow`). Both engines write
tables at protocol (1, 2) with no table features, so each reads and writes the other's.

The bookkeeping of a commit rides on Delta Spark's session settings, set for that one write:
- its metadata is the commit's `userMetadata`, one JSON object (`history` lifts its keys);
- an `AppTransaction` is the write's `txnAppId` / `txnVersion` (one per commit);
- a `read_version` is checked against the log before the operation starts
  (`check_unchanged`), and Delta's conflict detection covers the operation itself, from the
  snapshot it reads. A commit that lands between the two (milliseconds, and only from writers
  that do not take the lake's writer lock) is found right after the commit and reported.
"""

from __future__ import annotations

import json
import logging
import operator
import re
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import date, timedelta
from functools import reduce
from typing import Any

from delta.tables import DeltaTable as SparkDeltaTable
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from sessionize_assets.lake.embedded import (
    MAX_ROWS_PER_FILE,
    EmbeddedDeltaStore,
    align,
    merge_source,
    parquet_options,
)
from sessionize_assets.lake.log_commits import changed_partitions, check_advances, check_unchanged
from sessionize_assets.lake.log_files import commit_of, commits, with_user_metadata
from sessionize_assets.lake.maintenance import MAINTENANCE_METADATA, checkpoint_and_report
from sessionize_assets.lake.store import (
    AppTransaction,
    CommitInfo,
    LakeError,
    MaintenanceResult,
    PartitionValue,
    TableSpec,
    WriteConflictError,
    partition_string,
)
from sessionize_assets.sql_text import sql_identifier

log = logging.getLogger(__name__)

# Delta Spark's session settings for the next commit's bookkeeping.
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
# Rows per file. Delta passes a writer only this option and the codec, so it and the Parquet
# settings (`parquet_options`: row group size, bloom filters) are set on the session, whose
# settings every Parquet writer of the write reads, MERGE's included.
MAX_RECORDS_CONF = "spark.sql.files.maxRecordsPerFile"
# The key of the commit metadata that tells this store's commit from any other.
WRITE_ID = "sessionize.write_id"
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
_SOURCE = "_source_"
_MATCH = "_source_match"
_BY_PREDICATE = "\u0000predicate"  # no JSON object (a key's form) equals it

_CAUSE = re.compile(r"^[A-Za-z_.]*(Error|Exception): ")
_ATTEMPTS = 5  # of a rewrite that Delta's conflict detection fails
# One write at a time in a process: the session settings a write sets are the process's, and
# its read version is checked and its commit made with no write of this process in between.
_WRITE_LOCK = threading.RLock()


class _DeltaConflict(WriteConflictError):
    """Delta's conflict detection failed the commit (not the check of a read version)."""


class DeltaSparkStore(EmbeddedDeltaStore):
    """`DeltaStore` whose Spark writes are Delta Spark's operations: for clusters with the
    Delta jars (`make jars`) and the session's `DELTA_CONF` (the resource sets both). The
    lake may be on an object store (`s3a://`, ...): Delta writes its files, and the driver's
    small writes upload theirs (`log_commits.publish`)."""

    OBJECT_STORAGE = True

    def ensure(self, spec: TableSpec) -> None:
        table = self._table(spec)
        if table is None:
            self._create(spec)
            return
        new_fields = self._new_fields(spec, table)
        if not new_fields:
            return
        added = {f.name for f in new_fields}
        # Added columns must be nullable: files written before them hold no values.
        schema = StructType(
            [
                StructField(f.name, f.dataType, f.nullable or f.name in added, f.metadata)
                for f in spec.schema
            ]
        )
        empty = self._spark.createDataFrame([], schema)
        with _WRITE_LOCK, self._settings(spec, metadata={"operation": "add columns"}):
            empty.write.format("delta").mode("append").option("mergeSchema", "true").save(
                self._location(spec)
            )

    def _create(self, spec: TableSpec) -> bool:
        """Create the empty table with Delta Spark; False if another writer created it first."""
        builder = (
            SparkDeltaTable.createIfNotExists(self._spark)
            .location(self._location(spec))
            .addColumns(spec.schema)
            .partitionedBy(spec.partition_by)
        )
        if spec.description:
            builder = builder.comment(spec.description)
        try:
            builder.execute()
        except Exception:
            if self.exists(spec):
                return False
            raise
        return True

    # -- writing -----------------------------------------------------------------------------

    def writes_on_driver(self, df: DataFrame) -> bool:
        return False

    def replace_partitions(
        self,
        spec: TableSpec,
        df: DataFrame,
        *,
        partitions: Iterable[PartitionValue],
        commit_metadata: Mapping[str, str] | None = None,
        read_version: int | None = None,
    ) -> CommitInfo:
        targets = sorted({partition_string(p) for p in partitions})
        if not targets:
            return CommitInfo(table=spec.name, version=self.version(spec), partitions=())
        writer = (
            _laid_out(spec, align(spec, df))
            .write.format("delta")
            .mode("overwrite")
            .option("replaceWhere", _partitions_predicate(spec, targets))
        )
        return self._write(
            spec,
            lambda: writer.save(self._location(spec)),
            searched=targets,
            commit_metadata=commit_metadata,
            read_version=read_version,
        )

    def merge(
        self,
        spec: TableSpec,
        df: DataFrame,
        *,
        keys: Sequence[str],
        search_partitions: Iterable[PartitionValue] | None = None,
        commit_metadata: Mapping[str, str] | None = None,
    ) -> CommitInfo:
        """Upsert on `keys` with Delta's MERGE (update matches, insert the rest)."""
        incoming = merge_source(spec, df, keys)
        searched = (
            None
            if search_partitions is None
            else sorted({partition_string(p) for p in search_partitions})
        )
        condition = reduce(operator.and_, (F.col(f"t.{k}") == F.col(f"s.{k}") for k in keys))
        if searched is not None:
            condition = condition & F.col(f"t.{spec.partition_by}").isin(
                _partition_literals(spec, searched)
            )

        def write() -> None:
            (
                self._delta_table(spec)
                .alias("t")
                .merge(incoming.alias("s"), condition)
                .whenMatchedUpdateAll()
                .whenNotMatchedInsertAll()
                .execute()
            )

        return self._write(spec, write, searched=searched, commit_metadata=commit_metadata)

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
        """Drop and add in one Delta operation. `files` only narrows where the embedded store
        looks: a MERGE finds the rows to drop itself, in `partitions`, and the files holding
        them are the ones Delta rewrites."""
        searched = None if partitions is None else sorted({partition_string(p) for p in partitions})
        if searched == [] or (files is not None and not files):
            drop = drop_keys = None  # nowhere to drop from: an append
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                return self._drop_and_add(
                    spec,
                    align(spec, add()),
                    drop=drop,
                    drop_keys=drop_keys,
                    searched=searched if drop is not None or drop_keys is not None else [],
                    commit_metadata=commit_metadata,
                    app_transaction=app_transaction,
                    read_version=read_version,
                )
            except _DeltaConflict:
                # Delta's own check failed the commit: with no read version to hold to,
                # redo the whole rewrite from the snapshot now current, as the embedded one.
                if read_version is not None or attempt == _ATTEMPTS:
                    raise
                log.warning("%s: concurrent change (attempt %d), redoing", spec.name, attempt)
        raise LakeError(f"{spec.name}: could not commit")  # pragma: no cover

    def _drop_and_add(
        self,
        spec: TableSpec,
        new_rows: DataFrame,
        *,
        drop: Column | None,
        drop_keys: DataFrame | None,
        searched: Sequence[str] | None,
        commit_metadata: Mapping[str, str] | None,
        app_transaction: AppTransaction | None,
        read_version: int | None,
    ) -> CommitInfo:
        """One attempt of `rewrite`: a MERGE, or an append when nothing is dropped."""
        if drop is None and drop_keys is None:
            writer = _laid_out(spec, new_rows).write.format("delta").mode("append")

            def write() -> None:
                writer.save(self._location(spec))
        else:
            source, condition = _merge_source(spec, new_rows, drop, drop_keys, searched)

            def write() -> None:
                (
                    self._delta_table(spec)
                    .alias("t")
                    .merge(source, condition)
                    .whenMatchedDelete()
                    .whenNotMatchedInsert(
                        condition=F.col(_MATCH).isNull(),
                        values={f.name: F.col(_SOURCE + f.name) for f in spec.schema},
                    )
                    .execute()
                )

        def added() -> set[str]:
            values = new_rows.select(spec.partition_by).distinct().collect()
            return {partition_string(row[0]) for row in values}

        return self._write(
            spec,
            write,
            searched=searched,
            added=added,
            commit_metadata=commit_metadata,
            app_transaction=app_transaction,
            read_version=read_version,
        )

    # -- maintenance ---------------------------------------------------------------------------

    def maintain(self, spec: TableSpec, *, retention: timedelta) -> MaintenanceResult:
        """Delta Spark's OPTIMIZE (when `spec.compact`) and VACUUM, so the table's every commit
        stays Delta Spark's; then a checkpoint of the version they leave (delta-rs, which
        writes no commit) and the clean-up of stale staging folders (`maintenance.py`)."""
        if not self.exists(spec):
            return MaintenanceResult(table=spec.name, version=None)
        table = self._delta_table(spec)
        compacted = written = 0
        vacuum_conf = {
            # Our retention setting decides; Delta would refuse less than a week.
            "spark.databricks.delta.retentionDurationCheck.enabled": "false",
            # VACUUM's START and END commits: the END one counts the files it deleted.
            "spark.databricks.delta.vacuum.logging.enabled": "true",
        }
        with _WRITE_LOCK, self._settings(spec, metadata=MAINTENANCE_METADATA, extra=vacuum_conf):
            if spec.compact:
                metrics = table.optimize().executeCompaction().select("metrics.*").first()
                if metrics is not None:
                    compacted, written = metrics["numFilesRemoved"], metrics["numFilesAdded"]
            before = self.version(spec)
            table.vacuum(retention.total_seconds() / 3600)
        return checkpoint_and_report(
            self.path(spec),
            spec,
            retention=retention,
            compacted=compacted,
            written=written,
            deleted=self._vacuumed_files(spec, after=before),
        )

    def _vacuumed_files(self, spec: TableSpec, *, after: int | None) -> int:
        """The files VACUUM deleted, from its END commit's metrics."""
        deleted = 0
        for _, actions in commits(
            self.path(spec), after=-1 if after is None else after, through=self.version(spec) or 0
        ):
            info = commit_of(actions)
            if info.get("operation") == "VACUUM END":
                deleted += int((info.get("operationMetrics") or {}).get("numDeletedFiles", 0))
        return deleted

    # -- one Delta operation and its commit --------------------------------------------------

    def _location(self, spec: TableSpec) -> str:
        """The table's location as Delta Spark names it (a `file:///` URI is a different
        location to its CREATE TABLE than the `file:/` it records)."""
        return str(self.path(spec))

    def _delta_table(self, spec: TableSpec) -> SparkDeltaTable:
        return SparkDeltaTable.forPath(self._spark, self._location(spec))

    def _write(
        self,
        spec: TableSpec,
        operation: Callable[[], None],
        *,
        searched: Sequence[str] | None,
        added: Callable[[], set[str]] | None = None,
        commit_metadata: Mapping[str, str] | None,
        app_transaction: AppTransaction | None = None,
        read_version: int | None = None,
    ) -> CommitInfo:
        """Run `operation` (one Delta write) with the commit's bookkeeping, and describe the
        commit it made.

        Before it starts, the commits since `read_version` are checked against the partitions
        it writes: `searched`, where it may change rows (None: any), and `added()`, those it
        adds rows to (a Spark job, so asked only when a commit did land since). After it, the
        commits up to the snapshot Delta's own conflict detection started from.
        """
        self.ensure(spec)
        with _WRITE_LOCK:  # the check and the commit, as one step for this process's writers
            return self._checked_write(
                spec,
                operation,
                searched=searched,
                added=added,
                commit_metadata=commit_metadata,
                app_transaction=app_transaction,
                read_version=read_version,
            )

    def _checked_write(
        self,
        spec: TableSpec,
        operation: Callable[[], None],
        *,
        searched: Sequence[str] | None,
        added: Callable[[], set[str]] | None,
        commit_metadata: Mapping[str, str] | None,
        app_transaction: AppTransaction | None,
        read_version: int | None,
    ) -> CommitInfo:
        table = self._table(spec)
        assert table is not None, spec.name
        checked = table.version()
        try:  # the common case, nothing committed since the read, costs no Spark job
            check_unchanged(self.path(spec), spec, table, None, read_version)
        except WriteConflictError:
            if app_transaction or searched is None:
                raise
            written = {*searched, *(added() if added else ())}
            check_unchanged(self.path(spec), spec, table, written, read_version)
        check_advances(spec, table, app_transaction)
        write_id = uuid.uuid4().hex
        metadata = {**(commit_metadata or {}), WRITE_ID: write_id}
        try:
            with self._settings(spec, metadata=metadata, app_transaction=app_transaction):
                operation()
        except Exception as exc:
            raise _lake_error(spec, exc) from exc
        found = self._find_commit(spec, after=checked, write_id=write_id)
        if found is None:  # Delta made no commit: nothing changed
            return CommitInfo(table=spec.name, version=self.version(spec), partitions=())
        version, actions = found
        info = _commit_info(spec, version, actions)
        if read_version is not None:
            self._check_window(spec, actions, info, read_version=read_version, checked=checked)
        return info

    @contextmanager
    def _settings(
        self,
        spec: TableSpec,
        *,
        metadata: Mapping[str, str],
        app_transaction: AppTransaction | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> Iterator[None]:
        """Delta Spark's session settings for one write (and `extra` ones), restored after it."""
        wanted: dict[str, str | None] = {
            USER_METADATA_CONF: json.dumps(dict(metadata), sort_keys=True),
            TXN_APP_ID_CONF: None if app_transaction is None else app_transaction.app_id,
            TXN_VERSION_CONF: None if app_transaction is None else str(app_transaction.version),
            **parquet_options(spec),
            MAX_RECORDS_CONF: str(spec.file_rows or MAX_ROWS_PER_FILE),
            **(extra or {}),
        }
        conf = self._spark.conf
        previous = {key: conf.get(key, None) for key in wanted}

        def apply(settings: Mapping[str, str | None]) -> None:
            for key, value in settings.items():
                if value is None:
                    conf.unset(key)
                else:
                    conf.set(key, value)

        try:
            apply(wanted)
            yield
        finally:
            apply(previous)

    def _find_commit(
        self, spec: TableSpec, *, after: int, write_id: str
    ) -> tuple[int, list[dict[str, Any]]] | None:
        """The version and actions of the commit after `after` that carries `write_id`."""
        latest = self.version(spec)
        for version, actions in commits(
            self.path(spec), after=after, through=after if latest is None else latest
        ):
            if with_user_metadata(commit_of(actions)).get(WRITE_ID) == write_id:
                return version, actions
        return None

    def _check_window(
        self,
        spec: TableSpec,
        actions: list[dict[str, Any]],
        info: CommitInfo,
        *,
        read_version: int,
        checked: int,
    ) -> None:
        """Raise if a commit after `read_version`, up to the snapshot this commit was made
        from, changed a partition it wrote: one that `check_unchanged` could not see (added
        rows' partitions, or commits that landed after it)."""
        started = commit_of(actions).get("readVersion")
        if started is None or started <= read_version:
            return
        clashes = changed_partitions(
            self.path(spec), spec, info.partitions, since_version=read_version, through=started
        )
        if clashes is None or clashes:
            raise WriteConflictError(
                f"{spec.name}: version {info.version} was committed over version(s) "
                f"{sorted({v for v, _ in clashes or ()})[:5]} (after version {read_version}, "
                f"which this run read; checked through {checked}), which changed the same "
                f"{spec.partition_by} {sorted({p for _, p in clashes or ()})[:5]}: a writer "
                "without the lake's writer lock raced this one; rebuild the table's partitions "
                "named"
            )


def _laid_out(spec: TableSpec, df: DataFrame) -> DataFrame:
    """One task per partition value, sorted: its files are consecutive ranges of `sort_by`."""
    return df.repartition(spec.partition_by).sortWithinPartitions(spec.partition_by, *spec.sort_by)


def _merge_source(
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
    renamed = [F.col(f.name).alias(_SOURCE + f.name) for f in spec.schema]
    parts = [new_rows.select(*renamed, F.lit(None).cast(StringType()).alias(_MATCH))]
    target_key: Column = F.lit(None).cast(StringType())
    if drop_keys is not None:
        columns = drop_keys.columns
        types = {f.name: f.dataType for f in spec.schema}
        keys = drop_keys.select(*(F.col(c).cast(types[c]).alias(c) for c in columns))
        parts.append(keys.select(F.to_json(F.struct(*columns)).alias(_MATCH)))
        target_key = F.to_json(F.struct(*columns))
    if drop is not None:
        spark = new_rows.sparkSession
        parts.append(spark.range(1).select(F.lit(_BY_PREDICATE).alias(_MATCH)))
        target_key = F.when(F.coalesce(drop, F.lit(False)), F.lit(_BY_PREDICATE)).otherwise(
            target_key
        )
    source = parts[0]
    for part in parts[1:]:
        source = source.unionByName(part, allowMissingColumns=True)
    condition = F.col(_MATCH) == target_key
    if searched is not None:
        condition = F.col(spec.partition_by).isin(_partition_literals(spec, searched)) & condition
    return source, condition


def _partition_literals(spec: TableSpec, values: Sequence[str]) -> list[Any]:
    """Partition values (as Delta stores them) as typed Python values for `isin`."""
    if spec.partition_is_date:
        return [date.fromisoformat(v) for v in values]
    return list(values)


def _partitions_predicate(spec: TableSpec, values: Sequence[str]) -> str:
    """`replaceWhere`'s predicate (Delta takes only SQL text): the partition column IN typed
    literals. A date is re-rendered from `date` and a string quoted, so no value can change
    the predicate's shape."""
    column = sql_identifier(spec.partition_by)
    literals = [
        f"DATE'{v.isoformat()}'"
        if isinstance(v, date)
        else "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"
        for v in _partition_literals(spec, values)
    ]
    return f"{column} IN ({', '.join(literals)})"


def _commit_info(spec: TableSpec, version: int, actions: list[dict[str, Any]]) -> CommitInfo:
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


def _lake_error(spec: TableSpec, exc: Exception) -> LakeError:
    """Delta Spark's error as the store's: a conflict, or a failed write (nothing committed)."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    # A failed task's error (a Python worker's traceback) ends with its cause: name it too.
    causes = [line for line in lines[1:] if _CAUSE.match(line)]
    if causes:
        first = f"{first} ({causes[-1]})"
    if any(name in text for name in _CONFLICTS):
        return _DeltaConflict(
            f"{spec.name}: a concurrent commit conflicted with this one ({first}); nothing "
            "was committed: a new run redoes the work from the current version"
        )
    if "DELTA_REPLACE_WHERE_MISMATCH" in text:
        return LakeError(f"{spec.name}: rows outside the replaced partitions ({first})")
    return LakeError(f"{spec.name}: the Delta write failed: {first}")
