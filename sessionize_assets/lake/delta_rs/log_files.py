"""Reading a Delta table on the driver with delta-rs: its live files from the log, filtered in
Arrow, and small bookkeeping tables whole.

Only the selected files become Python objects: listing a few partitions of a table with
thousands of files costs what is selected, not the table. Nothing here needs Spark, so a
sensor can read the lake too.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from sessionize_assets.lake.location import Location
from sessionize_assets.lake.parquet_files import read_files
from sessionize_assets.lake.store import FileChange, PartitionValue, TableSpec, partition_string

DELTA_LOG_DIR = "_delta_log"  # a table's log, in its folder


def table_path(lake: Location | Path | str, spec: TableSpec) -> Location:
    """Where the lake keeps a table: one folder per table under the lake's root (a local
    folder or an object-store URI)."""
    return Location.of(lake) / spec.name


def read_small_table(
    path: Location,
    spec: TableSpec,
    *,
    partitions: Iterable[PartitionValue] | None = None,
    columns: Sequence[str] | None = None,
    where: pc.Expression | None = None,
) -> pa.Table:
    """The rows of a small table at `path` (only `partitions`, when given) with the spec's
    schema (only `columns`, when given; only the rows `where` holds for, as `read_files`);
    an empty table when it does not exist yet.

    The live files are chosen from the log in Arrow (`file_partitions`): on a table of
    thousands of files, reading one partition costs that partition, not the table.
    """
    wanted = None if partitions is None else {partition_string(p) for p in partitions}
    try:
        table = DeltaTable(str(path))
    except TableNotFoundError:
        table = None
    files = [] if table is None or wanted == set() else file_partitions(table, spec, wanted)
    return read_files(path, spec, [file for file, _ in files], columns, where=where)


def logged_changes(
    root: Location, spec: TableSpec, *, since_version: int, through: int
) -> list[FileChange] | None:
    """The data files that the commits after `since_version` through `through` added or
    removed, oldest first, read from the commit files themselves (what changed, not the table).

    Compaction (`dataChange: false`) changes no row and is left out. None when one of those
    commit files is gone (log cleanup): that history can no longer be told.
    """
    found: list[FileChange] = []
    for version in range(since_version + 1, through + 1):
        actions = commit_actions(root, version)
        if actions is None:
            return None
        for action in actions:
            for kind in ("add", "remove"):
                entry = action.get(kind)
                if entry is None or not entry.get("dataChange", True):
                    continue
                values = entry.get("partitionValues") or {}
                found.append(
                    FileChange(
                        path=entry["path"],
                        partition=str(values.get(spec.partition_by)),
                        version=version,
                        added=kind == "add",
                        size=entry.get("size"),
                    )
                )
    return found


def commit_actions(root: Location, version: int) -> list[dict[str, Any]] | None:
    """The actions of one commit of the table at `root`, from its commit file (None: gone)."""
    try:
        lines = (root / f"{DELTA_LOG_DIR}/{version:020d}.json").read_text().splitlines()
    except FileNotFoundError:
        return None
    return [json.loads(line) for line in lines if line.strip()]


def commits(
    root: Location, *, after: int, through: int
) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """(version, actions) of each commit after `after` through `through` whose commit file
    is still there, oldest first."""
    for version in range(after + 1, through + 1):
        actions = commit_actions(root, version)
        if actions is not None:
            yield version, actions


def commit_of(actions: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The `commitInfo` of a commit's actions ({} when it has none)."""
    return next((a["commitInfo"] for a in actions if "commitInfo" in a), {})


def with_user_metadata(commit: dict[str, Any]) -> dict[str, Any]:
    """A commit of `DeltaTable.history` with the keys of its `userMetadata` at the top, as
    delta-rs puts its commits' custom metadata: Delta Spark records one string there, which
    the delta-spark backend writes as a JSON object."""
    raw = commit.get("userMetadata")
    if not isinstance(raw, str):
        return commit
    try:
        parsed = json.loads(raw)
    except ValueError:
        return commit
    return {**parsed, **commit} if isinstance(parsed, dict) else commit


def file_partitions(
    table: DeltaTable, spec: TableSpec, wanted: set[str] | None, *, sizes: bool = False
) -> list[tuple]:
    """(path, partition value[, size]) of the live files in `wanted` partitions (None: all).

    The log's file list is filtered in Arrow: only the selected files become Python objects.
    """
    actions = pa.table(table.get_add_actions(flatten=True))
    values = as_strings(actions.column(f"partition.{spec.partition_by}"))
    if wanted is not None:
        keep = pc.is_in(values, value_set=pa.array(sorted(wanted), type=pa.string()))
        actions, values = actions.filter(keep), values.filter(keep)
    columns = [actions.column("path").to_pylist(), values.to_pylist()]
    if sizes:
        columns.append(actions.column("size_bytes").to_pylist())
    return list(zip(*columns, strict=True))


def _stat(actions: pa.Table, name: str) -> list[Any]:
    """A column statistic of each file from the log (None where it was not recorded); a
    date's as its ISO text, which orders as the date does (the values looked for are text)."""
    if name not in actions.column_names:
        return [None] * actions.num_rows
    column = actions.column(name)
    return (as_strings(column) if pa.types.is_date(column.type) else column).to_pylist()


def as_strings(values: pa.ChunkedArray) -> pa.ChunkedArray:
    """Partition values as Delta writes them (dates as ISO strings)."""
    return values if pa.types.is_string(values.type) else pc.cast(values, pa.string())


def files_in_range(
    table: DeltaTable,
    spec: TableSpec,
    *,
    column: str,
    values: Mapping[str, Collection[str]],
    whole: set[str],
) -> list[str]:
    """Files (relative paths) of `values`' partitions whose min..max of `column` can hold one
    of that partition's values (or that have no statistics), and every file of `whole`."""
    wanted = {partition: sorted(set(v)) for partition, v in values.items() if v}
    actions = pa.table(table.get_add_actions(flatten=True))
    partition = as_strings(actions.column(f"partition.{spec.partition_by}"))
    keep = pc.is_in(partition, value_set=pa.array(sorted({*wanted, *whole}), pa.string()))
    actions, partition = actions.filter(keep), partition.filter(keep)
    lows = _stat(actions, f"min.{column}")
    highs = _stat(actions, f"max.{column}")
    found = []
    for path, value, low, high in zip(
        actions.column("path").to_pylist(), partition.to_pylist(), lows, highs, strict=True
    ):
        if value in whole or low is None or high is None:
            found.append(path)
            continue
        # The first wanted value >= low decides: the file can hold it if it is <= high.
        candidates = wanted[value]
        at = bisect_left(candidates, low)
        if at < len(candidates) and candidates[at] <= high:
            found.append(path)
    return sorted(found)
