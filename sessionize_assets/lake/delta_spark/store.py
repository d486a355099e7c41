"""Delta tables written by Delta Lake's own Spark operations (the `delta-spark` backend).

Every change of a table made from a Spark DataFrame is one Delta Spark operation, so its commit
is Delta's own (`engineInfo` Delta-Lake/4.0.x in the log), with Delta's conflict checks and
nothing staged or renamed outside it:
- `replace_partitions`: an overwrite with `replaceWhere` on the partition values, which Delta
  checks every written row against (a row outside them commits nothing);
- `rewrite`: one `MERGE` whose source is the rows to add and markers of the rows to drop
  (`sql.merge_source_and_condition`); Delta rewrites the files holding dropped
  rows, with their other rows; a rewrite that drops nothing is an append, and one whose
  partitions hold no file yet an overwrite of them (`_drop_and_add`);
- `merge`: a `MERGE` that updates the rows matching on the keys and inserts the others;
- `maintain`: `OPTIMIZE` and `VACUUM`.

The rest is shared with the embedded store (`lake/delta_rs/`), through
delta-rs on the driver, so it needs no Spark job: the
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

import logging
import operator
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import timedelta
from functools import reduce

from delta.tables import DeltaTable as SparkDeltaTable
from pyspark.sql import Column, DataFrame, DataFrameWriter
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from sessionize_assets.lake.delta_rs.log_files import commit_of, commits
from sessionize_assets.lake.delta_spark.commits import WRITE_LOCK, DeltaSparkCommits
from sessionize_assets.lake.delta_spark.sql import (
    SOURCE_MATCH,
    SOURCE_PREFIX,
    DeltaConflict,
    merge_source_and_condition,
    partition_literals,
    partitions_predicate,
)
from sessionize_assets.lake.maintenance import MAINTENANCE_METADATA, checkpoint_and_report
from sessionize_assets.lake.placement import laid_out
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
from sessionize_assets.lake.table_frames import align, merge_source

log = logging.getLogger(__name__)

_ATTEMPTS = 5  # of a rewrite that Delta's conflict detection fails
# A rewrite's overwrite of partitions without files may add rows outside its `replaceWhere`.
_ROWS_ANYWHERE = {"spark.databricks.delta.replaceWhere.constraintCheck.enabled": "false"}


def _overwrite(spec: TableSpec, rows: DataFrame, partitions: Sequence[str]) -> DataFrameWriter:
    """Delta's overwrite of `partitions` (partition strings) with `rows`, laid out for the
    table: `replace_partitions`, and a rewrite whose partitions hold no file."""
    return (
        laid_out(spec, rows)
        .write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", partitions_predicate(spec, partitions))
    )


class DeltaSparkStore(DeltaSparkCommits):
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
        with WRITE_LOCK, self._settings(spec, metadata={"operation": "add columns"}):
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

    def driver_write_size(self, df: DataFrame) -> int | None:
        return None  # its data tables are written by Delta Spark

    def collects_on_driver(self, size: int) -> bool:
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
        writer = _overwrite(spec, align(spec, df), targets)
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
                partition_literals(spec, searched)
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
            except DeltaConflict:
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
        """One attempt of `rewrite`: a MERGE; an append when nothing is dropped; when the
        searched partitions hold no file, nothing is dropped either, but the rows are written
        as an overwrite of those partitions.

        Why: a MERGE costs about 1.5 s of Delta's planning and jobs even then (it scans the
        target and materializes its source; a 20-row table, the tests' settings), an append
        about 0.45 s, the overwrite about 0.85 s. An append reads nothing, so Delta would not
        see a concurrent commit to the partitions; the overwrite reads them, so such a commit
        after its snapshot fails it as it would have failed the MERGE, and `rewrite` redoes
        it. Its rows may lie outside the partitions (`_ROWS_ANYWHERE`): only the MERGE's drop
        is confined to them."""
        plain: DataFrameWriter | None = None
        overwrites_empty = False
        if drop is None and drop_keys is None:
            plain = laid_out(spec, new_rows).write.format("delta").mode("append")
        elif searched is not None and not self.live_files(spec, partitions=searched):
            plain, overwrites_empty = _overwrite(spec, new_rows, searched), True
        if plain is not None:
            save = plain.save

            def write() -> None:
                save(self._location(spec))
        else:
            source, condition = merge_source_and_condition(
                spec, new_rows, drop, drop_keys, searched
            )

            def write() -> None:
                (
                    self._delta_table(spec)
                    .alias("t")
                    .merge(source, condition)
                    .whenMatchedDelete()
                    .whenNotMatchedInsert(
                        condition=F.col(SOURCE_MATCH).isNull(),
                        values={f.name: F.col(SOURCE_PREFIX + f.name) for f in spec.schema},
                    )
                    .execute()
                )

        def added() -> set[str]:
            values = new_rows.select(spec.partition_by).distinct().collect()
            return {partition_string(row[0]) for row in values}

        info = self._write(
            spec,
            write,
            searched=searched,
            added=added,
            commit_metadata=commit_metadata,
            app_transaction=app_transaction,
            read_version=read_version,
            extra=_ROWS_ANYWHERE if overwrites_empty else None,
        )
        if overwrites_empty and info.files_removed:
            # Files landed in the searched partitions between the look and Delta's snapshot
            # (a writer without the lake's writer lock, within milliseconds): the overwrite
            # removed their rows, which the MERGE would have kept unless they matched.
            raise WriteConflictError(
                f"{spec.name}: version {info.version} replaced {spec.partition_by} "
                f"{list(searched or ())[:5]}, which held no file when it started, but "
                f"{info.files_removed} file(s) a concurrent writer had just committed there: "
                "a writer without the lake's writer lock raced this one; rebuild the table's "
                "partitions named"
            )
        return info

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
        with WRITE_LOCK, self._settings(spec, metadata=MAINTENANCE_METADATA, extra=vacuum_conf):
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
