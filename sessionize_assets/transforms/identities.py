"""SPEC §3c, identity stitching: which signed-in user an anonymous id belongs to.

An anonymous id is identified by every accepted event that carries it together with a set
`userId` (`segment_user_id`, null when absent or empty). Its `user_id` is that of the latest
such event by (event_ts, event_id), `identified_at` the time of the earliest. A session's
`stitched_user_id` is the `user_id` its user key maps to, else the user key itself: a
session keyed by an anonymous id (no userId yet) joins its user's sessions.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

# The columns of `events` an identity is built from.
IDENTITY_EVENT_COLUMNS = ("event_id", "anonymous_id", "segment_user_id", "event_ts")


def identified(events: DataFrame) -> DataFrame:
    """The events that identify an anonymous id: both ids set."""
    return events.where(F.col("anonymous_id").isNotNull() & F.col("segment_user_id").isNotNull())


def identities_from_events(events: DataFrame) -> DataFrame:
    """`user_identities` rows from every event of the ids they hold (a full build)."""
    order = F.struct("event_ts", "event_id")
    first, latest = F.min(order), F.max(order)
    return (
        identified(events)
        .groupBy("anonymous_id")
        .agg(
            F.max_by("segment_user_id", order).alias("user_id"),
            first.alias("_first"),
            latest.alias("_latest"),
        )
        .select(
            "anonymous_id",
            "user_id",
            F.col("_first.event_ts").alias("identified_at"),
            F.to_date("_first.event_ts").alias("identified_date"),
            F.col("_first.event_id").alias("first_event_id"),
            F.col("_latest.event_ts").alias("latest_at"),
            F.col("_latest.event_id").alias("latest_event_id"),
        )
    )


def stitch(sessions: DataFrame, identities: DataFrame | None) -> DataFrame:
    """`sessions` with `stitched_user_id`: the user its user key maps to, else the key.

    A shuffled hash join, not a broadcast one: broadcasting the identities would be a Spark
    job of its own, and sessions are built partitioned by user already, so only the
    identities move."""
    if identities is None:
        return sessions.withColumn("stitched_user_id", F.col("user_id"))
    mapping = identities.select(
        F.col("anonymous_id").alias("_key"), F.col("user_id").alias("_mapped")
    ).hint("shuffle_hash")
    return (
        sessions.join(mapping, sessions["user_id"] == mapping["_key"], "left")
        .withColumn("stitched_user_id", F.coalesce(F.col("_mapped"), F.col("user_id")))
        .drop("_key", "_mapped")
    )


def stitch_rows(sessions: pa.Table, identities: pa.Table | None) -> pa.Table:
    """`stitch` on the driver: `sessions` with `stitched_user_id` appended, from the
    (`anonymous_id`, `user_id`) rows of `identities` (one per anonymous id)."""
    user = sessions["user_id"]
    if identities is None or not identities.num_rows:
        return sessions.append_column("stitched_user_id", user)
    found = pc.index_in(user, value_set=identities["anonymous_id"])
    mapped = identities["user_id"].take(found)
    return sessions.append_column("stitched_user_id", pc.coalesce(mapped, user))
