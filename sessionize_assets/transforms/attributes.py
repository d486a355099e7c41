"""SPEC §3b's rules for one event: what a session's attributes are taken from.

A session's landing page, referrer, campaign and device are those of one of its events (its
first page event, its first event with a campaign, its first event), so each event's share is
parsed once, at ingestion, in plain Python where the message is already a dict: the rules are
Python's own (`urlsplit`, `parse_qsl`), exact and unit-tested, and `events` carries them as
columns. Building a session then only picks among its events' values, in the same Spark pass
that builds it (`transforms/sessions.py`); the channel is decided there from the values picked
(`transforms/channels.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from pyspark.sql.types import StringType, StructField, StructType

# The campaign fields, as `sessions` names them, and as `context.campaign` does.
UTM_FIELDS = ("utm_source", "utm_medium", "utm_campaign", "utm_term", "utm_content")
CAMPAIGN_KEYS = ("source", "medium", "name", "term", "content")
# The columns of `events` that hold an event's `EventAttributes` (the campaigns as structs).
PAGE_FIELDS = ("page_url", "page_path", "page_referrer", "page_host", "referrer_host")
DEVICE_FIELDS = ("device_type", "os_name")
EVENT_ATTRIBUTE_COLUMNS = (*PAGE_FIELDS, "campaign", "url_campaign", *DEVICE_FIELDS)
# A campaign's fields in `events` (`campaign`, `url_campaign`): named as `sessions` names them.
CAMPAIGN_TYPE = StructType([StructField(name, StringType()) for name in UTM_FIELDS])
# `device_type` of an event with no `context.device.type` but a user agent: a browser.
WEB_DEVICE = "web"

Campaign = tuple[str | None, str | None, str | None, str | None, str | None]


@dataclass(frozen=True, kw_only=True)
class EventAttributes:
    """One event's values for its session's attributes (None: not set).

    `page_*` and the hosts are read for every event; a session takes them from its page
    events only. `campaign` is None unless `context.campaign` is a non-empty object (whose
    fields may all be unset); `url_campaign` holds `page_url`'s `utm_*` query parameters.
    """

    page_url: str | None = None
    page_path: str | None = None
    page_referrer: str | None = None
    page_host: str | None = None
    referrer_host: str | None = None
    campaign: Campaign | None = None
    url_campaign: Campaign = (None, None, None, None, None)
    device_type: str | None = None
    os_name: str | None = None


def event_attributes(properties: Any, context: Any) -> EventAttributes:
    """The attributes' values of a message with these `properties` and `context` (anything
    that is not a JSON object counts as `{}`)."""
    props = properties if isinstance(properties, dict) else {}
    ctx = context if isinstance(context, dict) else {}
    page = _object(ctx, "page")
    url = _set(props, "url") or _set(page, "url")
    referrer = _set(props, "referrer") or _set(page, "referrer")
    campaign = ctx.get("campaign")
    return EventAttributes(
        page_url=url,
        page_path=_set(props, "path") or _set(page, "path"),
        page_referrer=referrer,
        page_host=url_host(url),
        referrer_host=url_host(referrer),
        campaign=(
            _campaign([_set(campaign, key) for key in CAMPAIGN_KEYS])
            if isinstance(campaign, dict) and campaign
            else None
        ),
        url_campaign=url_campaign(url),
        device_type=_set(_object(ctx, "device"), "type")
        or (WEB_DEVICE if _set(ctx, "userAgent") else None),
        os_name=_set(_object(ctx, "os"), "name"),
    )


def url_host(url: str | None) -> str | None:
    """The host of `url` as `urlsplit(url).hostname` gives it (lower-case, no user, no port),
    less a leading `www.`; None when it has none or cannot be parsed."""
    if url is None:
        return None
    try:
        host = urlsplit(url).hostname
    except ValueError:  # an unbalanced IPv6 bracket, say
        return None
    if host is None:
        return None
    host = host.removeprefix("www.")
    return host or None


def url_campaign(url: str | None) -> Campaign:
    """`url`'s `utm_*` query parameters, decoded as a form (`+` a space, `%xx` decoded): the
    first occurrence of each, None when it is absent or empty."""
    if url is None:
        return (None, None, None, None, None)
    try:
        query = urlsplit(url).query
    except ValueError:
        return (None, None, None, None, None)
    first: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        first.setdefault(name, value)
    return _campaign([first.get(name) or None for name in UTM_FIELDS])


def _object(parent: dict[str, Any], key: str) -> dict[str, Any]:
    value = parent.get(key)
    return value if isinstance(value, dict) else {}


def _campaign(values: list[str | None]) -> Campaign:
    """The five campaign fields, in `Campaign`'s order, from a list of them in that order."""
    source, medium, name, term, content = values
    return (source, medium, name, term, content)


def _set(parent: dict[str, Any], key: str) -> str | None:
    """`parent[key]` when it is a non-empty string: SPEC §3b's "is set"."""
    value = parent.get(key)
    return value if isinstance(value, str) and value else None
