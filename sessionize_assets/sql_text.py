"""Spark SQL text from names and constants, for expressions built in one JVM call.

A query built from `Column` objects costs a JVM round trip per operator; a wide one (a struct
of every logged column, the channel rules' CASE) costs hundreds of them, on the driver, on
every run. Text written here is parsed by Spark once. Only names and constants of the code go
into it, each quoted here, so no value can change an expression's shape; values that come
from data or partitions stay `Column` literals.
"""

from __future__ import annotations


def sql_identifier(name: str) -> str:
    """A column name as Spark SQL text: backquoted, a backquote in it doubled, so no name can
    change an expression's shape (for the SQL text Delta requires, and for expressions built
    in one JVM call instead of one per column)."""
    return "`" + name.replace("`", "``") + "`"


def sql_string(value: str) -> str:
    """A string constant as a Spark SQL literal: single-quoted, with backslashes and quotes
    escaped (Spark's default parser reads backslash escapes in literals)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
