"""Spark SQL text from names and constants, for expressions built in one JVM call.

A query built from `Column` objects costs a JVM round trip per operator; a wide one (a struct
of every logged column, the channel rules' CASE) costs hundreds of them, on the driver, on
every run. Text written here is parsed by Spark once. Only names, the code's constants and
settings go into it, each quoted here, so no value can change an expression's shape; values
that come from data or partitions stay `Column` literals.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import DataFrame
from pyspark.sql.types import ArrayType, DataType, MapType, StructType


def sql_identifier(name: str) -> str:
    """A column name as Spark SQL text: backquoted, a backquote in it doubled, so no name can
    change an expression's shape (for the SQL text Delta requires, and for expressions built
    in one JVM call instead of one per column)."""
    return "`" + name.replace("`", "``") + "`"


def select_columns(df: DataFrame, names: Iterable[str]) -> DataFrame:
    """`df.select(*names)` as SQL text: a name passed to `select` is a `Column` made by a JVM
    call of its own, then sent again in the list; text costs one call per name. Every read
    of a table orders its columns this way."""
    return df.selectExpr(*map(sql_identifier, names))


def sql_string(value: str) -> str:
    """A string constant as a Spark SQL literal: single-quoted, with backslashes and quotes
    escaped (Spark's default parser reads backslash escapes in literals)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_struct(names: Iterable[str]) -> str:
    """A struct of these columns as Spark SQL text, its fields named as the columns."""
    return f"struct({', '.join(map(sql_identifier, names))})"


def sql_type(data_type: DataType) -> str:
    """A table column's Spark type as SQL text that parses back to an equal type: an atomic
    type, or a struct of them (field names quoted, their nullability kept; field metadata is
    not written); `ValueError` for other types, which no table holds. A cast of a whole row
    to text types is one JVM call, where `Column.cast(DataType)` sends each type to the JVM
    on its own."""
    if isinstance(data_type, StructType):
        fields = ", ".join(
            sql_identifier(field.name)
            + ": "
            + sql_type(field.dataType)
            + ("" if field.nullable else " NOT NULL")
            for field in data_type.fields
        )
        return f"STRUCT<{fields}>"
    if isinstance(data_type, (ArrayType, MapType)):
        raise ValueError(f"no SQL text for a table column of type {data_type.simpleString()}")
    return data_type.simpleString()
