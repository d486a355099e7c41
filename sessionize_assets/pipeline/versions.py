"""What a table gained and lost between two of its versions, read from its Delta log.

Copy-on-write commits remove whole files and add their replacements, so the files removed
since a version hold the old rows of what changed, and the files added the new ones (with the
rows a rewrite carried over in both). Reading only those files costs what changed, not the
table. A file added and removed again within the versions is in neither.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.lake.store import DeltaStore, TableSpec, empty_frame


def signed_rows(
    store: DeltaStore, spark: SparkSession, spec: TableSpec, *, since: int, through: int
) -> DataFrame | None:
    """The rows of the files added (`sign` +1) and removed (-1) by the commits after `since`
    through `through`, with the table's columns and `sign`.

    Summing `sign` over a key nets out the rows that were carried over. None when that part of
    the log or the removed files are gone: the caller must then treat everything as changed.
    """
    empty = empty_frame(spark, spec.schema).withColumn("sign", F.lit(1))
    changed = _changed_files(store, spec, since=since, through=through)
    if changed is None:
        return None
    frames = [
        store.read_files(spec, paths).withColumn("sign", F.lit(sign))
        for paths, sign in changed
        if paths
    ]
    if not frames:
        return empty
    return frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])


def signed_arrow(
    store: DeltaStore, spec: TableSpec, *, since: int, through: int, columns: Sequence[str]
) -> pa.Table | None:
    """`signed_rows` on the driver, for a change of a few files: `columns` and `sign`."""
    changed = _changed_files(store, spec, since=since, through=through)
    if changed is None:
        return None
    tables = [
        (data := store.read_files_arrow(spec, paths, columns=columns)).append_column(
            "sign", pa.array([sign] * data.num_rows, pa.int64())
        )
        for paths, sign in changed
    ]
    return pa.concat_tables(tables)


def _changed_files(
    store: DeltaStore, spec: TableSpec, *, since: int, through: int
) -> tuple[tuple[set[str], int], tuple[set[str], int]] | None:
    """(files added, +1) and (files removed, -1) by the commits after `since` through
    `through`, a file both added and removed in neither; None when that history is gone."""
    if through <= since:
        return (set(), 1), (set(), -1)
    changes = store.changes(spec, since_version=since, through_version=through)
    if changes is None:
        return None
    added = {c.path for c in changes if c.added}
    removed = {c.path for c in changes if not c.added}
    return (added - removed, 1), (removed - added, -1)
