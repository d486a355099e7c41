"""`partitions_differing`: which partitions of a recomputed frame differ from a table's rows,
told by per-partition fingerprints (lake/fingerprints.py)."""

from __future__ import annotations

from datetime import date

import pytest
from pyspark.sql.types import (
    ArrayType,
    DateType,
    StringType,
    StructField,
    StructType,
)

from sessionize_assets.lake.fingerprints import partitions_differing
from sessionize_assets.lake.store import TableSpec

_PAIR = StructType([StructField("a", StringType()), StructField("b", StringType())])
SPEC = TableSpec(
    name="fingerprinted",
    partition_by="day",
    schema=StructType(
        [
            StructField("day", DateType(), False),
            StructField("x", StringType()),
            StructField("y", StringType()),
            StructField("pair", _PAIR),
        ]
    ),
)
D1, D2, D3 = date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)


def _differing(spark, recomputed, held, partitions=(D1, D2, D3)):
    frame = spark.createDataFrame(recomputed, SPEC.schema)
    table = None if held is None else spark.createDataFrame(held, SPEC.schema)
    return partitions_differing(frame, table, spec=SPEC, partitions=partitions)


ROWS = [
    (D1, "a", "b", ("p", "q")),
    (D1, "a", "b", ("p", "q")),  # a row held twice is two rows
    (D2, "c", None, None),
]


def test_the_same_rows_in_another_order_do_not_differ(spark):
    assert _differing(spark, ROWS, list(reversed(ROWS))) == []


def test_a_changed_value_or_a_lost_copy_differs_on_its_partition_only(spark):
    changed = [ROWS[0], ROWS[1], (D2, "c", "d", None)]
    assert _differing(spark, changed, ROWS) == [D2]
    assert _differing(spark, ROWS[1:], ROWS) == [D1]


def test_a_null_moved_to_another_column_differs(spark):
    # xxhash64 skips nulls: without the null flags these would hash alike.
    assert _differing(spark, [(D1, "a", None, None)], [(D1, None, "a", None)]) == [D1]
    assert _differing(spark, [(D1, "a", "b", ("p", None))], [(D1, "a", "b", (None, "p"))]) == [D1]
    assert _differing(spark, [(D1, "a", "b", (None, None))], [(D1, "a", "b", None)]) == [D1]


def test_a_partition_on_one_side_only_differs_and_one_on_neither_does_not(spark):
    assert _differing(spark, [*ROWS, (D3, "e", "f", None)], ROWS) == [D3]
    assert _differing(spark, ROWS[:2], ROWS) == [D2]
    assert _differing(spark, ROWS, None) == [D1, D2]
    # Partitions not asked about are not compared.
    assert _differing(spark, ROWS[:2], ROWS, partitions=[D1]) == []


def test_a_column_whose_nulls_no_flag_tells_apart_is_refused(spark):
    spec = TableSpec(
        name="listed",
        partition_by="day",
        schema=StructType(
            [StructField("day", DateType()), StructField("items", ArrayType(StringType()))]
        ),
    )
    frame = spark.createDataFrame([(D1, ["a", None])], spec.schema)
    with pytest.raises(TypeError, match="items"):
        partitions_differing(frame, frame, spec=spec, partitions=[D1])
