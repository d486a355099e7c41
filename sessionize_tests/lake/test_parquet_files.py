"""The Parquet files the embedded store commits: their statistics (Delta's `stats` format)
and how the driver reads them."""

from __future__ import annotations

from datetime import date
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.types import DateType, StringType, StructField, StructType

from sessionize_assets.lake.location import Location
from sessionize_assets.lake.parquet_files import FILE_COLUMN, file_stats, read_files
from sessionize_assets.lake.store import TableSpec


def test_statistics_after_a_struct_column_are_the_columns_own(tmp_path):
    """A struct is several leaf columns in the file: the columns after it keep their own
    statistics (a misplaced null count made delta-rs read a whole column as null)."""
    path = tmp_path / "part.parquet"
    pq.write_table(
        pa.table(
            {
                "a": ["x", "y"],
                "s": pa.array(
                    [{"p": None, "q": None}, None],
                    pa.struct([("p", pa.string()), ("q", pa.string())]),
                ),
                "b": ["k", None],
                "n": [3, 5],
            }
        ),
        path,
    )
    stats = file_stats(path)
    assert stats["numRecords"] == 2
    assert stats["nullCount"] == {"a": 0, "b": 1, "n": 0}
    assert (stats["minValues"], stats["maxValues"]) == (
        {"a": "x", "b": "k", "n": 3},
        {"a": "y", "b": "k", "n": 5},
    )


def test_rows_can_name_the_file_they_are_in(tmp_path):
    """`read_files(with_file=True)`: each row carries the path of its file as given (how a
    relabel tells which files hold the sessions it changes), its partition from the folder."""
    spec = TableSpec(
        name="t",
        schema=StructType([StructField("k", StringType()), StructField("day", DateType())]),
        partition_by="day",
    )
    paths = {"day=2026-01-01/a.parquet": ["x", "y"], "day=2026-01-02/b%20c.parquet": ["z"]}
    for path, keys in paths.items():
        (tmp_path / unquote(path)).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"k": keys}), tmp_path / unquote(path))
    rows = read_files(Location.of(tmp_path), spec, paths, ["k", "day"], with_file=True)
    assert sorted(rows.to_pylist(), key=lambda row: row["k"]) == [
        {"k": "x", "day": date(2026, 1, 1), FILE_COLUMN: "day=2026-01-01/a.parquet"},
        {"k": "y", "day": date(2026, 1, 1), FILE_COLUMN: "day=2026-01-01/a.parquet"},
        {"k": "z", "day": date(2026, 1, 2), FILE_COLUMN: "day=2026-01-02/b%20c.parquet"},
    ]
    assert read_files(Location.of(tmp_path), spec, [], ["k"], with_file=True).column_names == [
        "k",
        FILE_COLUMN,
    ]
