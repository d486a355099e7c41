"""SPEC §2's duplicate rule within one batch: among the valid copies of a `messageId` in a
batch, the earliest `receivedAt` wins; every other copy is a `duplicate` rejection.

Ties fall to the source file and then the line's text (both compared as bytes), so the winner
never depends on the order lines are read in. The rule is applied where the batch's rows are:
by Spark's executors for a large batch (`rank_copies`, `split_batch`), or on the driver with
Arrow for a batch collected there whole (`split_collected`), which spares its Spark job the
shuffle a window needs. Both give the same rows (`test_copies.py` compares them).

The rule across batches (the earliest batch wins) belongs to `events` (`pipeline/events.py`).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from sessionize_assets.transforms.validation import DUPLICATE, INGEST

# The order copies of one messageId in one batch are ranked in: the first wins.
COPY_ORDER = ("received_at", "source_file", "raw_line")
DUPLICATE_DETAIL = "another copy of this messageId in the same batch was received first"
# The columns of a rejection (`rejected_events` but `origin` and `event_date`).
REJECTION_COLUMNS = (
    "raw_line",
    "reason",
    "detail",
    "message_id",
    "received_date",
    "source_file",
    "raw_bytes",
)

# The rank of a valid line among its batch's copies of its messageId (1 is the copy kept);
# null for a line rejected before the duplicate rule.
COPY_RANK = "_copy_rank"


def rank_copies(parsed: DataFrame) -> DataFrame:
    """`parsed` (`parse_lines`' rows) with COPY_RANK: among the valid copies of a messageId in
    one batch, 1 for the winner.

    One window, partitioned by (received_date, message_id) and validity: input already
    hash-partitioned by (received_date, message_id) (`spread_for_collect`) is not shuffled
    again. A caller that reads the result more than once persists it, so the copies are
    shuffled and ranked once (`pipeline/ingest.py`).
    """
    valid = F.col("reason").isNull()
    rank = F.row_number().over(
        Window.partitionBy("received_date", "message_id", valid).orderBy(*COPY_ORDER)
    )
    return parsed.withColumn(COPY_RANK, F.when(valid, rank))


def split_batch(ranked: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Accepted events and rejections of each batch (`rank_copies`' output), with the
    in-batch duplicates (a COPY_RANK over 1) rejected."""
    accepted = ranked.where(F.col(COPY_RANK) == 1).drop(COPY_RANK, "reason", "detail", "raw_bytes")
    duplicates = (
        ranked.where(F.col(COPY_RANK) > 1)
        .withColumns({"reason": F.lit(DUPLICATE), "detail": F.lit(DUPLICATE_DETAIL)})
        .select(*REJECTION_COLUMNS)
    )
    invalid = ranked.where(F.col("reason").isNotNull()).select(*REJECTION_COLUMNS)
    rejected = invalid.unionByName(duplicates).select(
        "*", F.lit(INGEST).alias("origin"), F.lit(None).cast("date").alias("event_date")
    )
    return accepted, rejected


def split_collected(rows: pa.Table) -> tuple[pa.Table, pa.Table]:
    """`split_batch` on the driver, for `parse_lines`' rows collected unranked: the accepted
    rows (every column of `rows`), and the rejections (REJECTION_COLUMNS, `origin` and a null
    `event_date`), the invalid lines first, then the copies that lost.

    The rule is decided on an ordering of the rows' indices (invalid lines last, then by
    batch, messageId and COPY_ORDER), and each table is filtered from `rows` once: a batch's
    text is most of the driver's memory here."""
    invalid = pc.is_valid(rows.column("reason"))
    order = pc.sort_indices(
        rows.select(["received_date", "message_id", *COPY_ORDER]).append_column(
            "_invalid", invalid
        ),
        sort_keys=[
            (name, "ascending") for name in ("_invalid", "received_date", "message_id", *COPY_ORDER)
        ],
    )
    # In that order, a valid line whose (received_date, messageId) is its predecessor's lost.
    keys = rows.select(["received_date", "message_id"]).take(order).combine_chunks()
    loses = pa.array([], pa.bool_())
    if count := rows.num_rows:
        batch, message = keys.column("received_date"), keys.column("message_id")
        repeated = pc.and_(
            pc.equal(batch.slice(1), batch.slice(0, count - 1)),
            pc.equal(message.slice(1), message.slice(0, count - 1)),
        )
        # Back in the rows' order (the inverse of `order`); an invalid line never loses.
        sorted_loses = pa.concat_arrays([pa.array([False]), *repeated.chunks])
        loses = pc.and_kleene(sorted_loses.take(pc.sort_indices(order)), pc.invert(invalid))
    duplicates = rows.filter(loses).select(REJECTION_COLUMNS)
    for name, value in (("reason", DUPLICATE), ("detail", DUPLICATE_DETAIL)):
        duplicates = duplicates.set_column(
            REJECTION_COLUMNS.index(name),
            name,
            pa.array([value] * duplicates.num_rows, pa.string()),
        )
    rejected = pa.concat_tables([rows.filter(invalid).select(REJECTION_COLUMNS), duplicates])
    rejected = rejected.append_column(
        "origin", pa.array([INGEST] * rejected.num_rows, pa.string())
    ).append_column("event_date", pa.nulls(rejected.num_rows, pa.date32()))
    return rows.filter(pc.invert(pc.or_kleene(invalid, loses))), rejected
