"""The floors the benchmarks compare a batch with: bare PySpark sessionizations of the whole
history, with no increments (the script a user would write)."""

from __future__ import annotations

import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import (
    EVENTS,
    RAW_EVENTS,
)
from sessionize_assets.settings import Settings


def bare_sessionization(
    spark: SparkSession, store: DeltaStore, settings: Settings, out: Path
) -> float:
    """The sessions floor: sessions from the accepted events with plain window functions, no
    increments (what a sessions-only rebuild is compared with)."""
    started = time.perf_counter()
    events = store.read(EVENTS).select("user_id", "event_id", F.unix_micros("event_ts").alias("t"))
    write_sessions(events, settings, out)
    return time.perf_counter() - started


def raw_sessionization(
    spark: SparkSession, store: DeltaStore, settings: Settings, out: Path
) -> float:
    """The raw floor, the script a user would write: from `raw_events`, one copy per message
    id (the earliest batch, then the earliest receivedAt: SPEC §2), then sessions as in the
    sessions floor (what the full recompute is compared with)."""
    started = time.perf_counter()
    first = Window.partitionBy("message_id").orderBy("received_date", "received_at")
    events = (
        store.read(RAW_EVENTS)
        .select("message_id", "user_id", "event_ts", "received_date", "received_at")
        .withColumn("copy", F.row_number().over(first))
        .where(F.col("copy") == 1)
        .select(
            "user_id", F.col("message_id").alias("event_id"), F.unix_micros("event_ts").alias("t")
        )
    )
    write_sessions(events, settings, out)
    return time.perf_counter() - started


def write_sessions(events: DataFrame, settings: Settings, out: Path) -> None:
    """Sessions (SPEC §3) of `events` (user_id, event_id, t in microseconds) with plain window
    functions, written as Parquet by session date."""
    gap_us = int(settings.session_gap.total_seconds() * 1_000_000)
    cap_us = int(settings.max_session_length.total_seconds() * 1_000_000)
    order = Window.partitionBy("user_id").orderBy("t", "event_id")
    chains = events.withColumn(
        "chain",
        F.sum(((F.col("t") - F.lag("t").over(order)) > gap_us).cast("int"))
        .over(order)
        .cast("long"),
    )
    per_chain = Window.partitionBy("user_id", "chain")
    sessions = (
        chains.withColumn("start", F.min("t").over(per_chain))
        .where(F.col("t") <= F.col("start") + cap_us)
        .groupBy("user_id", "chain")
        .agg(F.min("t").alias("start"), F.max("t").alias("end"), F.count("*").alias("events"))
        .withColumn("session_date", F.to_date(F.timestamp_micros("start")))
    )
    sessions.write.mode("overwrite").partitionBy("session_date").parquet(str(out))


def bare_recompute(spark: SparkSession, landing: Path, settings: Settings, out: Path) -> float:
    """The whole zone from its JSON lines with plain PySpark: valid lines, one copy per
    messageId (the earliest received), sessions by window functions, Parquet by date."""
    started = time.perf_counter()
    schema = (
        "messageId string, userId string, anonymousId string, timestamp string, receivedAt string"
    )
    lines = spark.read.text(str(landing / "received_date=*" / "*")).select(
        F.from_json("value", schema).alias("m"),
        F.to_date(
            F.regexp_extract(F.input_file_name(), r"received_date=(\d{4}-\d{2}-\d{2})", 1)
        ).alias("received_date"),
    )
    valid = (
        lines.select(
            F.col("m.messageId").alias("event_id"),
            F.coalesce("m.userId", "m.anonymousId").alias("user_id"),
            F.try_to_timestamp("m.timestamp").alias("event_ts"),
            F.try_to_timestamp("m.receivedAt").alias("received_at"),
            "received_date",
        )
        .where("event_id IS NOT NULL AND user_id IS NOT NULL")
        .where("event_ts IS NOT NULL AND received_at IS NOT NULL")
    )
    first = Window.partitionBy("event_id").orderBy("received_date", "received_at")
    events = (
        valid.withColumn("copy", F.row_number().over(first))
        .where("copy = 1")
        .select("user_id", "event_id", F.unix_micros("event_ts").alias("t"))
    )
    write_sessions(events, settings, out)
    return time.perf_counter() - started
