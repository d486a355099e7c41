"""Independent full-recompute references of the SPEC, in plain Python, for the tests.

Nothing here imports the pipeline: it reads the landing files and applies SPEC §2-§3 as
written, so the pipeline's incremental results can be compared with it.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, TypeGuard
from urllib.parse import unquote_plus, urlsplit

FUTURE_TOLERANCE = timedelta(minutes=5)


@dataclass(frozen=True)
class Accepted:
    message_id: str
    user_key: str
    ts: datetime
    received: datetime
    received_date: date
    raw_timestamp: str
    message: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Reference:
    lines: int
    rejections: Counter[str]
    winners: dict[str, Accepted]


def parse_iso(value: Any) -> datetime | None:
    """The project's rule: a string with date and time that fromisoformat takes; naive = UTC."""
    if not isinstance(value, str) or len(value) < 11 or value[10] not in "Tt ":
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def non_empty_str(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and value != ""


MAX_LINE_BYTES = 1 << 20
# Blank: nothing but ASCII whitespace (bytes.strip's set: space, tab, LF, CR, VT, FF).


def read_lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    return data.split(b"\n")


def reference_validate(landing: Path, pipeline_start: date) -> Reference:
    """SPEC §2 in plain Python: checks in order, then duplicate winners across batches."""
    rejections: Counter[str] = Counter()
    candidates: list[Accepted] = []
    lines = 0
    for folder in sorted(landing.glob("received_date=*")):
        try:
            received_date = date.fromisoformat(folder.name.split("=", 1)[1])
        except ValueError:
            continue  # not a received day: no batch
        for path in sorted(folder.iterdir()):
            if not path.name.endswith((".jsonl", ".jsonl.gz")):
                continue
            for raw in read_lines(path):
                if raw.strip() == b"":
                    continue
                lines += 1
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    rejections["invalid_encoding"] += 1
                    continue
                if len(raw) > MAX_LINE_BYTES:
                    rejections["line_too_long"] += 1
                    continue
                reason, accepted = classify(line, received_date, pipeline_start)
                if reason is not None:
                    rejections[reason] += 1
                else:
                    assert accepted is not None
                    candidates.append(accepted)
    winners: dict[str, Accepted] = {}
    for cand in candidates:
        best = winners.get(cand.message_id)
        if best is None:
            winners[cand.message_id] = cand
            continue
        rejections["duplicate"] += 1
        assert (cand.received_date, cand.received) != (best.received_date, best.received)
        if (cand.received_date, cand.received) < (best.received_date, best.received):
            winners[cand.message_id] = cand
    return Reference(lines=lines, rejections=rejections, winners=winners)


def classify(
    line: str, received_date: date, pipeline_start: date
) -> tuple[str | None, Accepted | None]:
    try:
        obj = json.loads(line)
    except ValueError:
        return "malformed_json", None
    if not isinstance(obj, dict):
        return "malformed_json", None
    if not non_empty_str(obj.get("messageId")):
        return "missing_message_id", None
    user_id, anonymous_id = obj.get("userId"), obj.get("anonymousId")
    if not (non_empty_str(user_id) or non_empty_str(anonymous_id)):
        return "missing_user", None
    ts = parse_iso(obj.get("timestamp"))
    if ts is None:
        return "bad_timestamp", None
    received = parse_iso(obj.get("receivedAt"))
    if received is None:
        return "bad_received_at", None
    if ts > received + FUTURE_TOLERANCE:
        return "future_timestamp", None
    if ts.date() < pipeline_start:
        return "before_start", None
    key = user_id if non_empty_str(user_id) else anonymous_id
    assert non_empty_str(key), obj  # validated above: one of the two is a non-empty string
    return None, Accepted(
        obj["messageId"], key, ts, received, received_date, obj["timestamp"], message=obj
    )


# ----------------------------------------------------------------------- reference SPEC §8

_JSON_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


def is_erased_line(raw: bytes, keys: set[str], pipeline_start: date) -> bool:
    """SPEC §8: a valid line whose userId or anonymousId is one of `keys`, or any other line
    whose text holds one as a JSON string."""
    line = raw.decode("utf-8", errors="replace")
    if len(raw) <= MAX_LINE_BYTES and raw.decode("utf-8", errors="ignore") == line:
        _, accepted = classify(line, date.max, pipeline_start)
        if accepted is not None:
            message = accepted.message
            return message.get("userId") in keys or message.get("anonymousId") in keys
    return any(found in keys for found in _JSON_STRING.findall(line))


def without_erased_lines(landing: Path, out: Path, keys: set[str], pipeline_start: date) -> int:
    """A copy of the landing zone at `out` without the erased keys' lines (the zone the lake
    must equal the full recompute of after an erasure); the lines left out."""
    left_out = 0
    for path in sorted(landing.rglob("*")):
        if not path.is_file():
            continue
        target = out / path.relative_to(landing)
        target.parent.mkdir(parents=True, exist_ok=True)
        lines = read_lines(path)
        kept = [
            raw for raw in lines if not (raw.strip() and is_erased_line(raw, keys, pipeline_start))
        ]
        left_out += len(lines) - len(kept)
        data = b"\n".join(kept)
        target.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return left_out


# ----------------------------------------------------------------------- reference SPEC §3


@dataclass(frozen=True)
class RefSession:
    user_id: str
    session_date: date
    session_start: datetime
    session_end: datetime
    event_count: int
    session_number: int
    is_quarantined: bool
    excluded_events: int
    attributes: dict[str, Any] = field(default_factory=dict, compare=False)


def reference_sessions(
    winners: dict[str, Accepted],
    *,
    gap: timedelta,
    max_length: timedelta,
    conversion_events: tuple[str, ...] = ("Order Completed",),
) -> list[RefSession]:
    """SPEC §3 over all accepted events at once."""
    by_user: dict[str, list[Accepted]] = defaultdict(list)
    for event in winners.values():
        by_user[event.user_key].append(event)
    out: list[RefSession] = []
    for user, events in by_user.items():
        events.sort(key=lambda e: (e.ts, e.message_id))
        chains: list[list[Accepted]] = []
        for event in events:
            if not chains or event.ts - chains[-1][-1].ts > gap:
                chains.append([])
            chains[-1].append(event)
        numbers: Counter[date] = Counter()
        for chain in chains:
            start = chain[0].ts
            included = [e for e in chain if e.ts <= start + max_length]
            numbers[start.date()] += 1
            out.append(
                RefSession(
                    user_id=user,
                    session_date=start.date(),
                    session_start=start,
                    session_end=included[-1].ts,
                    event_count=len(included),
                    session_number=numbers[start.date()],
                    is_quarantined=len(included) < len(chain),
                    excluded_events=len(chain) - len(included),
                    attributes=reference_attributes(included, conversion_events),
                )
            )
    return out


# ----------------------------------------------------------------------- reference SPEC §3c


@dataclass(frozen=True)
class RefIdentity:
    user_id: str
    identified_at: datetime


def reference_identities(winners: dict[str, Accepted]) -> dict[str, RefIdentity]:
    """SPEC §3c over all accepted events: each anonymousId seen with a set userId, the userId
    of its latest such event by (event_ts, event_id), the time of its earliest."""
    by_anonymous: dict[str, list[Accepted]] = defaultdict(list)
    for event in winners.values():
        anonymous_id, user_id = event.message.get("anonymousId"), event.message.get("userId")
        if non_empty_str(anonymous_id) and non_empty_str(user_id):
            by_anonymous[anonymous_id].append(event)
    identities = {}
    for anonymous_id, events in by_anonymous.items():
        events.sort(key=lambda e: (e.ts, e.message_id))
        identities[anonymous_id] = RefIdentity(
            user_id=events[-1].message["userId"], identified_at=events[0].ts
        )
    return identities


def stitched(user_key: str, identities: dict[str, RefIdentity]) -> str:
    """A session's `stitched_user_id`: the user its user key maps to, else the key."""
    found = identities.get(user_key)
    return found.user_id if found is not None else user_key


# ----------------------------------------------------------------------- reference SPEC §3b


# The attribute columns of `sessions`, in the table's order, then where they were picked from.
SESSION_ATTRIBUTES = (
    "page_views",
    "conversions",
    "landing_page_url",
    "landing_page_path",
    "exit_page_url",
    "referrer",
    "referrer_host",
    "utm_source",
    "utm_medium",
    "utm_campaign",
    "utm_term",
    "utm_content",
    "channel",
    "is_engaged",
    "device_type",
    "os_name",
    "first_event_id",
    "landing_at",
    "exit_at",
    "campaign_at",
)


def reference_attributes(included: list[Accepted], conversion_events: tuple[str, ...]) -> dict:
    """SPEC §3b over a session's included events, in (event_ts, event_id) order."""
    messages = [e.message for e in included]
    pages = [m for m in messages if m.get("type") == "page"]
    views = sum(1 for m in messages if m.get("type") in ("page", "screen"))
    conversions = sum(
        1 for m in messages if m.get("type") == "track" and m.get("event") in conversion_events
    )
    first = pages[0] if pages else {}
    page_times = [e.ts.replace(tzinfo=None) for e in included if e.message.get("type") == "page"]
    landing_url = _page_value(first, "url")
    referrer = _page_value(first, "referrer")
    with_campaign = [
        e
        for e in included
        if isinstance(e.message.get("context"), dict)
        and isinstance(e.message["context"].get("campaign"), dict)
        and e.message["context"]["campaign"]
    ]
    campaigns = [e.message["context"]["campaign"] for e in with_campaign]
    if campaigns:
        keys = {"utm_source": "source", "utm_medium": "medium", "utm_campaign": "name"}
        keys |= {"utm_term": "term", "utm_content": "content"}
        utm = {column: _is_set(campaigns[0].get(key)) for column, key in keys.items()}
    else:
        utm = _utm_parameters(landing_url)
    duration = (included[-1].ts - included[0].ts).total_seconds()
    context = messages[0].get("context")
    context = context if isinstance(context, dict) else {}
    device, os = context.get("device"), context.get("os")
    device_type = _is_set(device.get("type")) if isinstance(device, dict) else None
    if device_type is None and _is_set(context.get("userAgent")):
        device_type = "web"
    return {
        "page_views": views,
        "conversions": conversions,
        "landing_page_url": landing_url,
        "landing_page_path": _page_value(first, "path"),
        "exit_page_url": _page_value(pages[-1], "url") if pages else None,
        "referrer": referrer,
        "referrer_host": _host(referrer),
        **utm,
        "channel": _channel(utm, _host(referrer), _host(landing_url)),
        "is_engaged": duration >= 10 or views >= 2 or conversions >= 1,
        "device_type": device_type,
        "os_name": _is_set(os.get("name")) if isinstance(os, dict) else None,
        "first_event_id": included[0].message_id,
        "landing_at": page_times[0] if page_times else None,
        "exit_at": page_times[-1] if page_times else None,
        "campaign_at": with_campaign[0].ts.replace(tzinfo=None) if with_campaign else None,
    }


def _is_set(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _page_value(message: dict, key: str) -> str | None:
    """properties.<key>, else context.page.<key>."""
    properties = message.get("properties")
    if isinstance(properties, dict) and _is_set(properties.get(key)):
        return properties[key]
    context = message.get("context")
    page = context.get("page") if isinstance(context, dict) else None
    return _is_set(page.get(key)) if isinstance(page, dict) else None


def _host(url: str | None) -> str | None:
    if url is None:
        return None
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return None
    if host and host.startswith("www."):
        host = host[len("www.") :]
    return host or None


def _utm_parameters(url: str | None) -> dict[str, str | None]:
    names = ("utm_source", "utm_medium", "utm_campaign", "utm_term", "utm_content")
    found: dict[str, str] = {}
    if url is not None:
        try:
            query = urlsplit(url).query
        except ValueError:
            query = ""
        for pair in query.split("&"):
            if not pair:
                continue
            name, _, value = pair.partition("=")
            name = unquote_plus(name)
            if name not in found:
                found[name] = unquote_plus(value)
    return {name: found.get(name) or None for name in names}


def _channel(utm: dict[str, str | None], referrer_host: str | None, landing_host: str | None):
    medium = (utm["utm_medium"] or "").lower()
    host = referrer_host if referrer_host != landing_host else None
    social = {"facebook.com", "m.facebook.com", "instagram.com", "t.co", "twitter.com"}
    social |= {"x.com", "linkedin.com", "reddit.com", "pinterest.com"}
    search = {"bing.com", "duckduckgo.com", "search.yahoo.com", "ecosia.org", "yandex.ru"}
    search |= {"baidu.com"}
    if medium in ("cpc", "ppc", "paidsearch", "paid_search"):
        return "Paid Search"
    if medium in ("paidsocial", "paid_social", "social_paid"):
        return "Paid Social"
    if medium in ("email", "e-mail", "newsletter"):
        return "Email"
    if medium == "affiliate":
        return "Affiliate"
    if medium in ("display", "banner", "cpm"):
        return "Display"
    if medium in ("social", "social-network", "social_network") or host in social:
        return "Organic Social"
    if host is not None and (host.startswith("google.") or host in search):
        return "Organic Search"
    if host is not None:
        return "Referral"
    if utm["utm_source"] is not None or utm["utm_medium"] is not None:
        return "Other Campaign"
    return "Direct"
