"""Events by event date: SPEC §2's cross-batch duplicate rule, batch by batch."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from sessionize_assets.transforms.validation import DEDUP, DUPLICATE

# Among valid copies of one messageId the earliest received batch wins, then the earliest
# receivedAt; the source file only breaks exact ties, so the choice is always the same.
WINNER_ORDER = ("received_date", "received_at", "source_file")


def raw_to_candidates(raw: DataFrame) -> DataFrame:
    """Raw rows in the shape of `events`, keeping the raw line for losing copies."""
    return raw.withColumnRenamed("message_id", "event_id")


def resolve_duplicates(candidates: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Split copies into one winner per event_id and the losing copies.

    Candidates hold at most one copy per (event_id, received_date): batches are deduplicated
    at ingestion.
    """
    rank = F.row_number().over(Window.partitionBy("event_id").orderBy(*WINNER_ORDER))
    ranked = candidates.withColumn("_rank", rank)
    winners = ranked.where(F.col("_rank") == 1).drop("_rank")
    losers = ranked.where(F.col("_rank") > 1).drop("_rank")
    return winners, losers


def duplicate_rejections(losers: DataFrame) -> DataFrame:
    """`rejected_events` rows for copies that lost to an earlier batch."""
    return losers.select(
        "raw_line",
        F.lit(DUPLICATE).alias("reason"),
        F.lit("a copy of this messageId in an earlier batch wins").alias("detail"),
        F.col("event_id").alias("message_id"),
        "received_date",
        "source_file",
        F.lit(DEDUP).alias("origin"),
        "event_date",
    )
