"""delta-spark (the jars `make jars` fetches) and delta-rs read and write each other's tables.

The lake's tables are written by Spark with delta-spark's own operations or committed by
delta-rs, and read by both: the sensors and the read-only commands use delta-rs, with no JVM.
This holds only while neither engine gives a table a protocol or a feature the other lacks.
"""

from __future__ import annotations

import json

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import functions as F

from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_tests.lake.test_store import D1, D2, D3, SPEC, frame, rows


def _commit_infos(path) -> list[dict]:
    infos = []
    for entry in sorted((path / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                infos.append(action["commitInfo"])
    return infos


def _protocol(table: DeltaTable) -> tuple[int, int, bool]:
    """Reader and writer versions, and whether the table uses any table feature."""
    p = table.protocol()
    return p.min_reader_version, p.min_writer_version, bool(p.reader_features or p.writer_features)


def test_a_delta_spark_table_is_read_and_written_by_delta_rs(spark, tmp_path):
    path = tmp_path / "things"
    (
        frame(spark, rows(("a", D1, 1), ("b", D2, 2)))
        .write.format("delta")
        .partitionBy("day")
        .option("txnAppId", "ingest")
        .option("txnVersion", 7)
        .save(str(path))
    )
    table = DeltaTable(str(path))
    # The protocol delta-spark gives a new table: nothing delta-rs cannot write.
    assert _protocol(table) == (1, 2, False)
    assert table.transaction_version("ingest") == 7
    assert "Delta-Lake" in _commit_infos(path)[0]["engineInfo"]
    found = pa.table(table.to_pyarrow_table()).sort_by("id")
    assert found.column("id").to_pylist() == ["a", "b"]
    assert found.column("ts").type == pa.timestamp("us", tz="UTC")
    assert found.column("note").to_pylist() == ["note a é", "note b é"]

    # A replaceWhere by delta-spark, then delta-rs commits to the same table ...
    (
        frame(spark, rows(("c", D2, 3)))
        .write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", "day = DATE'2026-01-02'")
        .save(str(path))
    )
    store = EmbeddedDeltaStore(spark=spark, lake=tmp_path)
    store.replace_partitions(SPEC, frame(spark, rows(("d", D3, 4))), partitions=[D3])
    # ... and each engine reads what the other wrote.
    by_spark = spark.read.format("delta").load(str(path)).orderBy("id")
    assert [(r.id, r.day) for r in by_spark.collect()] == [("a", D1), ("c", D2), ("d", D3)]
    assert store.row_counts(SPEC) == {"2026-01-01": 1, "2026-01-02": 1, "2026-01-03": 1}


def test_a_delta_rs_table_is_read_and_written_by_delta_spark(spark, tmp_path):
    store = EmbeddedDeltaStore(spark=spark, lake=tmp_path)
    store.replace_partitions(
        SPEC, frame(spark, rows(("a", D1, 1), ("b", D2, 2))), partitions=[D1, D2]
    )
    path = store.path(SPEC).local_path()
    assert _protocol(DeltaTable(str(path))) == (1, 2, False)

    (
        frame(spark, rows(("c", D1, 3)))
        .write.format("delta")
        .mode("append")
        .option("userMetadata", "from delta-spark")
        .save(str(path))
    )
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 'b'")
    merged = spark.read.format("delta").load(str(path)).where(F.col("day") == D1)
    assert sorted(r.id for r in merged.collect()) == ["a", "c"]

    table = DeltaTable(str(path))
    assert sorted(pa.table(table.to_pyarrow_table()).column("id").to_pylist()) == ["a", "c"]
    assert store.row_counts(SPEC) == {"2026-01-01": 2}
    assert [info.get("userMetadata") for info in _commit_infos(path)][-2:] == [
        "from delta-spark",
        None,
    ]
