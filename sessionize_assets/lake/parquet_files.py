"""Parquet files as Delta expects them: statistics for the log, small files from Arrow.

Delta readers skip files by the min/max/null statistics in each `add` action; they are read
here from the Parquet footer, so no data passes through the driver.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, timedelta
from itertools import groupby
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.lake.location import Location
from sessionize_assets.lake.store import LakeError, TableSpec

# The column `read_files(with_file=True)` adds: the file a row is in.
FILE_COLUMN = "_file"
_MAX_STRING_STAT = 32  # Delta's default prefix length for string statistics


def stage_arrow(spec: TableSpec, data: pa.Table, staging: Path) -> list[tuple[str, Path]]:
    """Write the rows laid out as Spark's writer lays them out (`_stage`): per partition value,
    sorted by `spec.sort_by`, files of at most `spec.file_rows` rows."""
    column = spec.partition_by
    if data.column(column).null_count:
        raise LakeError(f"{spec.name}: rows with a null {column}")
    data = data.sort_by([(name, "ascending") for name in (column, *spec.sort_by)])
    values = data.column(column)
    strings = (values if pa.types.is_string(values.type) else values.cast(pa.string())).to_pylist()
    rows = data.drop_columns([column])
    staged = []
    at = 0
    for value, run in groupby(strings):
        count = sum(1 for _ in run)
        folder = staging / f"{column}={value}"
        folder.mkdir(parents=True, exist_ok=True)
        step = spec.file_rows or count
        for first in range(at, at + count, step):
            file = folder / f"part-{uuid.uuid4().hex}.snappy.parquet"
            part = rows.slice(first, min(step, at + count - first))
            pq.write_table(
                part, file, compression="snappy", coerce_timestamps="us", **_layout(spec, part)
            )
            staged.append((value, file))
        at += count
    return staged


def _layout(spec: TableSpec, rows: pa.Table) -> dict[str, Any]:
    """The spec's Parquet settings as Spark's writer applies them (`table_frames.parquet_options`):
    bloom filters sized for `bloom_filter_ndv` ids at Parquet's default 1% false positives,
    and row groups of about `row_group_bytes` (Arrow counts them in rows)."""
    layout: dict[str, Any] = {}
    if spec.bloom_filter_columns:
        layout["bloom_filter_options"] = {
            column: {"ndv": spec.bloom_filter_ndv, "fpp": 0.01}
            for column in spec.bloom_filter_columns
        }
    if spec.row_group_bytes and rows.num_rows:
        per_row = max(1, rows.nbytes // rows.num_rows)
        layout["row_group_size"] = max(1, spec.row_group_bytes // per_row)
    return layout


def files_named(uris: Iterable[str], paths: Iterable[str]) -> list[str]:
    """The relative paths among `paths` that Spark names by these URIs (the `_file` of
    `DeltaStore.read_files(with_file=True)`), matched by partition folder and file name (Spark
    writes the same file name in each partition folder of one write). `LakeError` for a URI
    none of `paths` is: the caller read those files, so it would be a mapping fault."""
    by_name = {_folder_and_name(path): path for path in paths}
    named = {_folder_and_name(urlparse(uri).path): uri for uri in uris}
    unknown = named.keys() - by_name.keys()
    if unknown:
        raise LakeError(f"cannot map Spark file paths {sorted(named[n] for n in unknown)[:2]}")
    return sorted(by_name[name] for name in named)


def _folder_and_name(path: str) -> str:
    return "/".join(unquote(path).rstrip("/").rsplit("/", 2)[-2:])


def read_files(
    root: Location,
    spec: TableSpec,
    paths: Iterable[str],
    columns: Sequence[str] | None = None,
    *,
    with_file: bool = False,
    where: pc.Expression | None = None,
) -> pa.Table:
    """The rows of these data files (paths relative to the table's `root`), only `columns`
    when given, with the spec's types: the partition column comes from each file's folder, and
    a column a file predates (added by `ensure`) is null. The files are read in parallel.
    `with_file` adds `FILE_COLUMN`: the path (as given) of the file each row is in. `where`
    keeps the rows it holds for, filtered batch by batch as they are read: the driver holds
    the matches, not the files (a lookup in the id index)."""
    schema = to_arrow_schema(spec.schema)
    names = list(columns) if columns is not None else schema.names
    wanted = pa.schema([schema.field(name) for name in names])
    if with_file:
        wanted = wanted.append(pa.field(FILE_COLUMN, pa.string(), nullable=False))
    filesystem, base = root.filesystem()
    given = {f"{base}/{unquote(path)}": path for path in sorted(set(paths))}
    files = list(given)
    if not files:
        return wanted.empty_table()
    column = schema.field(spec.partition_by).with_nullable(True)
    dataset = ds.dataset(
        files,
        # Nullable as files are written: the spec's non-null columns are checked by the cast.
        schema=pa.schema([field.with_nullable(True) for field in schema]),
        format="parquet",
        partitioning=ds.partitioning(pa.schema([column]), flavor="hive"),
        partition_base_dir=base,
        filesystem=filesystem,
    )
    if not with_file:
        return dataset.to_table(columns=names, filter=where).cast(wanted)
    tables = [
        pa.Table.from_batches([tagged.record_batch]).append_column(
            FILE_COLUMN, pa.array([given[tagged.fragment.path]] * tagged.record_batch.num_rows)
        )
        for tagged in dataset.scanner(columns=names, filter=where).scan_batches()
    ]
    return pa.concat_tables(tables).cast(wanted) if tables else wanted.empty_table()


def file_stats(path: Path) -> dict[str, Any]:
    """numRecords, min/max and null counts from the Parquet footer (Delta's stats format)."""
    metadata = pq.read_metadata(path)
    schema = metadata.schema.to_arrow_schema()
    stats: dict[str, Any] = {"numRecords": metadata.num_rows}
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    # A row group's columns are the schema's leaves (a struct is one per field): a top-level
    # column is found by its path, not by its place among the top-level fields.
    leaves = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    for arrow_field in schema:
        if pa.types.is_nested(arrow_field.type):
            continue
        index = leaves[arrow_field.name]
        low = high = None
        null_count = 0
        complete = metadata.num_row_groups > 0
        for group in range(metadata.num_row_groups):
            column = metadata.row_group(group).column(index)
            s = column.statistics
            if s is None or not s.has_null_count:
                complete = False
                break
            null_count += s.null_count
            if s.has_min_max:
                low = s.min if low is None else min(low, s.min)
                high = s.max if high is None else max(high, s.max)
        if not complete:
            continue
        nulls[arrow_field.name] = null_count
        if low is None or pa.types.is_boolean(arrow_field.type):
            continue
        low_json, high_json = _stat_value(low, up=False), _stat_value(high, up=True)
        if low_json is not None and high_json is not None:
            mins[arrow_field.name] = low_json
            maxs[arrow_field.name] = high_json
    stats.update(minValues=mins, maxValues=maxs, nullCount=nulls)
    return stats


def _stat_value(value: Any, *, up: bool) -> Any:
    """JSON form of a statistic; timestamps at millisecond precision, rounded outward."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        floor = value.replace(microsecond=value.microsecond // 1000 * 1000)
        if up and floor != value:
            floor += timedelta(milliseconds=1)
        return floor.strftime("%Y-%m-%dT%H:%M:%S.") + f"{floor.microsecond // 1000:03d}Z"
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if isinstance(value, str):
        return value if len(value) <= _MAX_STRING_STAT else None
    if isinstance(value, int | float):
        return value
    return None
