"""SPEC §3: chains of events per user, sessions capped at L, quarantine past it."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import date, timedelta

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from sessionize_assets.transforms.attributes import (
    DEVICE_FIELDS,
    EVENT_ATTRIBUTE_COLUMNS,
    PAGE_FIELDS,
    UTM_FIELDS,
)
from sessionize_assets.transforms.channels import channel_sql

QUARANTINE_REASON = "exceeds_max_session_length"
# The columns of `events` a session is built from.
SESSION_EVENT_COLUMNS = (
    "user_id",
    "event_ts",
    "event_id",
    "event_date",
    "event_type",
    "event_name",
    *EVENT_ATTRIBUTE_COLUMNS,
)
# SPEC §3b: page views are these types; the landing and exit pages are `page` events'.
PAGE_VIEW_TYPES = ("page", "screen")
PAGE = "page"
# GA4's engaged session: this long, or this many page views, or a conversion.
ENGAGED_SECONDS = 10
ENGAGED_PAGE_VIEWS = 2


def _micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def chains(events: DataFrame, *, gap: timedelta, max_length: timedelta) -> DataFrame:
    """Each event with its chain's start and whether it falls within start + L.

    A chain starts at a user's first event and at every event more than `gap` after the
    previous one (ordered by event_ts, event_id); exactly `gap` apart stays in the chain.
    """
    order = Window.partitionBy("user_id").orderBy("event_ts", "event_id")
    so_far = order.rowsBetween(Window.unboundedPreceding, 0)
    ts = F.unix_micros("event_ts")
    previous = F.lag(ts).over(order)
    starts = previous.isNull() | ((ts - previous) > F.lit(_micros(gap)))
    # Both running aggregates share the one ordering (one sort): the chain's number counts the
    # starts so far, and its start is the latest start so far (timestamps never decrease
    # along the ordering).
    return (
        events.withColumn("_ts", ts)
        .withColumn("_starts", starts)
        .withColumn("chain", F.sum(F.col("_starts").cast("long")).over(so_far))
        .withColumn("chain_start_us", F.max(F.when(F.col("_starts"), F.col("_ts"))).over(so_far))
        .drop("_starts")
        .withColumn(
            "included", F.col("_ts") <= F.col("chain_start_us") + F.lit(_micros(max_length))
        )
    )


def build_sessions(
    events: DataFrame,
    *,
    gap: timedelta,
    max_length: timedelta,
    conversion_events: Collection[str],
    session_dates: Iterable[date] | None = None,
) -> tuple[DataFrame, DataFrame]:
    """Sessions with their attributes (SPEC §3b) and quarantine rows from events, kept for
    `session_dates` (None: all).

    `events` must hold every event that can decide those dates' sessions: one gap before the
    first date through `max_length + gap` after the last (see partitions.py), with the
    columns of `SESSION_EVENT_COLUMNS`.
    """
    chained = chains(events, gap=gap, max_length=max_length)
    per_chain = chained.groupBy("user_id", "chain").agg(
        F.timestamp_micros(F.min("_ts")).alias("session_start"),
        F.timestamp_micros(F.max(F.when(F.col("included"), F.col("_ts")))).alias("session_end"),
        F.count(F.when(F.col("included"), 1)).alias("event_count"),
        F.count(F.when(~F.col("included"), 1)).alias("excluded_events"),
        F.timestamp_micros(F.max("_ts")).alias("chain_end"),
        F.min("chain_start_us").alias("_start_us"),
        *_attribute_aggregates(conversion_events),
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
        *_attribute_columns(),
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


def _attribute_aggregates(conversion_events: Collection[str]) -> list[Column]:
    """What a session's attributes are picked from, over its included events, in the chain's
    aggregation (no pass of their own): min_by / max_by on (event_ts, event_id), where an
    ordering left null (an event that does not qualify) is skipped."""
    included = F.col("included")
    order = F.struct("_ts", "event_id")
    page = included & (F.col("event_type") == PAGE)
    conversion = (F.col("event_type") == "track") & F.col("event_name").isin(
        *sorted(conversion_events)
    )
    return [
        F.count(F.when(included & F.col("event_type").isin(*PAGE_VIEW_TYPES), 1)).alias(
            "page_views"
        ),
        F.count(F.when(included & conversion, 1)).alias("conversions"),
        F.min_by(F.struct(*PAGE_FIELDS, "url_campaign"), F.when(page, order)).alias("_landing"),
        F.max_by(F.col("page_url"), F.when(page, order)).alias("exit_page_url"),
        F.min_by(F.col("campaign"), F.when(included & F.col("campaign").isNotNull(), order)).alias(
            "_campaign"
        ),
        F.min_by(F.struct(*DEVICE_FIELDS), F.when(included, order)).alias("_first"),
    ]


def _attribute_columns() -> list[Column]:
    """The attribute columns of `sessions` from `_attribute_aggregates`: the campaign is the
    first event's with one, else the landing page URL's parameters. SQL text over our own
    column names (`sql_text`): a few JVM calls instead of hundreds on every run."""
    utm = "coalesce(_campaign, _landing.url_campaign)"
    duration_us = "unix_micros(session_end) - unix_micros(session_start)"
    channel = channel_sql(
        utm_source=f"{utm}.utm_source",
        utm_medium=f"{utm}.utm_medium",
        referrer_host="_landing.referrer_host",
        landing_host="_landing.page_host",
    )
    engaged = (
        f"{duration_us} >= {ENGAGED_SECONDS * 1_000_000} OR page_views >= {ENGAGED_PAGE_VIEWS}"
        " OR conversions >= 1"
    )
    return [
        F.expr(text)
        for text in (
            "CAST(page_views AS BIGINT) AS page_views",
            "CAST(conversions AS BIGINT) AS conversions",
            "_landing.page_url AS landing_page_url",
            "_landing.page_path AS landing_page_path",
            "exit_page_url",
            "_landing.page_referrer AS referrer",
            "_landing.referrer_host AS referrer_host",
            *(f"{utm}.{name} AS {name}" for name in UTM_FIELDS),
            f"{channel} AS channel",
            f"({engaged}) AS is_engaged",
            "_first.device_type AS device_type",
            "_first.os_name AS os_name",
        )
    ]
