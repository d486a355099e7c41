"""SPEC §4: the user lifecycle as an accumulating snapshot, advanced from the previous balance.

A day's states depend only on the day before and that day's sessions, so a range of days is
advanced from the states at `first_date - 1` in one Spark plan, with no recompute from the start.
"""

from __future__ import annotations

from datetime import date, timedelta

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DataType,
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

STATES = ("new", "active", "inactive", "dormant", "churned")


def _fields(*columns: tuple[str, DataType, str]) -> StructType:
    return StructType(
        [StructField(name, kind, False, metadata={"comment": doc}) for name, kind, doc in columns]
    )


STATE_SCHEMA = _fields(
    ("snapshot_date", DateType(), "the day whose end the state describes"),
    ("user_id", StringType(), "user key"),
    ("state", StringType(), "new, active, inactive, dormant or churned"),
    ("first_session_date", DateType(), "date of the user's first session"),
    ("last_session_date", DateType(), "latest session date on or before snapshot_date"),
    ("state_since", DateType(), "first day of the current uninterrupted run in this state"),
    ("days_in_state", IntegerType(), "snapshot_date - state_since + 1"),
)

SNAPSHOT_SCHEMA = _fields(
    ("snapshot_date", DateType(), "the day whose end the counts describe"),
    ("state", StringType(), "new, active, inactive, dormant or churned"),
    ("users", LongType(), "users in the state at the end of the day"),
    ("entered", LongType(), "users in the state on the day and not on the day before"),
    ("exited", LongType(), "users in the state the day before and not on the day"),
)


# What `previous` carries into the range, besides the user.
_BALANCE = (
    ("state", "string"),
    ("first_session_date", "date"),
    ("last_session_date", "date"),
    ("state_since", "date"),
)


def _check_range(first_date: date, last_date: date) -> None:
    # F.sequence counts down when start > stop: refuse rather than compute backwards.
    if last_date < first_date:
        raise ValueError(f"empty range: {first_date} .. {last_date}")


def _state(*, day: Column, first: Column, last: Column, has_session: Column) -> Column:
    idle = F.datediff(day, last)
    return (
        F.when(first == day, "new")
        .when(has_session, "active")
        .when(idle <= 6, "inactive")
        .when(idle <= 29, "dormant")
        .otherwise("churned")
    )


def advance_lifecycle(
    *, previous: DataFrame, session_days: DataFrame, first_date: date, last_date: date
) -> DataFrame:
    """Per-user states (STATE_SCHEMA) for every day of first_date..last_date.

    `previous` holds the states at first_date - 1 (empty at the start date); `session_days`
    holds (user_id, session_date) rows, duplicates and days outside the range ignored. One
    shuffle: everything about a user is gathered in one row, then spread over the calendar.
    """
    _check_range(first_date, last_date)
    day_before = F.lit(first_date - timedelta(days=1))
    balance = previous.where(F.col("snapshot_date") == day_before).select(
        "user_id",
        F.lit(None).cast("date").alias("session_date"),
        "state",
        "first_session_date",
        "last_session_date",
        "state_since",
    )
    sessions = session_days.where(
        F.col("session_date").between(F.lit(first_date), F.lit(last_date))
    ).select(
        "user_id",
        "session_date",
        *(F.lit(None).cast(kind).alias(name) for name, kind in _BALANCE),
    )
    users = (
        balance.unionByName(sessions)
        .groupBy("user_id")
        .agg(
            *(F.max(name).alias(f"_prev_{name}") for name, _ in _BALANCE),
            F.collect_set("session_date").alias("_days"),
            F.min("session_date").alias("_first_in_range"),
        )
        .withColumn("first_session_date", F.coalesce("_prev_first_session_date", "_first_in_range"))
    )
    # One row per user and day, from the later of first_date and the user's first session.
    day = F.col("snapshot_date")
    dated = (
        users.withColumn(
            "snapshot_date",
            F.explode(
                F.sequence(F.greatest("first_session_date", F.lit(first_date)), F.lit(last_date))
            ),
        )
        .withColumn(
            "last_session_date",
            F.greatest(
                "_prev_last_session_date", F.array_max(F.filter("_days", lambda x: x <= day))
            ),
        )
        .withColumn(
            "state",
            _state(
                day=day,
                first=F.col("first_session_date"),
                last=F.col("last_session_date"),
                has_session=F.array_contains("_days", day),
            ),
        )
    )
    # A run starts where the state differs from the day before; on a user's first row here the
    # day before is `previous` (none for a brand new user), whose run may continue.
    by_day = Window.partitionBy("user_id").orderBy("snapshot_date")
    before = F.lag("state").over(by_day)
    run_start = F.when(
        before.isNull(),
        F.when(F.col("state") == F.col("_prev_state"), F.col("_prev_state_since")).otherwise(day),
    ).when(before != F.col("state"), day)
    so_far = by_day.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return (
        dated.withColumn("_run_start", run_start)
        .withColumn("state_since", F.last("_run_start", ignorenulls=True).over(so_far))
        .withColumn("days_in_state", F.datediff(day, "state_since") + 1)
        .select(*(F.col(f.name).cast(f.dataType) for f in STATE_SCHEMA))
    )


def lifecycle_counts(
    *, states: DataFrame, previous: DataFrame, first_date: date, last_date: date
) -> DataFrame:
    """Snapshot rows (SNAPSHOT_SCHEMA): five per day of first_date..last_date, zero-filled.

    `states` must come from advance_lifecycle over the range and `previous` be its balance.
    A user entered their state on D exactly when state_since == D (a brand new user enters
    `new`), and users never drop out, so exited = (in it on D-1) - (in it on D and before):
    one grouping, no per-user pairing of days.
    """
    _check_range(first_date, last_date)
    day = F.col("snapshot_date")
    zero = F.lit(0).cast("long")
    today = states.where(day.between(F.lit(first_date), F.lit(last_date))).select(
        day,
        "state",
        F.lit(1).cast("long").alias("users"),
        (F.col("state_since") == day).cast("long").alias("entered"),
        zero.alias("before"),
    )
    yesterday = (
        states.where(day.between(F.lit(first_date), F.lit(last_date - timedelta(days=1))))
        .select(day, "state")
        .unionByName(
            previous.where(day == F.lit(first_date - timedelta(days=1))).select(day, "state")
        )
        .select(
            F.date_add(day, 1).alias("snapshot_date"),
            "state",
            zero.alias("users"),
            zero.alias("entered"),
            F.lit(1).cast("long").alias("before"),
        )
    )
    # Five zero rows per day so that days and states with nobody still get their row.
    calendar = (
        states.sparkSession.range(1)
        .select(F.explode(F.sequence(F.lit(first_date), F.lit(last_date))).alias("snapshot_date"))
        .select(day, F.explode(F.array(*(F.lit(s) for s in STATES))).alias("state"))
    ).select(
        day,
        "state",
        zero.alias("users"),
        zero.alias("entered"),
        zero.alias("before"),
    )
    totals = (
        today.unionByName(yesterday)
        .unionByName(calendar)
        .groupBy("snapshot_date", "state")
        .agg(*(F.sum(c).alias(c) for c in ("users", "entered", "before")))
    )
    return totals.select(
        "snapshot_date",
        "state",
        "users",
        "entered",
        (F.col("before") - (F.col("users") - F.col("entered"))).alias("exited"),
    ).select(*(F.col(f.name).cast(f.dataType) for f in SNAPSHOT_SCHEMA))
