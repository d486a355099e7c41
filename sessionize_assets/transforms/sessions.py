"""SPEC §3: chains of events per user, sessions capped at L, quarantine past it."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import date, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sessionize_assets.lake.tables import SESSIONS
from sessionize_assets.sql_text import sql_string, sql_struct
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
# SPEC §3b: conversions are `track` events named in SESSIONIZE_CONVERSION_EVENTS.
TRACK = "track"
# GA4's engaged session: this long, or this many page views, or a conversion.
ENGAGED_SECONDS = 10
ENGAGED_PAGE_VIEWS = 2


def micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def chains(events: DataFrame, *, gap: timedelta, max_length: timedelta) -> DataFrame:
    """Each event with its chain's start and whether it falls within start + L, and its place
    in the user's ordering (`_seq`).

    A chain starts at a user's first event and at every event more than `gap` after the
    previous one (ordered by event_ts, event_id); exactly `gap` apart stays in the chain.
    """
    # Everything here shares the one ordering (one sort): an event's place in it (`_seq`, what
    # the attributes are picked by), the chain's number, which counts the starts so far, and
    # its start, the latest start so far (timestamps never decrease along the ordering).
    # SQL text over our own names: three analysed plans where each `withColumn` was one.
    order = "PARTITION BY user_id ORDER BY event_ts, event_id"
    so_far = f"({order} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"
    ts = "unix_micros(event_ts)"
    previous = f"lag({ts}) OVER ({order})"
    return (
        events.selectExpr(
            "*",
            f"{ts} AS _ts",
            f"row_number() OVER ({order}) AS _seq",
            f"{previous} IS NULL OR {ts} - {previous} > {micros(gap)} AS _starts",
        )
        .selectExpr(
            "*",
            f"sum(CAST(_starts AS BIGINT)) OVER {so_far} AS chain",
            f"max(CASE WHEN _starts THEN _ts END) OVER {so_far} AS chain_start_us",
        )
        .selectExpr("*", f"_ts <= chain_start_us + {micros(max_length)} AS included")
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
    `session_dates` (None: all): `split_quarantine` of `sessions_with_quarantine`."""
    return split_quarantine(
        sessions_with_quarantine(
            events,
            gap=gap,
            max_length=max_length,
            conversion_events=conversion_events,
            session_dates=session_dates,
        )
    )


# What a quarantined session's quarantine row adds to it (null for the others).
QUARANTINE_DETAIL = "_quarantine"


def sessions_with_quarantine(
    events: DataFrame,
    *,
    gap: timedelta,
    max_length: timedelta,
    conversion_events: Collection[str],
    session_dates: Iterable[date] | None = None,
) -> DataFrame:
    """The sessions of `build_sessions`, each with its quarantine row's own columns in
    QUARANTINE_DETAIL: one frame, so that a run keeping it computes the chains once for both
    tables (`split_quarantine` then reads both from it).

    `events` must hold every event that can decide those dates' sessions: one gap before the
    first date through `max_length + gap` after the last (see partitions.py), with the
    columns of `SESSION_EVENT_COLUMNS`.
    """
    per_chain = (
        chains(events, gap=gap, max_length=max_length)
        .groupBy("user_id", "chain")
        .agg(
            *(
                F.expr(text)
                for text in (
                    "timestamp_micros(min(_ts)) AS session_start",
                    "timestamp_micros(max(CASE WHEN included THEN _ts END)) AS session_end",
                    "count(CASE WHEN included THEN 1 END) AS event_count",
                    "count(CASE WHEN NOT included THEN 1 END) AS excluded_events",
                    "timestamp_micros(max(_ts)) AS chain_end",
                    "min(chain_start_us) AS _start_us",
                    *_attribute_aggregates(conversion_events),
                )
            )
        )
    )
    sessions = per_chain.selectExpr(
        "*",
        "to_date(session_start) AS session_date",
        "substring(sha2(concat_ws('|', user_id, CAST(_start_us AS STRING)), 256), 1, 32)"
        " AS session_id",
        "excluded_events > 0 AS is_quarantined",
    )
    if session_dates is not None:
        # Partition values stay Column literals, never SQL text.
        sessions = sessions.where(F.col("session_date").isin(sorted(set(session_dates))))
    number = "PARTITION BY user_id, session_date ORDER BY session_start"
    detail = (
        f"timestamp_micros(_start_us + {micros(max_length)}) AS capped_at",
        "chain_end",
        "CAST(excluded_events AS BIGINT) AS excluded_events",
    )
    return sessions.selectExpr(
        "session_id",
        "user_id",
        "session_date",
        "session_start",
        "session_end",
        "CAST(unix_micros(session_end) - unix_micros(session_start) AS DOUBLE) / 1e6"
        " AS duration_seconds",
        "CAST(event_count AS BIGINT) AS event_count",
        f"CAST(row_number() OVER ({number}) AS INT) AS session_number",
        "is_quarantined",
        *_attribute_columns(),
        f"CASE WHEN is_quarantined THEN struct({', '.join(detail)}) END AS {QUARANTINE_DETAIL}",
    )


def split_quarantine(sessions: DataFrame) -> tuple[DataFrame, DataFrame]:
    """The sessions rows and the quarantine rows of `sessions_with_quarantine`'s frame (or of
    one derived from it, keeping its other columns: `stitched_user_id`)."""
    quarantine = sessions.where("is_quarantined").select(
        "session_id",
        "user_id",
        "session_date",
        "session_start",
        f"{QUARANTINE_DETAIL}.*",
        F.lit(QUARANTINE_REASON).alias("reason"),
    )
    rows = sessions.drop(QUARANTINE_DETAIL)
    # In the table's order (stitching appends its label after SESSION_PICKS).
    present = set(rows.columns)
    ordered = [name for name in SESSIONS.schema.fieldNames() if name in present]
    others = [name for name in rows.columns if name not in ordered]
    return rows.select(*ordered, *others), quarantine


def _attribute_aggregates(conversion_events: Collection[str]) -> list[str]:
    """What a session's attributes are picked from, over its included events, in the chain's
    aggregation (no pass of their own), as SQL text: min_by / max_by on the event's place in
    the (event_ts, event_id) ordering, a long that compares faster than the pair, where an
    ordering left null (an event that does not qualify) is skipped."""
    page = f"included AND event_type = {sql_string(PAGE)}"
    page_view = f"event_type IN ({', '.join(map(sql_string, PAGE_VIEW_TYPES))})"
    # No conversion events configured: nothing converts (`IN ()` is not SQL).
    names = ", ".join(map(sql_string, sorted(conversion_events))) or "NULL"
    conversion = f"event_type = {sql_string(TRACK)} AND event_name IN ({names})"
    return [
        f"count(CASE WHEN included AND {page_view} THEN 1 END) AS page_views",
        f"count(CASE WHEN included AND {conversion} THEN 1 END) AS conversions",
        f"min_by({sql_struct((*PAGE_FIELDS, 'url_campaign', 'event_ts'))},"
        f" CASE WHEN {page} THEN _seq END) AS _landing",
        f"max_by({sql_struct(('page_url', 'event_ts'))}, CASE WHEN {page} THEN _seq END) AS _exit",
        f"min_by({sql_struct(('campaign', 'event_ts'))},"
        " CASE WHEN included AND campaign IS NOT NULL THEN _seq END) AS _campaign",
        f"min_by({sql_struct((*DEVICE_FIELDS, 'event_id'))}, CASE WHEN included THEN _seq END)"
        " AS _first",
    ]


def _attribute_columns() -> list[str]:
    """The attribute columns of `sessions` from `_attribute_aggregates`, and where they were
    picked from (SESSION_PICKS), as SQL text: the campaign is the first event's with one, else
    the landing page URL's parameters."""
    utm = "coalesce(_campaign.campaign, _landing.url_campaign)"
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
        "CAST(page_views AS BIGINT) AS page_views",
        "CAST(conversions AS BIGINT) AS conversions",
        "_landing.page_url AS landing_page_url",
        "_landing.page_path AS landing_page_path",
        "_exit.page_url AS exit_page_url",
        "_landing.page_referrer AS referrer",
        "_landing.referrer_host AS referrer_host",
        *(f"{utm}.{name} AS {name}" for name in UTM_FIELDS),
        f"{channel} AS channel",
        f"({engaged}) AS is_engaged",
        "_first.device_type AS device_type",
        "_first.os_name AS os_name",
        # SESSION_PICKS: where the picks above came from.
        "_first.event_id AS first_event_id",
        "_landing.event_ts AS landing_at",
        "_exit.event_ts AS exit_at",
        "_campaign.event_ts AS campaign_at",
    ]
