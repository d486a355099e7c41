"""SQL text from names and constants: whatever they hold, Spark reads back exactly them."""

from __future__ import annotations

from pyspark.sql import functions as F

from sessionize_assets.sql_text import sql_identifier, sql_string

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
