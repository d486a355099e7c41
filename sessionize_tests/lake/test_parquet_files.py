"""Statistics of the Parquet files the embedded store commits (Delta's `stats` format)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from sessionize_assets.lake.parquet_files import file_stats


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
