"""The `DeltaStore` contract, run against both backends: the embedded one (Spark data files,
delta-rs log) and delta-spark (Delta's own operations). Each test runs once per backend."""

from __future__ import annotations

import json
import threading
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BooleanType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sessionize_assets.lake import placement
from sessionize_assets.lake.delta_spark.store import DeltaSparkStore
from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_assets.lake.parquet_files import FILE_COLUMN, files_named
from sessionize_assets.lake.placement import (
    DEFAULT_DRIVER_WRITE_BYTES,
    spread_for_collect,
)
from sessionize_assets.lake.store import (
    NOT_CREATED,
    AppTransaction,
    LakeError,
    TableSpec,
    WriteConflictError,
)

SCHEMA = StructType(
    [
        StructField("id", StringType(), False),
        StructField("day", DateType(), False),
        StructField("ts", TimestampType(), True),
        StructField("n", LongType(), True),
        StructField("rank", IntegerType(), True),
        StructField("ratio", DoubleType(), True),
        StructField("flag", BooleanType(), True),
        StructField("note", StringType(), True),
    ]
)
SPEC = TableSpec(name="things", schema=SCHEMA, partition_by="day")
D1, D2, D3 = date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)


def ts(hour: int, micro: int = 0) -> datetime:
    return datetime(2026, 1, 1, hour, 0, 0, micro, tzinfo=UTC)


def rows(*items: tuple) -> list[tuple]:
    """(id, day, hour) shorthand filled out to the full schema."""
    return [
        (i, d, ts(h, 123_456), h * 10**12, h, h / 3, h % 2 == 0, f"note {i} é") for i, d, h in items
    ]


def frame(spark: SparkSession, data: list[tuple]):
    return spark.createDataFrame(data, SCHEMA)


@pytest.fixture(
    params=[
        (EmbeddedDeltaStore, DEFAULT_DRIVER_WRITE_BYTES),
        # The embedded backend's other placement: Spark's writer for every change.
        (EmbeddedDeltaStore, 0),
        (DeltaSparkStore, DEFAULT_DRIVER_WRITE_BYTES),
    ],
    ids=["embedded", "embedded-spark-writer", "delta-spark"],
)
def store(request, spark: SparkSession, tmp_path: Path) -> EmbeddedDeltaStore:
    backend, driver_write_bytes = request.param
    return backend(spark=spark, lake=tmp_path / "lake", driver_write_bytes=driver_write_bytes)


def table_rows(store: EmbeddedDeltaStore) -> list[dict]:
    """What an independent Delta reader (delta-rs) sees."""
    table = DeltaTable(str(store.path(SPEC)))
    return sorted(pa.table(table.to_pyarrow_table()).to_pylist(), key=lambda r: r["id"])


def test_round_trip_every_column_type(spark, store):
    data = [*rows(("a", D1, 1), ("b", D2, 2)), ("c", D2, None, None, None, None, None, None)]
    info = store.replace_partitions(SPEC, frame(spark, data), partitions=[D1, D2])

    assert info.version == 1 and info.rows_written == 3
    seen = table_rows(store)
    assert seen[0] == {
        "id": "a",
        "day": D1,
        "ts": ts(1, 123_456),
        "n": 10**12,
        "rank": 1,
        "ratio": 1 / 3,
        "flag": False,
        "note": "note a é",
    }
    assert seen[2]["ts"] is None and seen[2]["flag"] is None
    back = {r["id"]: r.asDict() for r in store.read(SPEC).collect()}
    assert back["a"]["ts"] == datetime(2026, 1, 1, 1, 0, 0, 123_456)  # UTC session, naive
    assert back["b"]["day"] == D2 and back["b"]["ratio"] == 2 / 3
    assert _types(store.read(SPEC).schema) == _types(SCHEMA)


def test_file_statistics_allow_skipping(spark, store):
    store.replace_partitions(SPEC, frame(spark, rows(("a", D1, 1), ("b", D1, 5))), partitions=[D1])
    actions = pa.table(DeltaTable(str(store.path(SPEC))).get_add_actions(flatten=True))
    assert actions.column("num_records").to_pylist() == [2]
    assert actions.column("min.n").to_pylist() == [10**12]
    assert actions.column("max.n").to_pylist() == [5 * 10**12]
    assert actions.column("min.ts").to_pylist()[0] <= ts(1, 123_456)
    if type(store) is EmbeddedDeltaStore:
        # Millisecond stats rounded outward still bracket the microsecond values.
        assert actions.column("max.ts").to_pylist()[0] >= ts(5, 123_456)
    else:
        # Delta Spark truncates them (its readers add the millisecond back when skipping);
        # sessionize skips files by string and date columns only (`files_with_values`).
        assert actions.column("max.ts").to_pylist()[0] == ts(5, 123_000)
    assert actions.column("null_count.note").to_pylist() == [0]


def test_replace_partitions_replaces_only_those(spark, store):
    store.replace_partitions(
        SPEC, frame(spark, rows(("a", D1, 1), ("b", D2, 2), ("c", D3, 3))), partitions=[D1, D2, D3]
    )
    store.replace_partitions(SPEC, frame(spark, rows(("b2", D2, 4))), partitions=[D2])

    assert [r["id"] for r in table_rows(store)] == ["a", "b2", "c"]
    assert store.version(SPEC) == 2


def test_listed_partition_without_rows_becomes_empty(spark, store):
    store.replace_partitions(
        SPEC, frame(spark, rows(("a", D1, 1), ("b", D2, 2))), partitions=[D1, D2]
    )
    info = store.replace_partitions(SPEC, frame(spark, rows(("c", D3, 3))), partitions=[D2, D3])

    assert [r["id"] for r in table_rows(store)] == ["a", "c"]
    assert info.files_removed == 1 and info.partitions == ("2026-01-02", "2026-01-03")


def test_read_prunes_partitions(spark, store):
    store.replace_partitions(
        SPEC, frame(spark, rows(("a", D1, 1), ("b", D2, 2), ("c", D3, 3))), partitions=[D1, D2, D3]
    )
    assert sorted(r.id for r in store.read(SPEC, partitions=[D1, D3]).collect()) == ["a", "c"]
    assert len(store.live_files(SPEC, partitions=[D2])) == 1
    assert store.read(SPEC, partitions=[]).count() == 0
    assert store.partition_values(SPEC) == ["2026-01-01", "2026-01-02", "2026-01-03"]


def test_reading_a_missing_table_gives_an_empty_frame(store):
    df = store.read(SPEC)
    assert df.count() == 0 and _types(df.schema) == _types(SCHEMA)
    assert store.version(SPEC) is None and not store.exists(SPEC)


def test_rows_outside_the_replaced_partitions_commit_nothing(spark, store):
    store.replace_partitions(SPEC, frame(spark, rows(("a", D1, 1))), partitions=[D1])
    with pytest.raises(LakeError, match="outside the replaced partitions"):
        store.replace_partitions(
            SPEC, frame(spark, rows(("b", D1, 1), ("c", D2, 2))), partitions=[D1]
        )
    assert store.version(SPEC) == 1
    assert [r["id"] for r in table_rows(store)] == ["a"]
    assert _stray_parquet(store) == []


def test_failed_write_leaves_previous_version_intact(spark, store):
    store.replace_partitions(SPEC, frame(spark, rows(("a", D1, 1))), partitions=[D1])

    @F.udf("string")
    def explode(value: str) -> str:
        raise RuntimeError(f"boom on {value}")

    broken = frame(spark, rows(("b", D1, 2))).withColumn("note", explode("id"))
    with pytest.raises(LakeError, match=r"(?s)failed: .*boom on b"):
        store.replace_partitions(SPEC, broken, partitions=[D1])

    assert store.version(SPEC) == 1
    assert [r["id"] for r in table_rows(store)] == ["a"]
    assert _stray_parquet(store) == []


def test_concurrent_writers_on_disjoint_partitions_both_commit(spark, store):
    store.ensure(SPEC)
    errors: list[BaseException] = []

    def write(day: date, ident: str) -> None:
        try:
            writer = type(store)(spark=spark, lake=store.path(SPEC).local_path().parent)
            writer.replace_partitions(SPEC, frame(spark, rows((ident, day, 1))), partitions=[day])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [
        threading.Thread(target=write, args=(day, ident))
        for day, ident in ((D1, "a"), (D2, "b"), (D3, "c"))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert [r["id"] for r in table_rows(store)] == ["a", "b", "c"]
    assert store.version(SPEC) == 3


def test_ensure_adds_new_columns(spark, store):
    store.replace_partitions(SPEC, frame(spark, rows(("a", D1, 1))), partitions=[D1])
    wider = TableSpec(
        name="things",
        partition_by="day",
        schema=StructType([*SCHEMA.fields, StructField("added", StringType(), True)]),
    )
    store.ensure(wider)
    new = frame(spark, rows(("b", D2, 2))).withColumn("added", F.lit("x"))
    store.replace_partitions(wider, new, partitions=[D2])

    got = {r["id"]: r["added"] for r in store.read(wider).collect()}
    assert got == {"a": None, "b": "x"}
    assert "added" in DeltaTable(str(store.path(SPEC))).schema().to_arrow().names


def test_ensure_refuses_a_type_change(spark, store):
    store.ensure(SPEC)
    changed = TableSpec(
        name="things",
        partition_by="day",
        schema=StructType([f if f.name != "n" else StructField("n", StringType()) for f in SCHEMA]),
    )
    with pytest.raises(LakeError, match="changed type"):
        store.ensure(changed)


def test_merge_upserts_on_key_across_partitions(spark, store):
    store.replace_partitions(
        SPEC, frame(spark, rows(("a", D1, 1), ("b", D2, 2), ("c", D3, 3))), partitions=[D1, D2, D3]
    )
    # "b" moves from D2 to D1 and changes; "d" is new; "a" and "c" are untouched.
    info = store.merge(SPEC, frame(spark, rows(("b", D1, 7), ("d", D1, 8))), keys=["id"])

    seen = {r["id"]: (r["day"], r["rank"]) for r in table_rows(store)}
    assert seen == {"a": (D1, 1), "b": (D1, 7), "c": (D3, 3), "d": (D1, 8)}
    assert info.partitions == ("2026-01-01", "2026-01-02")
    assert len(store.live_files(SPEC, partitions=[D3])) == 1  # D3 not rewritten


def test_merge_rejects_duplicate_source_keys(spark, store):
    with pytest.raises(LakeError, match="duplicate keys"):
        store.merge(SPEC, frame(spark, rows(("a", D1, 1), ("a", D2, 2))), keys=["id"])


def test_history_records_commit_metadata(spark, store):
    store.replace_partitions(
        SPEC, frame(spark, rows(("a", D1, 1))), partitions=[D1], commit_metadata={"run": "r1"}
    )
    latest = store.history(SPEC, limit=1)[0]
    assert latest["version"] == 1 and latest["run"] == "r1"


def _stray_parquet(store: EmbeddedDeltaStore) -> list[Path]:
    """Parquet files on disk that no commit of the Delta log ever added (leaked writes).

    The embedded store deletes what a failed commit wrote; Delta Spark, as Delta does, leaves
    it to VACUUM: for it, this runs maintenance (no retention) first, which must delete them.
    """
    root = store.path(SPEC).local_path()
    if type(store) is DeltaSparkStore and store.exists(SPEC):
        store.maintain(SPEC, retention=timedelta(0))
    added = set()
    for commit in (root / "_delta_log").glob("*.json"):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                added.add(str(root / unquote(action["add"]["path"])))
    data = (p for p in root.rglob("*.parquet") if "_delta_log" not in p.relative_to(root).parts)
    return [p for p in data if str(p) not in added]


def _types(schema: StructType) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in schema]


RANGED = TableSpec(name="ranged", schema=SCHEMA, partition_by="day", sort_by=("id",), file_rows=10)


def test_rewrite_only_touches_files_holding_dropped_rows(spark, store):
    data = rows(*((f"user-{i}", D1, i % 24) for i in range(40)))
    store.replace_partitions(RANGED, frame(spark, data), partitions=[D1])
    before = set(store.live_files(RANGED))
    assert len(before) > 1

    info = store.rewrite(
        RANGED,
        partitions=[D1],
        drop_keys=spark.createDataFrame([("user-3",)], "id string"),
        add=lambda: frame(spark, rows(("user-3", D1, 23))),
    )

    after = set(store.live_files(RANGED))
    assert info.files_removed == 1 and len(before - after) == 1
    assert len(before & after) == len(before) - 1  # the other files were not rewritten
    got = {r.id: r.rank for r in store.read(RANGED).collect()}
    assert len(got) == 40 and got["user-3"] == 23 and got["user-4"] == 4


def test_a_write_is_collected_in_partitions_of_bounded_size(spark):
    small = frame(spark, rows(*((f"user-{i}", D1, i % 24) for i in range(40))))
    bound = placement.COLLECTED_BYTES_PER_PARTITION
    assert spread_for_collect(small, 2 * bound) is small  # the shuffle partitions hold it
    spread = spread_for_collect(small, 5 * bound)
    assert spread.rdd.getNumPartitions() == 5
    assert sorted(spread.collect()) == sorted(small.collect())
    # Ingest's bound: the 16.3 MB gzipped day's 127 MiB of text, by its window's keys.
    text = 16 << 20
    assert spread_for_collect(small, 2 * text, per_partition=text, keys=["id"]) is small
    by_key = spread_for_collect(small, 127 << 20, per_partition=text, keys=["id"])
    assert by_key.rdd.getNumPartitions() == 8
    assert sorted(by_key.collect()) == sorted(small.collect())


def test_a_rewrite_collected_in_many_partitions_writes_the_same_table(spark, tmp_path, monkeypatch):
    """The driver's copy-on-write with its rows spread over more partitions than the
    shuffle's (COLLECTED_BYTES_PER_PARTITION lowered to a few rows' worth): the same rows."""
    data = rows(*((f"user-{i}", D1 if i % 3 else D2, i % 24) for i in range(60)))
    changed = tmp_path / "change"
    frame(spark, rows(("user-3", D1, 23), ("user-61", D2, 5))).write.parquet(str(changed))
    seen = {}
    for name, per_partition in (("shuffle", 1 << 40), ("spread", 512)):
        monkeypatch.setattr(placement, "COLLECTED_BYTES_PER_PARTITION", per_partition)
        store = EmbeddedDeltaStore(
            spark=spark, lake=tmp_path / name, driver_write_bytes=DEFAULT_DRIVER_WRITE_BYTES
        )
        store.replace_partitions(RANGED, frame(spark, data), partitions=[D1, D2])
        store.rewrite(
            RANGED,
            partitions=[D1, D2],
            drop_keys=spark.createDataFrame([("user-3",), ("user-6",)], "id string"),
            # Read from files, as the pipeline's rows are: Spark can size them (rows made on
            # the driver it cannot, and they would go to Spark's writer).
            add=lambda: spark.read.schema(SCHEMA).parquet(str(changed)),
        )
        seen[name] = sorted((r.id, r.day, r.rank) for r in store.read(RANGED).collect())
    assert seen["spread"] == seen["shuffle"]
    assert len(seen["spread"]) == 60 and ("user-61", D2, 5) in seen["spread"]


def arrow_rows(*items: tuple) -> pa.Table:
    """`rows` as an Arrow table with the spec's types."""
    names = SCHEMA.fieldNames()
    return pa.Table.from_pylist(
        [dict(zip(names, r, strict=True)) for r in rows(*items)], schema=to_arrow_schema(SCHEMA)
    )


def test_rewrite_arrow_only_touches_files_holding_dropped_rows(spark, store):
    data = rows(*((f"user-{i:02d}", D1, i % 24) for i in range(40)))
    store.replace_partitions(RANGED, frame(spark, data), partitions=[D1])
    before = set(store.live_files(RANGED))
    files = store.files_with_values(RANGED, column="id", values={D1: ["user-03"]})
    assert len(files) == 1 and len(before) == 4

    info = store.rewrite_arrow(
        RANGED,
        drop=pa.table({"id": ["user-03"], "rank": pa.array([3], pa.int32())}),
        files=files,
        add=arrow_rows(("user-03", D1, 23), ("user-99", D2, 1)),
    )

    after = set(store.live_files(RANGED))
    assert info.files_removed == 1 and len(before - after) == 1
    assert len(before & after) == 3  # the other files were not rewritten
    got = {(r.id, r.day): r.rank for r in store.read(RANGED).collect()}
    assert len(got) == 41 and got[("user-03", D1)] == 23 and got[("user-04", D1)] == 4
    # The rewritten file's nine carried rows and the new row are sorted, in files of <= 10.
    new_files = [unquote(p.split(str(store.path(RANGED)) + "/", 1)[1]) for p in after - before]
    written = store.read_files_arrow(RANGED, new_files, columns=["day", "id"])
    assert written.num_rows == 11 and written.column("day").to_pylist().count(D2) == 1
    for path in after - before:
        ids = pq.read_table(path, columns=["id"]).column("id").to_pylist()
        assert ids == sorted(ids) and len(ids) <= 10
    assert _stray_parquet(store) == []


def test_rewrite_arrow_commits_against_its_read_version(spark, store):
    store.replace_partitions(
        SPEC, frame(spark, rows(("a", D1, 1), ("b", D2, 2))), partitions=[D1, D2]
    )
    read = store.version(SPEC)
    files = store.files_with_values(SPEC, column="id", values={D2: ["b"]})
    store.replace_partitions(SPEC, frame(spark, rows(("b2", D2, 3))), partitions=[D2])

    with pytest.raises(WriteConflictError, match="replaced since they were chosen"):
        store.rewrite_arrow(SPEC, drop=pa.table({"id": ["b"]}), files=files, add=arrow_rows())
    with pytest.raises(WriteConflictError, match=r"day 2026-01-02 changed in version\(s\) 2"):
        store.rewrite_arrow(SPEC, add=arrow_rows(("x", D2, 4)), read_version=read)
    assert [r["id"] for r in table_rows(store)] == ["a", "b2"]
    assert _stray_parquet(store) == []
    # With only bookkeeping to record, the commit holds no file.
    before = store.version(SPEC)
    info = store.rewrite_arrow(
        SPEC, add=arrow_rows(), app_transaction=AppTransaction(app_id="t", version=7)
    )
    assert info.files_added == info.files_removed == 0
    assert store.applied_version(SPEC, "t") == 7 and store.version(SPEC) == before + 1


def test_rewrite_with_a_predicate(spark, store):
    store.replace_partitions(
        SPEC, frame(spark, rows(("a", D1, 1), ("b", D1, 2), ("c", D2, 3))), partitions=[D1, D2]
    )
    store.rewrite(SPEC, partitions=[D1, D2], drop=F.col("rank") >= 2, add=lambda: frame(spark, []))
    assert [r["id"] for r in table_rows(store)] == ["a"]


def test_rewrite_redoes_itself_after_a_concurrent_commit(spark, store):
    store.replace_partitions(SPEC, frame(spark, rows(("a", D1, 1))), partitions=[D1])
    calls = []

    def add():
        calls.append(len(calls))
        if len(calls) == 1:  # someone else replaces the file we read while we compute
            other = type(store)(spark=spark, lake=store.path(SPEC).local_path().parent)
            other.replace_partitions(
                SPEC, frame(spark, rows(("a", D1, 5), ("z", D1, 9))), partitions=[D1]
            )
        return frame(spark, rows(("b", D1, 2)))

    store.rewrite(SPEC, partitions=[D1], drop=F.col("id") == "a", add=add)

    if type(store) is EmbeddedDeltaStore:
        assert len(calls) == 2  # the stale attempt was thrown away, not committed
    else:
        assert len(calls) == 1  # the MERGE starts after add(): the change is in its snapshot
    assert [r["id"] for r in table_rows(store)] == ["b", "z"]
    assert _stray_parquet(store) == []


def test_a_commit_against_a_read_version_fails_if_its_partitions_changed_since(spark, store):
    store.replace_partitions(
        SPEC, frame(spark, rows(("a", D1, 1), ("b", D2, 2))), partitions=[D1, D2]
    )
    read = store.version(SPEC)
    # Another run commits D2 after this one read; D3 is nobody's.
    store.replace_partitions(SPEC, frame(spark, rows(("b2", D2, 3))), partitions=[D2])

    with pytest.raises(WriteConflictError, match=r"day 2026-01-02 changed in version\(s\) 2 after"):
        store.replace_partitions(
            SPEC, frame(spark, rows(("x", D2, 4))), partitions=[D2], read_version=read
        )
    with pytest.raises(WriteConflictError):
        store.rewrite(
            SPEC,
            partitions=[D2],
            drop=F.col("id") == "b2",
            add=lambda: frame(spark, []),
            read_version=read,
        )
    assert [r["id"] for r in table_rows(store)] == ["a", "b2"]  # nothing of either
    assert store.version(SPEC) == 2
    assert _stray_parquet(store) == []

    # Partitions nobody else changed commit against the same read version.
    store.replace_partitions(
        SPEC, frame(spark, rows(("c", D3, 5))), partitions=[D3], read_version=read
    )
    store.rewrite(
        SPEC,
        partitions=[D1],
        drop=F.col("id") == "a",
        add=lambda: frame(spark, []),
        read_version=read,
    )
    assert [r["id"] for r in table_rows(store)] == ["b2", "c"]


def test_two_writers_of_one_partition_from_one_read_version_one_commits(spark, store):
    """Launched at once: the check and the commit are one step, so exactly one wins."""
    store.replace_partitions(SPEC, frame(spark, rows(("a", D1, 1))), partitions=[D1])
    read = store.version(SPEC)
    outcomes: list[str] = []

    def write(ident: str) -> None:
        writer = type(store)(spark=spark, lake=store.path(SPEC).local_path().parent)
        try:
            writer.replace_partitions(
                SPEC, frame(spark, rows((ident, D1, 2))), partitions=[D1], read_version=read
            )
            outcomes.append("committed")
        except WriteConflictError:
            outcomes.append("conflict")

    threads = [threading.Thread(target=write, args=(ident,)) for ident in ("x", "y")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(outcomes) == ["committed", "conflict"]
    assert len(table_rows(store)) == 1 and store.version(SPEC) == read + 1


def test_two_runs_that_found_the_table_missing_cannot_both_append(spark, store):
    """Appends are checked too: both runs read the table before it existed, and derived the
    same new rows; the second append would double them."""
    first_read = store.read_version(SPEC)
    second_read = store.read_version(SPEC)
    assert first_read == second_read == NOT_CREATED

    store.rewrite(SPEC, add=lambda: frame(spark, rows(("a", D1, 1))), read_version=first_read)
    with pytest.raises(WriteConflictError, match=r"day 2026-01-01 changed in version\(s\) 1"):
        store.rewrite(SPEC, add=lambda: frame(spark, rows(("a", D1, 1))), read_version=second_read)
    with pytest.raises(WriteConflictError):
        store.replace_partitions_arrow(
            SPEC, arrow_rows(("a", D1, 1)), partitions=[D1], read_version=second_read
        )
    assert [r["id"] for r in table_rows(store)] == ["a"]
    # An append to a partition nobody wrote since is not a conflict.
    store.rewrite(SPEC, add=lambda: frame(spark, rows(("b", D2, 2))), read_version=second_read)
    assert [r["id"] for r in table_rows(store)] == ["a", "b"]


def test_a_commit_that_marks_the_table_conflicts_with_any_commit_since_its_read(spark, store):
    """App transactions are the whole table's bookkeeping: a run that read the mark before
    another run moved it must not move it back, whichever partitions the two wrote."""
    store.replace_partitions(SPEC, frame(spark, rows(("a", D1, 1))), partitions=[D1])
    read = store.read_version(SPEC)
    store.rewrite_arrow(
        SPEC, add=arrow_rows(("b", D2, 2)), app_transaction=AppTransaction(app_id="t", version=9)
    )

    with pytest.raises(WriteConflictError, match="day 2026-01-02"):
        store.rewrite_arrow(
            SPEC,
            add=arrow_rows(("c", D3, 3)),
            app_transaction=AppTransaction(app_id="t", version=8),
            read_version=read,
        )
    with pytest.raises(WriteConflictError):
        store.replace_partitions_arrow(
            SPEC,
            arrow_rows(("c", D3, 3)),
            partitions=[D3],
            app_transaction=AppTransaction(app_id="t", version=8),
            read_version=read,
        )
    assert store.applied_version(SPEC, "t") == 9
    assert [r["id"] for r in table_rows(store)] == ["a", "b"]


def test_only_the_embedded_store_writes_a_small_change_from_the_driver(
    spark, store, request, tmp_path
):
    store.replace_partitions(SPEC, frame(spark, rows(("a", D1, 1))), partitions=[D1])
    # A table's few rows, sized from its files' statistics with no job.
    assert store.writes_on_driver(store.read(SPEC)) == (request.node.callspec.id == "embedded")
    # Rows made on the driver are an RDD Spark cannot size: never taken for small.
    assert not store.writes_on_driver(frame(spark, rows(("a", D1, 1))))
    # A rewrite weighs the files it reads too: the table's one file, then a bound below it.
    files = store.files_with_values(SPEC, column="id", values={D1: ["a"]})
    on_driver = request.node.callspec.id == "embedded"
    assert store.rewrites_on_driver(SPEC, store.read(SPEC), files=files) == on_driver
    if on_driver:
        size = (store.path(SPEC).local_path() / files[0]).stat().st_size
        tight = type(store)(spark=spark, lake=tmp_path / "lake", driver_write_bytes=size)
        assert not tight.rewrites_on_driver(SPEC, store.read(SPEC), files=files)


def test_rows_read_by_spark_name_their_file(spark, store):
    """`read_files(with_file=True)`: Spark's URI of each row's file, which `files_named` maps
    back to the relative path (how a sessions run narrows the files its rewrite searches)."""
    store.replace_partitions(
        SPEC, frame(spark, rows(("a", D1, 1), ("b", D2, 2))), partitions=[D1, D2]
    )
    files = store.files_with_values(SPEC, column="id", values={D1: ["a"], D2: ["b"]})
    rows_read = store.read_files(SPEC, files, with_file=True).collect()
    by_id = {row.id: files_named([row[FILE_COLUMN]], files) for row in rows_read}
    assert sorted(by_id) == ["a", "b"] and sorted(by_id["a"] + by_id["b"]) == sorted(files)
    assert all(
        name[0].startswith(f"day={day}/")
        for name, day in zip((by_id["a"], by_id["b"]), (D1, D2), strict=True)
    )
    with pytest.raises(LakeError, match="cannot map"):
        files_named([row[FILE_COLUMN] for row in rows_read], files[:1])
    assert store.read_files(SPEC, [], with_file=True).columns[-1] == FILE_COLUMN


def test_changes_list_the_files_each_commit_added_and_removed(spark, store):
    store.replace_partitions(SPEC, frame(spark, rows(("a", D1, 1))), partitions=[D1])
    first = store.version(SPEC)
    old = set(store.live_files(SPEC))
    store.replace_partitions(SPEC, frame(spark, rows(("b", D1, 2))), partitions=[D1])
    store.replace_partitions(SPEC, frame(spark, rows(("c", D2, 3))), partitions=[D2])
    last = store.version(SPEC)

    changes = store.changes(SPEC, since_version=first, through_version=last)

    assert changes is not None
    removed = {str(store.path(SPEC) / c.path) for c in changes if not c.added}
    assert removed == old
    assert [(c.partition, c.version, c.added) for c in changes if c.added] == [
        (D1.isoformat(), first + 1, True),
        (D2.isoformat(), first + 2, True),
    ]
    # Each file's size, as the log records it (what a check weighs to read it on the driver).
    sizes = {str(store.path(SPEC) / c.path): c.size for c in changes}
    assert sizes == {path: Path(path).stat().st_size for path in sizes}
    # Removed files stay readable until they are vacuumed: what they held is still known.
    assert [
        r.id for r in store.read_files(SPEC, [c.path for c in changes if not c.added]).collect()
    ] == ["a"]
    for path in old:
        Path(path).unlink()
    assert store.changes(SPEC, since_version=first, through_version=last) is None


def test_files_with_values_keeps_the_files_whose_range_can_hold_a_value(spark, store):
    data = rows(*((f"user-{i:02d}", D1, i % 24) for i in range(40)), ("user-00", D2, 1))
    store.replace_partitions(RANGED, frame(spark, data), partitions=[D1, D2])
    holding = {
        r.id: unquote(r.path.split(f"{RANGED.name}/", 1)[1])
        for r in store.read(RANGED)
        .where(F.col("day") == D1)
        .withColumn("path", F.col("_metadata.file_path"))
        .collect()
    }
    found = store.files_with_values(RANGED, column="id", values={D1: ["user-13", "user-37"]})
    assert sorted(found) == sorted({holding["user-13"], holding["user-37"]})
    assert store.files_with_values(RANGED, column="id", values={D1: ["nobody"]}) == []
    whole = store.files_with_values(RANGED, column="id", values={}, whole=[D2])
    assert len(whole) == 1 and whole[0].startswith("day=2026-01-02/")

    # A rewrite told which files to search leaves every other file alone.
    info = store.rewrite(
        RANGED,
        partitions=[D1],
        drop_keys=spark.createDataFrame([("user-13",)], "id string"),
        files=found,
        add=lambda: frame(spark, []),
    )
    assert info.files_removed == 1
    assert store.read(RANGED).where(F.col("id") == "user-13").count() == 0


def test_bloom_filter_columns_are_written_and_sized_for_their_values(spark, store):
    import pyarrow.parquet as pq

    bloomed = TableSpec(
        name="bloomed",
        schema=SCHEMA,
        partition_by="day",
        bloom_filter_columns=("id",),
        bloom_filter_ndv=1_000,
    )
    store.replace_partitions(bloomed, frame(spark, rows(("a", D1, 1))), partitions=[D1])
    (path,) = store.live_files(bloomed)
    group = pq.ParquetFile(path).metadata.row_group(0)
    columns = {
        group.column(i).path_in_schema: group.column(i).to_dict() for i in range(group.num_columns)
    }
    assert columns["id"]["bloom_filter_offset"] is not None
    assert columns["note"]["bloom_filter_offset"] is None
    # 1,000 values at 1% false positives: 2 KiB, not the writer's 1 MiB default.
    assert columns["id"]["bloom_filter_length"] <= 4 * 1024


def test_read_arrow_gives_nulls_for_a_column_added_after_a_file(store):
    narrow = StructType(SCHEMA.fields[:2])
    old = TableSpec(name="grown", schema=narrow, partition_by="day")
    grown = TableSpec(
        name="grown", schema=StructType([*narrow.fields, SCHEMA["n"]]), partition_by="day"
    )
    store.replace_partitions_arrow(old, pa.table({"id": ["a"], "day": [D1]}), partitions=[D1])
    store.ensure(grown)
    store.replace_partitions_arrow(
        grown, pa.table({"id": ["b"], "day": [D2], "n": [5]}), partitions=[D2]
    )

    assert store.read_arrow(grown).sort_by("id").to_pylist() == [
        {"id": "a", "day": D1, "n": None},
        {"id": "b", "day": D2, "n": 5},
    ]
    assert store.read_arrow(grown, partitions=[D1], columns=["n", "id"]).to_pylist() == [
        {"n": None, "id": "a"}
    ]
    # Filtered as read, on a column and on the partition.
    assert store.read_arrow(grown, columns=["id"], where=pc.field("n") == 5).to_pylist() == [
        {"id": "b"}
    ]
    assert store.read_arrow(grown, columns=["id"], where=pc.field("day") == D1).to_pylist() == [
        {"id": "a"}
    ]


def test_an_app_transaction_must_move_its_version_up(spark, store):
    """Delta Spark skips, without a word, a write whose version is not above the recorded
    one: both backends refuse it instead, so no write is ever silently dropped."""
    store.rewrite(
        SPEC,
        add=lambda: frame(spark, rows(("a", D1, 1))),
        app_transaction=AppTransaction(app_id="t", version=3),
    )
    assert store.applied_version(SPEC, "t") == 3
    with pytest.raises(LakeError, match="would not move it up"):
        store.rewrite(
            SPEC,
            add=lambda: frame(spark, rows(("b", D1, 2))),
            app_transaction=AppTransaction(app_id="t", version=3),
        )
    with pytest.raises(LakeError, match="would not move it up"):
        store.rewrite_arrow(
            SPEC,
            add=arrow_rows(("b", D1, 2)),
            app_transaction=AppTransaction(app_id="t", version=2),
        )
    # A mark with no rows is a commit of its own.
    before = store.version(SPEC)
    store.rewrite(
        SPEC, add=lambda: frame(spark, []), app_transaction=AppTransaction(app_id="t", version=4)
    )
    assert store.applied_version(SPEC, "t") == 4 and store.version(SPEC) == before + 1
    assert [r["id"] for r in table_rows(store)] == ["a"]


def _commit_infos(store: DeltaSparkStore) -> list[dict]:
    """The `commitInfo` of each commit of SPEC's table, oldest first."""
    return [
        json.loads(line)["commitInfo"]
        for commit in sorted((store.path(SPEC).local_path() / "_delta_log").glob("*.json"))
        for line in commit.read_text().splitlines()
        if "commitInfo" in line
    ]


def test_delta_spark_writes_are_delta_s_own_commits(spark, tmp_path):
    """Every commit of a table the delta-spark backend writes from Spark is Delta Spark's
    (its engineInfo), and delta-rs reads the result."""
    store = DeltaSparkStore(spark=spark, lake=tmp_path)
    store.replace_partitions(
        SPEC, frame(spark, rows(("a", D1, 1), ("b", D2, 2))), partitions=[D1, D2]
    )
    store.rewrite(SPEC, partitions=[D1], drop=F.col("id") == "a", add=lambda: frame(spark, []))
    store.rewrite(
        SPEC,
        partitions=[D2],
        drop_keys=spark.createDataFrame([("b",)], "id string"),
        add=lambda: frame(spark, rows(("c", D3, 3))),
    )
    store.merge(SPEC, frame(spark, rows(("c", D3, 4), ("d", D1, 5))), keys=["id"])

    engines = [info.get("engineInfo", "") for info in _commit_infos(store)]
    assert len(engines) == 5  # the table's creation and four writes
    assert all(e.startswith("Apache-Spark/") and "Delta-Lake/4.0" in e for e in engines), engines
    assert {r["id"]: r["rank"] for r in table_rows(store)} == {"c": 4, "d": 5}


def test_a_delta_spark_rewrite_into_partitions_without_files_overwrites_them(spark, tmp_path):
    """Nothing to drop where no file is: Delta's overwrite of the searched partitions, not a
    MERGE. Its rows may lie outside them; the other partitions keep theirs."""
    store = DeltaSparkStore(spark=spark, lake=tmp_path)
    store.replace_partitions(SPEC, frame(spark, rows(("a", D1, 1))), partitions=[D1])
    info = store.rewrite(
        SPEC,
        partitions=[D2],
        drop=F.col("rank") >= 0,
        add=lambda: frame(spark, rows(("b", D2, 2), ("c", D3, 3))),
    )
    assert (info.files_removed, info.rows_written, info.partitions) == (
        0,
        2,
        ("2026-01-02", "2026-01-03"),
    )
    # Where a partition holds a file, the same call is a MERGE that drops its matching rows.
    store.rewrite(SPEC, partitions=[D1, D2], drop=F.col("rank") == 2, add=lambda: frame(spark, []))
    assert [r["id"] for r in table_rows(store)] == ["a", "c"]
    assert [info["operation"] for info in _commit_infos(store)][-3:] == ["WRITE", "WRITE", "MERGE"]


def test_a_delta_spark_overwrite_that_met_a_racing_commit_says_so(spark, tmp_path, monkeypatch):
    """A writer without the lake's lock commits into the searched partitions after the store
    found them empty and before Delta's snapshot: the overwrite removed its rows, which the
    MERGE would have kept, and the rewrite raises saying which partitions to rebuild."""
    store = DeltaSparkStore(spark=spark, lake=tmp_path)
    store.replace_partitions(SPEC, frame(spark, rows(("a", D1, 1))), partitions=[D1])
    other = DeltaSparkStore(spark=spark, lake=tmp_path)
    looked = store.live_files

    def look_then_race(spec, *, partitions=None):
        found = looked(spec, partitions=partitions)
        other.replace_partitions(SPEC, frame(spark, rows(("z", D2, 9))), partitions=[D2])
        return found

    monkeypatch.setattr(store, "live_files", look_then_race)
    with pytest.raises(WriteConflictError, match=r"replaced day \['2026-01-02'\].*rebuild"):
        store.rewrite(
            SPEC,
            partitions=[D2],
            drop=F.col("id") == "nothing",
            add=lambda: frame(spark, rows(("b", D2, 2))),
        )
