"""What a table gained and lost between two of its versions, read from its Delta log.

Copy-on-write commits remove whole files and add their replacements, so the files removed
since a version hold the old rows of what changed, and the files added the new ones (with the
rows a rewrite carried over in both). Reading only those files costs what changed, not the
table. A file added and removed again within the versions is in neither.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.lake.store import DeltaStore, TableSpec


def signed_rows(
    store: DeltaStore, spark: SparkSession, spec: TableSpec, *, since: int, through: int
) -> DataFrame | None:
    """The rows of the files added (`sign` +1) and removed (-1) by the commits after `since`
    through `through`, with the table's columns and `sign`.

    Summing `sign` over a key nets out the rows that were carried over. None when that part of
    the log or the removed files are gone: the caller must then treat everything as changed.
    """
    empty = spark.createDataFrame([], spec.schema).withColumn("sign", F.lit(1))
    if through <= since:
        return empty
    changes = store.changes(spec, since_version=since, through_version=through)
    if changes is None:
        return None
    added = {c.path for c in changes if c.added}
    removed = {c.path for c in changes if not c.added}
    frames = [
        store.read_files(spec, paths).withColumn("sign", F.lit(sign))
        for paths, sign in ((added - removed, 1), (removed - added, -1))
        if paths
    ]
    if not frames:
        return empty
    return frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])
