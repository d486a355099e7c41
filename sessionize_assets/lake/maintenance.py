"""Table maintenance: compaction, checkpoints, vacuum (by delta-rs; the delta-spark backend
compacts and vacuums with Delta Spark's own OPTIMIZE and VACUUM, `lake/delta_spark/store.py`).

Why each step:
- **Compaction** merges a partition's small files, for the tables that grow by a few rows per
  run (`TableSpec.compact`). It commits with `dataChange = false`, so readers of the change
  feed (`DeltaStore.changes`) see no change, and every version before it stays readable.
- **Checkpoint**: a reader loads the table from one Parquet file instead of replaying every
  commit since the start. The log entries older than `delta.logRetentionDuration` (30 days
  by default) before it are deleted then, as Delta Spark does at its checkpoints: with them go
  the statistics of files an erasure deleted (docs/erasure.md).
- **Vacuum** deletes the files no version within the retention period reads: replaced files,
  and files a killed writer had moved into the table but never committed (or, on the
  delta-spark backend, that a failed Delta Spark write left). A reader of the
  current version, or of any version younger than the retention, loses nothing. Staging
  folders a killed writer left behind (`_staging/<id>`) are deleted past the same age.
"""

from __future__ import annotations

import shutil
import time
from datetime import timedelta
from pathlib import Path

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import CommitProperties

from sessionize_assets.lake.location import Location
from sessionize_assets.lake.store import MaintenanceResult, TableSpec

STAGING_DIR = "_staging"  # where writers stage files before they are moved into the table
# What a maintenance commit says it is (its commit metadata).
MAINTENANCE_METADATA = {"sessionize": "maintenance"}


def maintain_table(path: Path, spec: TableSpec, *, retention: timedelta) -> MaintenanceResult:
    """Compact (if the spec allows), checkpoint and vacuum the table at `path`."""
    try:
        table = DeltaTable(str(path))
    except TableNotFoundError:
        return MaintenanceResult(table=spec.name, version=None)
    compacted = written = 0
    properties = CommitProperties(custom_metadata=MAINTENANCE_METADATA)
    if spec.compact:
        metrics = table.optimize.compact(commit_properties=properties)
        compacted, written = metrics["numFilesRemoved"], metrics["numFilesAdded"]
        table = DeltaTable(str(path))
    deleted = table.vacuum(
        retention_hours=int(retention.total_seconds() // 3600),
        dry_run=False,
        # Our own retention setting decides; delta-rs would refuse less than a week.
        enforce_retention_duration=False,
        # Every file of the folder, not only those the log removed: a killed writer's too.
        full=True,
        commit_properties=properties,
    )
    return checkpoint_and_report(
        Location.of(path),
        spec,
        retention=retention,
        compacted=compacted,
        written=written,
        deleted=len(deleted),
    )


def checkpoint_and_report(
    root: Location,
    spec: TableSpec,
    *,
    retention: timedelta,
    compacted: int,
    written: int,
    deleted: int,
) -> MaintenanceResult:
    """The end of maintenance on either backend: the stale staging folders of a local table
    removed (an object store's staging is a local temporary folder), a checkpoint of the
    version compaction and vacuum left (delta-rs writes it, and it is not a commit), the log
    entries past the log retention deleted, and what was done."""
    if root.is_local:
        remove_stale_staging(root.local_path() / STAGING_DIR, older_than=retention)
    table = DeltaTable(str(root))
    table.create_checkpoint()
    table.cleanup_metadata()
    return MaintenanceResult(
        table=spec.name,
        version=table.version(),
        files_compacted=compacted,
        files_written=written,
        files_deleted=deleted,
    )


def remove_stale_staging(staging: Path, *, older_than: timedelta) -> None:
    """Delete the staging folders a killed writer left, once older than the retention."""
    if not staging.is_dir():
        return
    cutoff = time.time() - older_than.total_seconds()
    for folder in staging.iterdir():
        if folder.stat().st_mtime < cutoff:
            shutil.rmtree(folder, ignore_errors=True)
