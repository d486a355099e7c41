"""SPEC §3 on the driver: `transforms/sessions.sessions_with_quarantine` over Arrow rows.

A daily batch's sessions run recomputes a few hundred (user, date) pairs from a few thousand
events. Spark's pass over them (a window over the users' events, the chains' aggregation, the
numbering) is a job of about 14 stages, a second or more of scheduling for milliseconds of
work. Here the same rules run in Python over the rows the driver read with Arrow, and give the
same rows: the property test `sessionize_tests/transforms/test_sessions_rows.py` holds the two
equal, column for column, on random events.

The rules, as the Spark pass states them: a user's events ordered by (event_ts, event_id); a
chain starts at the first and after every gap of more than `gap`; its session holds the events
within `max_length` of its start, and a chain with events past it is quarantined; the
attributes are picked among the included events by that order (the landing page and the exit
page from `page` events, the campaign from the first event with one, else the landing URL's,
the device from the first event).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructField, StructType

from sessionize_assets.lake.tables import SESSION_QUARANTINE, SESSIONS
from sessionize_assets.transforms.attributes import UTM_FIELDS, url_campaign, url_host
from sessionize_assets.transforms.channels import channel
from sessionize_assets.transforms.sessions import (
    ENGAGED_PAGE_VIEWS,
    ENGAGED_SECONDS,
    PAGE,
    PAGE_VIEW_TYPES,
    QUARANTINE_DETAIL,
    QUARANTINE_REASON,
    TRACK,
    micros,
)

_DAY_US = 86_400_000_000
_EPOCH = date(1970, 1, 1)


def _schema() -> pa.Schema:
    """The Spark pass's columns and types: those of `sessions` but the label stitching adds,
    and in QUARANTINE_DETAIL the quarantine row's own (those `sessions` lacks, but its
    reason). All nullable: Spark's plan knows some are never null, and a table's writer checks
    its own."""
    fields = [
        StructField(field.name, field.dataType)
        for field in SESSIONS.schema.fields
        if field.name != "stitched_user_id"
    ]
    detail = [
        StructField(field.name, field.dataType)
        for field in SESSION_QUARANTINE.schema.fields
        if field.name not in SESSIONS.schema.fieldNames() and field.name != "reason"
    ]
    return to_arrow_schema(
        StructType([*fields, StructField(QUARANTINE_DETAIL, StructType(detail))])
    )


# The Arrow schema of `sessions_with_quarantine_rows`.
SESSIONS_ROWS_SCHEMA = _schema()
_SESSIONS_SCHEMA = to_arrow_schema(SESSIONS.schema)
_QUARANTINE_SCHEMA = to_arrow_schema(SESSION_QUARANTINE.schema)


@dataclass
class _Chain:
    """One chain of a user's events, as the Spark pass aggregates it."""

    user_id: str
    start_us: int
    end_us: int  # the last included event's time
    chain_end_us: int  # the last event's time
    first: dict[str, Any]  # the first event (always included)
    included: int = 1
    excluded: int = 0
    page_views: int = 0
    conversions: int = 0
    landing: dict[str, Any] | None = None  # the first included `page` event
    exit: dict[str, Any] | None = None  # the last included `page` event
    campaign_event: dict[str, Any] | None = None  # the first included event with a campaign


def sessions_with_quarantine_rows(
    events: pa.Table,
    *,
    gap: timedelta,
    max_length: timedelta,
    conversion_events: Collection[str],
    session_dates: Iterable[date] | None = None,
) -> pa.Table:
    """`sessions_with_quarantine` of these events (the columns of `SESSION_EVENT_COLUMNS`),
    on the driver: the same rows, in SESSIONS_ROWS_SCHEMA, ordered by user and start. As for
    the Spark pass, `events` must hold every event that can decide the dates' sessions."""
    gap_us, cap_us = micros(gap), micros(max_length)
    conversions = set(conversion_events)
    chains = _chains(_event_rows(events), gap_us=gap_us, cap_us=cap_us, conversions=conversions)
    kept = None if session_dates is None else set(session_dates)
    rows: list[dict[str, Any]] = []
    numbers: dict[tuple[str, date], int] = {}
    for chain in chains:  # by user, then start: numbered in that order
        session_date = _EPOCH + timedelta(days=chain.start_us // _DAY_US)
        if kept is not None and session_date not in kept:
            continue
        number = numbers.get((chain.user_id, session_date), 0) + 1
        numbers[(chain.user_id, session_date)] = number
        rows.append(_session_row(chain, session_date, number, cap_us=cap_us))
    return pa.Table.from_pylist(rows, schema=SESSIONS_ROWS_SCHEMA)


def split_quarantine_rows(rows: pa.Table) -> tuple[pa.Table, pa.Table]:
    """`split_quarantine` of `sessions_with_quarantine_rows`' rows with `stitched_user_id`
    appended: the `sessions` rows and the `session_quarantine` rows, in their tables' Arrow
    schemas."""
    sessions = _SESSIONS_SCHEMA
    flagged = rows.filter(pc.fill_null(rows["is_quarantined"], False))
    detail = flagged[QUARANTINE_DETAIL]
    quarantine = {
        **{
            name: flagged[name]
            for name in ("session_id", "user_id", "session_date", "session_start")
        },
        **{field.name: pc.struct_field(detail, field.name) for field in detail.type},
        "reason": pa.repeat(pa.scalar(QUARANTINE_REASON, pa.string()), flagged.num_rows),
    }
    return (
        pa.table([rows[name] for name in sessions.names], schema=sessions),
        pa.table(
            [quarantine[name] for name in _QUARANTINE_SCHEMA.names], schema=_QUARANTINE_SCHEMA
        ),
    )


def _event_rows(events: pa.Table) -> list[dict[str, Any]]:
    """The events as dicts, their times as microseconds (`_ts`), in the pass's order."""
    times = pc.cast(events.column("event_ts"), pa.int64()).to_pylist()
    rows = events.drop_columns(["event_ts"]).to_pylist()
    for row, ts in zip(rows, times, strict=True):
        row["_ts"] = ts
    rows.sort(key=lambda row: (row["user_id"], row["_ts"], row["event_id"]))
    return rows


def _chains(
    rows: Sequence[dict[str, Any]], *, gap_us: int, cap_us: int, conversions: set[str]
) -> list[_Chain]:
    chains: list[_Chain] = []
    chain: _Chain | None = None
    previous: dict[str, Any] | None = None
    for row in rows:
        ts = row["_ts"]
        starts = (
            previous is None
            or previous["user_id"] != row["user_id"]
            or ts - previous["_ts"] > gap_us
        )
        previous = row
        if starts:
            chain = _Chain(
                user_id=row["user_id"], start_us=ts, end_us=ts, chain_end_us=ts, first=row
            )
            chains.append(chain)
        else:
            assert chain is not None
            chain.chain_end_us = ts
            if ts > chain.start_us + cap_us:
                chain.excluded += 1
                continue
            chain.included += 1
            chain.end_us = ts
        _include(chain, row, conversions)
    return chains


def _include(chain: _Chain, row: dict[str, Any], conversions: set[str]) -> None:
    """What an included event adds to its chain's attributes."""
    event_type = row["event_type"]
    if event_type in PAGE_VIEW_TYPES:
        chain.page_views += 1
    if event_type == TRACK and row["event_name"] in conversions:
        chain.conversions += 1
    if event_type == PAGE:
        if chain.landing is None:
            chain.landing = row
        chain.exit = row
    if chain.campaign_event is None and row["campaign"] is not None:
        chain.campaign_event = row


def _session_row(chain: _Chain, session_date: date, number: int, *, cap_us: int) -> dict[str, Any]:
    landing = chain.landing or {}
    exit_page = chain.exit or {}
    first_campaign = chain.campaign_event or {}
    # coalesce(campaign, landing.url_campaign): a campaign object whose fields are all unset
    # still wins.
    utm = first_campaign["campaign"] if first_campaign else landing.get("url_campaign")
    campaign = {name: None if utm is None else utm[name] for name in UTM_FIELDS}
    duration_us = chain.end_us - chain.start_us
    quarantined = chain.excluded > 0
    return {
        "session_id": hashlib.sha256(f"{chain.user_id}|{chain.start_us}".encode()).hexdigest()[:32],
        "user_id": chain.user_id,
        "session_date": session_date,
        "session_start": chain.start_us,  # timestamps as microseconds: Arrow takes them
        "session_end": chain.end_us,
        "duration_seconds": float(duration_us) / 1e6,
        "event_count": chain.included,
        "session_number": number,
        "is_quarantined": quarantined,
        "page_views": chain.page_views,
        "conversions": chain.conversions,
        "landing_page_url": landing.get("page_url"),
        "landing_page_path": landing.get("page_path"),
        "exit_page_url": exit_page.get("page_url"),
        "referrer": landing.get("page_referrer"),
        "referrer_host": landing.get("referrer_host"),
        **campaign,
        "channel": channel(
            utm_source=campaign["utm_source"],
            utm_medium=campaign["utm_medium"],
            referrer_host=landing.get("referrer_host"),
            landing_host=landing.get("page_host"),
        ),
        "is_engaged": duration_us >= ENGAGED_SECONDS * 1_000_000
        or chain.page_views >= ENGAGED_PAGE_VIEWS
        or chain.conversions >= 1,
        "device_type": chain.first["device_type"],
        "os_name": chain.first["os_name"],
        "first_event_id": chain.first["event_id"],
        "landing_at": landing.get("_ts"),
        "exit_at": exit_page.get("_ts"),
        "campaign_at": first_campaign.get("_ts"),
        QUARANTINE_DETAIL: {
            "capped_at": chain.start_us + cap_us,
            "chain_end": chain.chain_end_us,
            "excluded_events": chain.excluded,
        }
        if quarantined
        else None,
    }


def merged_session_row(
    old: Mapping[str, Any],
    added: Sequence[Mapping[str, Any]],
    *,
    gap: timedelta,
    max_length: timedelta,
    conversion_events: Collection[str],
) -> dict[str, Any] | None:
    """The row `sessions_with_quarantine_rows` gives for the events of the session `old` (a
    `sessions` row, its times as microseconds) and `added` (rows of SESSION_EVENT_COLUMNS,
    their times as microseconds in `_ts`), from `old`'s row alone: its counts add up, and its
    SESSION_PICKS say where its first event, landing and exit pages and campaign came from.

    None when the row cannot tell: it has no picks (written before them) or is quarantined;
    an added event does not chain with it (all of them must, `gap` apart at most) or the
    chain runs past `max_length`; an added event's time equals the time of one of `old`'s
    picks (their order is their ids', which the row keeps for the first event only). Its
    `session_number` is left to the caller, who numbers a pair's sessions."""
    if old["first_event_id"] is None or old["is_quarantined"] or not added:
        return None
    gap_us, cap_us = micros(gap), micros(max_length)
    start, end = old["session_start"], old["session_end"]
    rows = sorted(map(dict, added), key=lambda row: (row["_ts"], row["event_id"]))
    before = [row["_ts"] for row in rows if row["_ts"] < start]
    after = [row["_ts"] for row in rows if row["_ts"] > end]
    # Outside the session, each added event is within `gap` of the next one towards it.
    outside = ([*before, start], [end, *after])
    if any(b - a > gap_us for edges in outside for a, b in itertools.pairwise(edges)):
        return None
    first_us = min(start, rows[0]["_ts"])
    if max(end, rows[-1]["_ts"]) - first_us > cap_us:
        return None
    pages = [row for row in rows if row["event_type"] == PAGE]
    campaigns = [row for row in rows if row["campaign"] is not None]
    picked = {old["landing_at"], old["exit_at"], old["campaign_at"]} - {None}
    if any(row["_ts"] in picked for row in (*pages, *campaigns)):
        return None
    conversions = set(conversion_events)
    first = {"device_type": old["device_type"], "os_name": old["os_name"]}
    first["event_id"] = old["first_event_id"]
    if (rows[0]["_ts"], rows[0]["event_id"]) < (start, old["first_event_id"]):
        first = rows[0]
    landing_url = old["landing_page_url"]
    landing = None
    if old["landing_at"] is not None:
        landing = {
            "_ts": old["landing_at"],
            "page_url": landing_url,
            "page_path": old["landing_page_path"],
            "page_referrer": old["referrer"],
            "referrer_host": old["referrer_host"],
            "page_host": url_host(landing_url),
            "url_campaign": dict(zip(UTM_FIELDS, url_campaign(landing_url), strict=True)),
        }
    if pages and (landing is None or pages[0]["_ts"] < landing["_ts"]):
        landing = pages[0]
    exit_page = None
    if old["exit_at"] is not None:
        exit_page = {"_ts": old["exit_at"], "page_url": old["exit_page_url"]}
    if pages and (exit_page is None or pages[-1]["_ts"] > exit_page["_ts"]):
        exit_page = pages[-1]
    campaign_event = (
        None
        if old["campaign_at"] is None
        else {"_ts": old["campaign_at"], "campaign": {name: old[name] for name in UTM_FIELDS}}
    )
    if campaigns and (campaign_event is None or campaigns[0]["_ts"] < campaign_event["_ts"]):
        campaign_event = campaigns[0]
    last_us = max(end, rows[-1]["_ts"])
    chain = _Chain(
        user_id=old["user_id"],
        start_us=first_us,
        end_us=last_us,
        chain_end_us=last_us,
        first=first,
        included=old["event_count"] + len(rows),
        page_views=old["page_views"] + sum(row["event_type"] in PAGE_VIEW_TYPES for row in rows),
        conversions=old["conversions"]
        + sum(row["event_type"] == TRACK and row["event_name"] in conversions for row in rows),
        landing=landing,
        exit=exit_page,
        campaign_event=campaign_event,
    )
    session_date = _EPOCH + timedelta(days=first_us // _DAY_US)
    return _session_row(chain, session_date, old["session_number"], cap_us=cap_us)
