"""One Delta Spark operation and its commit, as the delta-spark backend makes each write: the
write's bookkeeping set on the session for that one write (its metadata as `userMetadata`, an
`AppTransaction` as `txnAppId` / `txnVersion`, the Parquet settings), its read version checked
against the log before it starts, and its commit found in the log after it (by a write id in
its metadata). One write at a time in a process: the session settings are the process's.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from abc import ABC
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from delta.tables import DeltaTable as SparkDeltaTable

from sessionize_assets.lake.delta_rs.log_commits import (
    changed_partitions,
    check_advances,
    check_unchanged,
)
from sessionize_assets.lake.delta_rs.log_files import commit_of, commits, with_user_metadata
from sessionize_assets.lake.delta_rs.writes import MAX_ROWS_PER_FILE, DeltaRsTables
from sessionize_assets.lake.delta_spark.sql import (
    commit_info_of,
    lake_error,
)
from sessionize_assets.lake.store import (
    AppTransaction,
    CommitInfo,
    TableSpec,
    WriteConflictError,
)
from sessionize_assets.lake.table_frames import parquet_options

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
# One write at a time in a process: the session settings a write sets are the process's, and
# its read version is checked and its commit made with no write of this process in between.
WRITE_LOCK = threading.RLock()


class DeltaSparkCommits(DeltaRsTables, ABC):
    """The shared delta-rs reads and driver-side writes, and how one Delta Spark operation is
    run and its commit read back (`_write`)."""

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
        extra: Mapping[str, str] | None = None,
    ) -> CommitInfo:
        """Run `operation` (one Delta write) with the commit's bookkeeping (and the session
        settings `extra`, for that write), and describe the commit it made.

        Before it starts, the commits since `read_version` are checked against the partitions
        it writes: `searched`, where it may change rows (None: any), and `added()`, those it
        adds rows to (a Spark job, so asked only when a commit did land since). After it, the
        commits up to the snapshot Delta's own conflict detection started from.
        """
        self.ensure(spec)
        with WRITE_LOCK:  # the check and the commit, as one step for this process's writers
            return self._checked_write(
                spec,
                operation,
                searched=searched,
                added=added,
                commit_metadata=commit_metadata,
                app_transaction=app_transaction,
                read_version=read_version,
                extra=extra,
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
        extra: Mapping[str, str] | None,
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
            with self._settings(
                spec, metadata=metadata, app_transaction=app_transaction, extra=extra
            ):
                operation()
        except Exception as exc:
            raise lake_error(spec, exc) from exc
        found = self._find_commit(spec, after=checked, write_id=write_id)
        if found is None:  # Delta made no commit: nothing changed
            return CommitInfo(table=spec.name, version=self.version(spec), partitions=())
        version, actions = found
        info = commit_info_of(spec, version, actions)
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
