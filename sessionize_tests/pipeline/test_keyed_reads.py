"""Reading a few keys of many partitions: same rows as a join, fewer row groups read."""

from __future__ import annotations

from datetime import date, timedelta

from pyspark.sql.types import DateType, StringType, StructField, StructType

from sessionize_assets.lake.store import TableSpec
from sessionize_assets.pipeline import keyed_reads
from sessionize_assets.pipeline.keyed_reads import read_by_keys

SCHEMA = StructType(
    [
        StructField("user_id", StringType(), False),
        StructField("day", DateType(), False),
        StructField("note", StringType(), True),
    ]
)
SPEC = TableSpec(
    name="keyed", schema=SCHEMA, partition_by="day", sort_by=("user_id",),
    bloom_filter_columns=("user_id",), bloom_filter_ndv=1_000,
)  # fmt: skip
D = date(2026, 1, 1)


def test_read_by_keys_finds_exactly_the_wanted_rows(spark, store, monkeypatch):
    days = [D + timedelta(days=n) for n in range(3)]
    data = [(f"u{i:03d}", day, f"{day}:{i}") for day in days for i in range(200)]
    store.replace_partitions(SPEC, spark.createDataFrame(data, SCHEMA), partitions=days)
    wanted_rows = [(days[0], "u007"), (days[0], "u150"), (days[0], "nobody")]
    wanted_rows += [(days[1], f"u{i:03d}") for i in range(0, 200, 3)]  # many: read whole
    # Searched by the keys of both searched days, matched exactly: not (days[2], "u150").
    wanted_rows += [(days[2], "u007")]
    wanted = spark.createDataFrame(wanted_rows, "day date, user_id string")
    monkeypatch.setattr(keyed_reads, "PUSHED_KEYS_PER_PARTITION", 10)

    found = read_by_keys(store, SPEC, wanted=wanted, key="user_id", columns=SCHEMA.fieldNames())

    expected = {(d, u) for d, u in wanted_rows if u != "nobody"}
    assert {(r.day, r.user_id) for r in found.rows.collect()} == expected
    assert found.searched == [days[0].isoformat(), days[2].isoformat()]
    assert found.keys_pushed == 3
    assert found.scanned == [days[1].isoformat()]


def test_read_by_keys_with_nothing_wanted_is_empty(spark, store):
    store.replace_partitions(SPEC, spark.createDataFrame([("u1", D, None)], SCHEMA), partitions=[D])
    wanted = spark.createDataFrame([], "day date, user_id string")
    found = read_by_keys(store, SPEC, wanted=wanted, key="user_id", columns=["user_id", "day"])
    assert found.rows.count() == 0 and found.searched == [] and found.scanned == []
