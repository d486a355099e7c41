"""SPEC §3: chains of events per user, sessions capped at L, quarantine past it."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date, timedelta

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

QUARANTINE_REASON = "exceeds_max_session_length"


def _micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def chains(events: DataFrame, *, gap: timedelta, max_length: timedelta) -> DataFrame:
    """Each event with its chain's start and whether it falls within start + L.

    A chain starts at a user's first event and at every event more than `gap` after the
    previous one (ordered by event_ts, event_id); exactly `gap` apart stays in the chain.
    """
    order = Window.partitionBy("user_id").orderBy("event_ts", "event_id")
    ts = F.unix_micros("event_ts")
    previous = F.lag(ts).over(order)
    starts = previous.isNull() | ((ts - previous) > F.lit(_micros(gap)))
    numbered = events.withColumn("_ts", ts).withColumn(
        "chain",
        F.sum(starts.cast("long")).over(order.rowsBetween(Window.unboundedPreceding, 0)),
    )
    by_chain = Window.partitionBy("user_id", "chain")
    return numbered.withColumn("chain_start_us", F.min("_ts").over(by_chain)).withColumn(
        "included", F.col("_ts") <= F.col("chain_start_us") + F.lit(_micros(max_length))
    )


def build_sessions(
    events: DataFrame,
    *,
    gap: timedelta,
    max_length: timedelta,
    session_dates: Iterable[date] | None = None,
) -> tuple[DataFrame, DataFrame]:
    """Sessions and quarantine rows from events, kept for `session_dates` (None: all).

    `events` must hold every event that can decide those dates' sessions: one gap before the
    first date through `max_length + gap` after the last (see partitions.py).
    """
    chained = chains(events, gap=gap, max_length=max_length)
    per_chain = chained.groupBy("user_id", "chain").agg(
        F.timestamp_micros(F.min("_ts")).alias("session_start"),
        F.timestamp_micros(F.max(F.when(F.col("included"), F.col("_ts")))).alias("session_end"),
        F.count(F.when(F.col("included"), 1)).alias("event_count"),
        F.count(F.when(~F.col("included"), 1)).alias("excluded_events"),
        F.timestamp_micros(F.max("_ts")).alias("chain_end"),
        F.min("chain_start_us").alias("_start_us"),
    )
    sessions = per_chain.withColumn("session_date", F.to_date("session_start"))
    if session_dates is not None:
        sessions = sessions.where(F.col("session_date").isin(sorted(set(session_dates))))
    sessions = sessions.withColumn(
        "session_id",
        F.substring(
            F.sha2(F.concat_ws("|", "user_id", F.col("_start_us").cast("string")), 256), 1, 32
        ),
    ).withColumn("is_quarantined", F.col("excluded_events") > 0)
    number = Window.partitionBy("user_id", "session_date").orderBy("session_start")
    out = sessions.select(
        "session_id",
        "user_id",
        "session_date",
        "session_start",
        "session_end",
        (
            (F.unix_micros("session_end") - F.unix_micros("session_start")).cast("double") / 1e6
        ).alias("duration_seconds"),
        F.col("event_count").cast("long").alias("event_count"),
        F.row_number().over(number).cast("int").alias("session_number"),
        "is_quarantined",
    )
    quarantine = sessions.where("is_quarantined").select(
        "session_id",
        "user_id",
        "session_date",
        "session_start",
        F.timestamp_micros(F.col("_start_us") + F.lit(_micros(max_length))).alias("capped_at"),
        "chain_end",
        F.col("excluded_events").cast("long").alias("excluded_events"),
        F.lit(QUARANTINE_REASON).alias("reason"),
    )
    return out, quarantine
