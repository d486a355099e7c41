"""Committing staged files to a Delta log with delta-rs: the actions that describe them, the
check that no commit since a run's read version changed what it writes, and the clean-up of
files a failed commit leaves behind."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import pyarrow.fs as pafs
from deltalake import DeltaTable, Transaction
from deltalake.transaction import AddAction, CommitProperties

from sessionize_assets.lake.delta_rs.log_files import logged_changes
from sessionize_assets.lake.location import Location
from sessionize_assets.lake.parquet_files import file_stats
from sessionize_assets.lake.store import (
    AppTransaction,
    CommitInfo,
    LakeError,
    TableSpec,
    WriteConflictError,
)


def publish(root: Location, spec: TableSpec, staged: list[tuple[str, Path]]) -> list[AddAction]:
    """Move staged files to their partition folders and describe them for the log: a rename
    in a local folder, an upload to an object store (the staged file is then removed)."""
    adds = []
    for value, file in staged:
        relative = f"{spec.partition_by}={value}/{file.name}"
        size, stats = file.stat().st_size, json.dumps(file_stats(file))
        if root.is_local:
            target = root.local_path() / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(file, target)
            modified = target.stat().st_mtime
        else:
            filesystem, base = root.filesystem()
            pafs.copy_files(str(file), f"{base}/{relative}", destination_filesystem=filesystem)
            file.unlink()
            modified = time.time()
        adds.append(
            AddAction(relative, size, {spec.partition_by: value}, int(modified * 1000), True, stats)
        )
    return adds


def check_unchanged(
    root: Location,
    spec: TableSpec,
    table: DeltaTable,
    partitions: Iterable[str] | None,
    read_version: int | None,
) -> None:
    """Raise `WriteConflictError` if a commit after `read_version` changed one of these
    partitions (None: any partition, for a commit whose app transactions mark the whole
    table). Nothing to check without a read version; `NOT_CREATED` checks every commit since
    the table was created, appends included."""
    if read_version is None or table.version() <= read_version:
        return
    clashes = changed_partitions(
        root, spec, partitions, since_version=read_version, through=table.version()
    )
    if clashes is None:
        raise WriteConflictError(
            f"{spec.name}: the log since version {read_version}, which this run read, is "
            "gone; nothing was committed: run again to work from the current version"
        )
    if clashes:
        versions = sorted({v for v, _ in clashes})
        dates = sorted({p for _, p in clashes})
        raise WriteConflictError(
            f"{spec.name}: {spec.partition_by} {', '.join(dates[:5])}"
            f"{'...' if len(dates) > 5 else ''} changed in version(s) "
            f"{', '.join(map(str, versions[:5]))} after this run read version "
            f"{read_version}; nothing was committed: another run wrote the same partitions, "
            "and a new run redoes the work from the current version"
        )


def changed_partitions(
    root: Location,
    spec: TableSpec,
    partitions: Iterable[str] | None,
    *,
    since_version: int,
    through: int,
) -> list[tuple[int, str]] | None:
    """(version, partition) of each of `partitions` (None: any) that a commit after
    `since_version` through `through` changed, sorted; None when that log is gone."""
    changes = logged_changes(root, spec, since_version=since_version, through=through)
    if changes is None:
        return None
    wanted = None if partitions is None else set(partitions)
    return sorted(
        {(c.version, c.partition) for c in changes if wanted is None or c.partition in wanted}
    )


def check_advances(
    spec: TableSpec, table: DeltaTable, app_transaction: AppTransaction | None
) -> None:
    """Raise `LakeError` unless `app_transaction` moves its application's version up: Delta
    Spark would skip such a write without a word, so neither backend makes it."""
    if app_transaction is None:
        return
    recorded = table.transaction_version(app_transaction.app_id)
    if recorded is not None and app_transaction.version <= recorded:
        raise LakeError(
            f"{spec.name}: {app_transaction.app_id} is at version {recorded} already; a commit "
            f"recording {app_transaction.version} would not move it up: nothing was committed"
        )


def discard(root: Location, spec: TableSpec, staged: list[tuple[str, Path]]) -> None:
    """Delete the files of a commit that failed, staged or published."""
    for value, file in staged:
        file.unlink(missing_ok=True)
        published = root / f"{spec.partition_by}={value}/{file.name}"
        if published.exists():
            filesystem, path = published.filesystem()
            filesystem.delete_file(path)


def commit_properties(
    metadata: Mapping[str, str] | None,
    app_transaction: AppTransaction | None,
    read_version: int | None,
) -> CommitProperties:
    """With a read version, the commit is made at exactly the version that was checked against
    it: delta-rs does not rebase it over a commit that lands in between (it fails, and the
    caller checks again)."""
    return CommitProperties(
        custom_metadata=dict(metadata or {}),
        app_transactions=(
            None
            if app_transaction is None
            else [Transaction(app_transaction.app_id, app_transaction.version)]
        ),
        max_commit_retries=None if read_version is None else 0,
    )


def commit_info(
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
