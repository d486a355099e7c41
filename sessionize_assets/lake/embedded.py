"""Delta tables without the Delta jars: Spark writes Parquet, delta-rs commits the log.

What this backend adds to the shared delta-rs reads and commits (`delta_rs/writes.py`): its tables
are created and extended by delta-rs, its Spark writes are staged and committed the same way,
and its maintenance is delta-rs's (`lake/maintenance.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path

from deltalake import DeltaTable, Field
from deltalake.transaction import (
    create_table_with_add_actions,
)
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sessionize_assets.lake.delta_rs.reads import delta_schema
from sessionize_assets.lake.delta_rs.writes import DeltaRsTables, Staged
from sessionize_assets.lake.maintenance import maintain_table
from sessionize_assets.lake.placement import estimated_bytes
from sessionize_assets.lake.store import (
    AppTransaction,
    CommitInfo,
    MaintenanceResult,
    PartitionValue,
    TableSpec,
    partition_string,
)
from sessionize_assets.lake.table_frames import align, merge_source

log = logging.getLogger(__name__)


class EmbeddedDeltaStore(DeltaRsTables):
    """`DeltaStore` for local mode or any cluster whose executors share the lake's file system."""

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

    def driver_write_size(self, df: DataFrame) -> int | None:
        size = estimated_bytes(df)
        return size if size is not None and self.fits_on_driver(size) else None

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
            drop_keys=F.broadcast(incoming.select(*keys)),
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
        """Copy-on-write at file granularity (`_copy_on_write`), Spark staging the files."""
        searched = None if partitions is None else sorted({partition_string(p) for p in partitions})

        def stage(table: DeltaTable, staging: Path) -> Staged:
            candidates, marked = self._marked_rows(spec, table, searched, drop, drop_keys, files)
            new_rows = align(spec, add())
            if marked is None:
                return [], self._stage(spec, new_rows, staging)
            held = sum(size for _, _, size in candidates.values())
            size = estimated_bytes(new_rows)
            if size is not None and self.fits_on_driver(held + size):
                return self._stage_on_driver(
                    spec, candidates, marked, new_rows, staging, size=held + size
                )
            touched, kept = self._touched_files(spec, candidates, marked)
            return touched, self._stage(spec, kept.unionByName(new_rows), staging)

        return self._copy_on_write(spec, stage, commit_metadata, app_transaction, read_version)
