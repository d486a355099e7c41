"""Reading a few keys of many partitions: same rows as a join, fewer row groups read."""

from __future__ import annotations

from datetime import date, timedelta

import pytest
from pyspark.sql import functions as F
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


@pytest.mark.parametrize("listed", [False, True], ids=["frame", "on the driver"])
def test_read_by_keys_finds_exactly_the_wanted_rows(spark, store, monkeypatch, listed):
    days = [D + timedelta(days=n) for n in range(3)]
    data = [(f"u{i:03d}", day, f"{day}:{i}") for day in days for i in range(200)]
    store.replace_partitions(SPEC, spark.createDataFrame(data, SCHEMA), partitions=days)
    wanted_rows = [(days[0], "u007"), (days[0], "u150"), (days[0], "nobody")]
    wanted_rows += [(days[1], f"u{i:03d}") for i in range(0, 200, 3)]  # many: read whole
    # Searched by the keys of both searched days, matched exactly: not (days[2], "u150").
    wanted_rows += [(days[2], "u007")]
    wanted = spark.createDataFrame(wanted_rows, "day date, user_id string")
    if listed:  # the keys of each day, already on the driver
        wanted = {}
        for day, user in wanted_rows:
            wanted.setdefault(day, set()).add(user)
    monkeypatch.setattr(keyed_reads, "PUSHED_KEYS_PER_PARTITION", 10)

    found = read_by_keys(store, SPEC, wanted=wanted, key="user_id", columns=SCHEMA.fieldNames())

    expected = {(d, u) for d, u in wanted_rows if u != "nobody"}
    assert {(r.day, r.user_id) for r in found.rows.collect()} == expected
    assert found.searched == [days[0].isoformat(), days[2].isoformat()]
    assert found.keys_pushed == 3
    assert found.scanned == [days[1].isoformat()]


@pytest.mark.parametrize("listed", [False, True], ids=["frame", "on the driver"])
def test_a_key_the_files_are_not_sorted_by_is_pushed_down_only_when_few(
    spark, store, monkeypatch, listed
):
    days = [D + timedelta(days=n) for n in range(2)]
    data = [(f"u{i:03d}", day, f"{day}:{i}") for day in days for i in range(200)]
    store.replace_partitions(SPEC, spark.createDataFrame(data, SCHEMA), partitions=days)
    # The notes are in no file's order: 3 on the first day are few, 20 on the second many.
    wanted_rows = [(days[0], f"{days[0]}:{i}") for i in (1, 50, 199)]
    wanted_rows += [(days[1], f"{days[1]}:{i}") for i in range(0, 200, 10)]
    wanted = spark.createDataFrame(wanted_rows, "day date, note string")
    if listed:
        wanted = {}
        for day, note in wanted_rows:
            wanted.setdefault(day, set()).add(note)
    monkeypatch.setattr(keyed_reads, "PUSHED_UNSORTED_KEYS_PER_PARTITION", 5)

    found = read_by_keys(store, SPEC, wanted=wanted, key="note", columns=SCHEMA.fieldNames())

    assert {(r.day, r.note) for r in found.rows.collect()} == set(wanted_rows)
    assert found.searched == [days[0].isoformat()]
    assert found.keys_pushed == 3
    assert found.scanned == [days[1].isoformat()]


def test_read_by_keys_with_nothing_wanted_is_empty(spark, store):
    store.replace_partitions(SPEC, spark.createDataFrame([("u1", D, None)], SCHEMA), partitions=[D])
    wanted = spark.createDataFrame([], "day date, user_id string")
    found = read_by_keys(store, SPEC, wanted=wanted, key="user_id", columns=["user_id", "day"])
    assert found.rows.count() == 0 and found.searched == [] and found.scanned == []


def test_isin_texts_matches_integers_as_their_text(spark, monkeypatch):
    """Integers (the id index's hashes, negative ones too) go to the JVM as one text, matched
    against the column's text: the rows `isin` finds, built without a literal per call."""
    wanted = [-(2**63), -17, 0, 5, 2**63 - 1, *range(100, 100 + keyed_reads.JVM_LIST_FROM)]
    rows = spark.createDataFrame([(v,) for v in [*wanted, -5, 17, 99]], "h long")
    column = F.col("h")
    expected = sorted(r.h for r in rows.where(column.isin(wanted)).collect())

    def literal_by_literal(self, *values):
        raise AssertionError("built literal by literal")

    with monkeypatch.context() as patched:
        patched.setattr(type(column), "isin", literal_by_literal)
        built = keyed_reads.isin_texts(column, wanted)
    assert sorted(r.h for r in rows.where(built).collect()) == expected == sorted(wanted)


def test_isin_texts_is_the_same_in_list_whatever_the_texts(spark, monkeypatch):
    tricky = ["", " padded ", "a.b|c*", "quote'd", 'dq"', "back\\slash", "é ü 中", "unit\x1fsep"]
    texts = tricky + [f"k{i:04d}" for i in range(keyed_reads.JVM_LIST_FROM * 2)]
    rows = spark.createDataFrame([(t,) for t in [*texts, "absent", "k9999"]], "k string")
    column = F.col("k")
    expected = str(column.isin(sorted(set(texts))))
    every = [*texts, *keyed_reads._SEPARATORS]
    few = texts[: keyed_reads.JVM_LIST_FROM - 1]
    fallbacks = {str(column.isin(sorted(every))), str(column.isin(sorted(few)))}

    def literal_by_literal(self, *values):
        raise AssertionError("built literal by literal")

    with monkeypatch.context() as patched:
        patched.setattr(type(column), "isin", literal_by_literal)
        built = keyed_reads.isin_texts(column, texts)
    # The same IN expression as PySpark's own (so the same hash set once optimized).
    assert str(built) == expected
    assert sorted(r.k for r in rows.where(built).collect()) == sorted(texts)
    # When every separator occurs in the texts, or for a few texts: PySpark's isin itself.
    assert {
        str(keyed_reads.isin_texts(column, every)),
        str(keyed_reads.isin_texts(column, few)),
    } == fallbacks


@pytest.mark.parametrize("limit", [100, 1], ids=["a filter", "a broadcast join"])
@pytest.mark.parametrize("keep", [True, False], ids=["kept", "left out"])
def test_rows_with_keys_match_the_same_rows_as_a_filter_or_a_join(
    spark, monkeypatch, capsys, limit, keep
):
    rows = spark.createDataFrame(
        [("a", D, "1"), ("a", D, "1"), ("a", D + timedelta(days=1), "2"), ("b", D, "3")],
        SCHEMA,
    )
    keys = {("a", D), ("b", D + timedelta(days=1))}  # (a, D) twice, not (a, D + 1) nor (b, D)
    monkeypatch.setattr(keyed_reads, "PUSHED_KEYS_TOTAL", limit)
    test = (F.col("user_id") == "a") & (F.col("day") == D)  # what a filter of `keys` matches

    found = keyed_reads.rows_with_keys(
        rows, keys, schema="user_id string, day date", keep=keep, listed=lambda: test
    )

    assert sorted(r.note for r in found.collect()) == (["1", "1"] if keep else ["2", "3"])
    found.explain()
    assert ("BroadcastHashJoin" in capsys.readouterr().out) == (limit == 1)


@pytest.mark.parametrize("limit", [100, 1], ids=["a filter", "a broadcast join"])
def test_rows_with_values_match_a_column(spark, monkeypatch, limit):
    rows = spark.createDataFrame([(n,) for n in range(10)], "id_hash bigint")
    monkeypatch.setattr(keyed_reads, "PUSHED_KEYS_TOTAL", limit)

    found = keyed_reads.rows_with_values(rows, [3, 7, 11], column="id_hash", data_type="bigint")

    assert sorted(r.id_hash for r in found.collect()) == [3, 7]


@pytest.mark.parametrize("rows", [2, 3], ids=["broadcast", "sort-merge"])
def test_keys_for_join_broadcasts_only_up_to_broadcast_keys(spark, monkeypatch, capsys, rows):
    monkeypatch.setattr(keyed_reads, "BROADCAST_KEYS", 2)
    keys = spark.createDataFrame([("a", D), ("b", D)], "user_id string, day date")
    big = spark.createDataFrame([("a", D, "1"), ("c", D, "2")], SCHEMA)

    side = keyed_reads.keys_for_join(keys, rows=rows).distinct()  # the hint holds through
    joined = big.join(side, on=["user_id", "day"], how="left_semi")

    assert [r.note for r in joined.collect()] == ["1"]
    joined.explain()
    plan = capsys.readouterr().out
    assert ("BroadcastHashJoin" in plan, "SortMergeJoin" in plan) == (rows == 2, rows == 3)
