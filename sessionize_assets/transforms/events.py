"""SPEC §2's duplicate rule across batches: one winner per messageId, on any event date."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sessionize_assets.transforms.validation import DEDUP, DUPLICATE

# One copy per (id, batch): ingestion removes copies within a batch (earliest receivedAt,
# then source file, then the line). A copy is therefore named by its id and batch; its event
# date says which `events` partition holds it when it wins.
COPY_KEY = ("event_date", "event_id", "received_date")


def raw_to_candidates(raw: DataFrame) -> DataFrame:
    """Raw rows in the shape of `events`, keeping the raw line for losing copies."""
    return raw.withColumnRenamed("message_id", "event_id")


def mark_winners(copies: DataFrame) -> DataFrame:
    """COPY_KEY of every copy of some ids, each with `wins`: it is its id's copy in the earliest
    batch, whatever the event dates of the copies.

    `copies` must hold every copy of each of its ids (the id index gives them): the earliest
    batch wins (SPEC §2), and within a batch ingestion has already kept one copy.
    """
    first = copies.groupBy("event_id").agg(F.min("received_date").alias("_first"))
    return (
        copies.select(*COPY_KEY)
        .join(first, on="event_id")
        .select(*COPY_KEY, (F.col("received_date") == F.col("_first")).alias("wins"))
    )


def duplicate_rejections(losers: DataFrame) -> DataFrame:
    """`rejected_events` rows for copies that lost to a copy in an earlier batch."""
    return losers.select(
        "raw_line",
        F.lit(DUPLICATE).alias("reason"),
        F.lit("a copy of this messageId in an earlier batch wins").alias("detail"),
        F.col("event_id").alias("message_id"),
        "received_date",
        "source_file",
        F.lit(DEDUP).alias("origin"),
        "event_date",
        F.lit(None).cast("binary").alias("raw_bytes"),  # winners' lines are valid UTF-8
    )


def rejection_keys(rejected: DataFrame) -> DataFrame:
    """COPY_KEY of the duplicate rejections `events` made (origin `events`) in `rejected`."""
    return rejected.where(F.col("origin") == DEDUP).select(
        "event_date", F.col("message_id").alias("event_id"), "received_date"
    )
