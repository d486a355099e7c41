"""SQL text from names and constants: whatever they hold, Spark reads back exactly them."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sessionize_assets.lake.tables import ALL_TABLES
from sessionize_assets.sql_text import select_columns, sql_identifier, sql_string, sql_type

AWKWARD = ["plain", "it's", "back\\slash", "quote ' and \\' both", "tick ` mark", "", "new\nline"]


def test_a_string_constant_reads_back_as_itself(spark):
    row = (
        spark.range(1)
        .select(*(F.expr(sql_string(value)).alias(f"v{i}") for i, value in enumerate(AWKWARD)))
        .first()
    )
    assert list(row) == AWKWARD


def test_a_column_name_selects_that_column(spark):
    names = ["a b", "tick ` mark", "x)", "select"]
    frame = spark.createDataFrame([tuple(range(len(names)))], names)
    row = frame.select(*(F.expr(sql_identifier(name)) for name in reversed(names))).first()
    assert list(row) == list(reversed(range(len(names))))


def test_select_columns_keeps_the_names_in_the_order_given(spark):
    names = ["a b", "tick ` mark", "x)", "select"]
    frame = spark.createDataFrame([tuple(range(len(names)))], names)
    chosen = select_columns(frame, [names[3], names[1], names[0]])
    assert chosen.columns == [names[3], names[1], names[0]]
    assert list(chosen.first()) == [3, 1, 0]


AWKWARD_TYPES = [
    StructType(
        [
            StructField("tick ` mark", StringType()),
            StructField("required", IntegerType(), nullable=False),
            StructField("nested", StructType([StructField("select", DecimalType(12, 3))])),
            StructField("a b", TimestampType(), nullable=False),
        ]
    ),
    DecimalType(38, 0),
]


def _cast_type(spark, text):
    return spark.range(1).selectExpr(f"CAST(NULL AS {text}) AS v").schema["v"].dataType


@pytest.mark.parametrize("data_type", AWKWARD_TYPES, ids=lambda t: t.typeName())
def test_a_type_reads_back_as_itself(spark, data_type):
    assert _cast_type(spark, sql_type(data_type)) == data_type


def test_every_table_type_reads_back_as_itself(spark):
    types = {field.dataType for spec in ALL_TABLES for field in spec.schema}
    assert StructType in {type(t) for t in types}  # the campaign struct of events
    assert {t: _cast_type(spark, sql_type(t)) for t in types} == {t: t for t in types}


@pytest.mark.parametrize(
    "data_type",
    [ArrayType(StringType(), containsNull=False), MapType(StringType(), IntegerType())],
    ids=lambda t: t.typeName(),
)
def test_a_type_no_table_holds_is_refused(data_type):
    with pytest.raises(ValueError, match="no SQL text for a table column"):
        sql_type(data_type)
