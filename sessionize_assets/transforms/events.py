"""Events by event date: SPEC §2's cross-batch duplicate rule, batch by batch."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from sessionize_assets.transforms.validation import DEDUP, DUPLICATE

# Among valid copies of one messageId the earliest received batch wins, then the earliest
# receivedAt; the source file only breaks exact ties, so the choice is always the same.
WINNER_ORDER = ("received_date", "received_at", "source_file")
# Names one copy: a batch holds one copy of an id.
COPY_OUTCOME_KEY = ("event_id", "received_date")


def raw_to_candidates(raw: DataFrame) -> DataFrame:
    """Raw rows in the shape of `events`, keeping the raw line for losing copies."""
    return raw.withColumnRenamed("message_id", "event_id")


def losing_copies(candidates: DataFrame) -> DataFrame:
    """(event_id, received_date) of every copy that loses to another copy of its id.

    Candidates hold at most one copy per (event_id, received_date): batches are deduplicated
    at ingestion. Copies are wide (the raw line, properties, context) and most ids have one:
    only the ranking columns are shuffled, and only ids with several copies are ranked.
    """
    copies = candidates.select("event_id", *WINNER_ORDER)
    repeated = copies.groupBy("event_id").count().where(F.col("count") > 1).select("event_id")
    rank = F.row_number().over(Window.partitionBy("event_id").orderBy(*WINNER_ORDER))
    return (
        copies.join(repeated, on="event_id", how="left_semi")
        .withColumn("_rank", rank)
        .where(F.col("_rank") > 1)
        .select(*COPY_OUTCOME_KEY)
    )


def split_copies(candidates: DataFrame, losing: DataFrame) -> tuple[DataFrame, DataFrame]:
    """One winner per event_id and the losing copies, given `losing_copies(candidates)`."""
    winners = candidates.join(losing, on=list(COPY_OUTCOME_KEY), how="left_anti")
    losers = candidates.join(losing, on=list(COPY_OUTCOME_KEY), how="left_semi")
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
