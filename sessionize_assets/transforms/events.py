"""Events by event date: SPEC §2's cross-batch duplicate rule, batch by batch."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from sessionize_assets.transforms.validation import DEDUP, DUPLICATE

# Among valid copies of one messageId the earliest received batch wins, then the earliest
# receivedAt; the source file only breaks exact ties, so the choice is always the same.
WINNER_ORDER = ("received_date", "received_at", "source_file")
# One copy per (id, batch): ingestion removes copies within a batch. Unique within a date.
COPY_KEY = ("event_date", "event_id", "received_date")


def raw_to_candidates(raw: DataFrame) -> DataFrame:
    """Raw rows in the shape of `events`, keeping the raw line for losing copies."""
    return raw.withColumnRenamed("message_id", "event_id")


def losing_copies(candidates: DataFrame) -> DataFrame:
    """COPY_KEY of every copy that loses to another copy of its id on its event date.

    Candidates hold at most one copy per (event_id, received_date): batches are deduplicated
    at ingestion. Copies are wide (the raw line, properties, context) and most ids have one:
    only the ranking columns are shuffled, and only ids with several copies are ranked.
    """
    event = ["event_date", "event_id"]
    copies = candidates.select(*event, *WINNER_ORDER)
    repeated = copies.groupBy(*event).count().where(F.col("count") > 1).select(*event)
    rank = F.row_number().over(Window.partitionBy(*event).orderBy(*WINNER_ORDER))
    return (
        copies.join(repeated, on=event, how="left_semi")
        .withColumn("_rank", rank)
        .where(F.col("_rank") > 1)
        .select(*COPY_KEY)
    )


def split_copies(candidates: DataFrame, losing: DataFrame) -> tuple[DataFrame, DataFrame]:
    """One winner per event id and date, and the losing copies, given `losing_copies`."""
    winners = candidates.join(losing, on=list(COPY_KEY), how="left_anti")
    losers = candidates.join(losing, on=list(COPY_KEY), how="left_semi")
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
        F.lit(None).cast("binary").alias("raw_bytes"),  # winners' lines are valid UTF-8
    )
