"""Deterministic generator of a realistic Segment-style landing zone (SPEC §1-§2).

Why: the pipeline must be exercised on data with the awkward parts of real event streams (late
mobile uploads, retries, bots, broken lines, mixed timestamp formats) while the outcome stays
known exactly, so tests and demos can check counts instead of eyeballing them. Standard library
only, so it runs anywhere without Spark or Dagster.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from itertools import accumulate
from pathlib import Path
from typing import Any

REJECTION_REASONS: tuple[str, ...] = (
    "malformed_json",
    "missing_message_id",
    "missing_user",
    "bad_timestamp",
    "bad_received_at",
    "future_timestamp",
    "before_start",
    "duplicate",
)

_SECOND = 1_000
_MINUTE = 60 * _SECOND
_HOUR = 60 * _MINUTE
_DAY = 24 * _HOUR
_GAP = 30 * _MINUTE  # SPEC §3 default inactivity gap: used to place sessions and boundary gaps
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_DATE = date(1970, 1, 1)
_MAX_LATENESS_DAYS = 90.0

# Local hour weights: people use apps in the evening far more than at 4 am.
_HOUR_CUM_WEIGHTS = list(
    accumulate([1, 0.6, 0.3, 0.2, 0.2, 0.3, 1, 2, 3, 3, 3, 3, 4, 4, 3, 3, 3, 4, 5, 6, 7, 6, 4, 2])
)

# (IANA name, UTC offset in minutes): includes half- and three-quarter-hour offsets on purpose.
_TIMEZONES: tuple[tuple[str, int], ...] = (
    ("Europe/Berlin", 60),
    ("Europe/London", 0),
    ("Africa/Cairo", 120),
    ("America/New_York", -300),
    ("America/Los_Angeles", -480),
    ("America/Sao_Paulo", -180),
    ("America/St_Johns", -210),
    ("Asia/Kolkata", 330),
    ("Asia/Kathmandu", 345),
    ("Asia/Tokyo", 540),
    ("Australia/Brisbane", 600),
)
_TZ_WEIGHTS = (20, 12, 5, 18, 12, 6, 2, 10, 2, 8, 5)

_PAGES = ("Home", "Category", "Product", "Cart", "Search", "Account", "Help")
_SCREENS = ("Home", "Feed", "Product Detail", "Cart", "Settings", "Orders")
_CATEGORIES = ("shoes", "outdoor", "electronics", "kitchen", "books", "toys")
_QUERIES = ("running shoes", "café crème", "usb-c cable", "winter jacket", "fußball", "lego")
_BOT_AGENTS = (
    "Mozilla/5.0 (compatible; AhrefsBot/7.0; +http://ahrefs.com/robot/)",
    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
    "python-requests/2.31.0",
    "HeadlessChrome/120.0.6099.109 uptime-monitor",
)


@dataclass(frozen=True)
class GenerationReport:
    """What was written and what a correct SPEC §2 implementation must make of it."""

    out: Path
    batches: int
    files: int
    lines: int
    valid_events: int
    late_events: int
    expected_rejections: dict[str, int]

    def summary(self) -> str:
        """A few lines for humans running `sessionize generate`."""
        rejected = sum(self.expected_rejections.values())
        reasons = ", ".join(f"{k}={v}" for k, v in self.expected_rejections.items() if v)
        return "\n".join(
            [
                f"wrote {self.batches} batches, {self.files} files, {self.lines} lines to "
                f"{self.out}",
                f"expected: {self.valid_events} valid events ({self.late_events} late), "
                f"{rejected} rejected lines",
                f"rejections: {reasons or 'none'}",
            ]
        )


@dataclass(slots=True)
class _User:
    """Static traits of one simulated user; they drive formats, identity and activity."""

    index: int
    is_bot: bool
    platform: str  # web | ios | android | server
    identity: str  # identified | anonymous | converting
    anon_user_field: str  # how an anonymous user's SDK sends userId: absent | null | empty
    user_id: str
    anonymous_id: str | None
    ts_style: str  # z_ms | z_s | offset | naive | utc_us
    offset_min: int
    first_day: int
    activity: float
    churn_day: int | None
    break_days: range
    return_day: int | None
    context: dict[str, Any]
    identified: bool = False  # converting users flip this at their identify call


@dataclass(slots=True)
class _Copy:
    """One valid-intent line: a message as delivered at `received` (retries share a payload)."""

    payload: dict[str, Any]
    message_id: str
    ts: int
    received: int
    pos: int  # ordering key inside the batch's files (a retry may be written before its original)
    sent_latency: int


@dataclass(slots=True)
class _Line:
    batch: int
    pos: int
    seq: int
    text: str


def generate_landing_zone(
    *,
    out: Path,
    start: date,
    days: int,
    users: int,
    seed: int,
    late_share: float = 0.05,
    bot_share: float = 0.01,
    duplicate_share: float = 0.01,
    invalid_share: float = 0.005,
    pipeline_start: date | None = None,
    gzip_share: float = 0.3,
) -> GenerationReport:
    """Write a landing zone for [start, start + days) under `out` and report the expected outcome.

    Same arguments give byte-identical files. Existing `*.jsonl[.gz]` files in the batch folders
    written are replaced (a re-delivery); other `received_date=` folders under `out` are refused
    because they would silently change the expected counts.
    """
    _check_args(days, users, late_share, bot_share, duplicate_share, invalid_share, gzip_share)
    out = Path(out)
    pipeline_start = start if pipeline_start is None else pipeline_start
    start_ms = _date_ms(start)
    end_ms = start_ms + days * _DAY
    batch_names = [f"received_date={(start + timedelta(days=d)).isoformat()}" for d in range(days)]
    _refuse_foreign_batches(out, set(batch_names))

    people = _make_users(seed, users, days, bot_share)
    copies: list[_Copy] = []
    for user in people:
        rng = random.Random(f"sessionize:{seed}:events:{user.index}")
        if user.is_bot:
            copies.extend(_bot_copies(user, rng, start_ms, end_ms))
        else:
            copies.extend(_human_copies(user, rng, start_ms, end_ms, days, late_share))
    copies = [c for c in copies if start_ms <= c.received < end_ms and c.ts >= start_ms]
    copies.extend(
        _retries(
            copies,
            random.Random(f"sessionize:{seed}:retries"),
            end_ms,
            duplicate_share,
            _date_ms(pipeline_start),
        )
    )

    valid_ids = {c.message_id for c in copies}
    bad_rng = random.Random(f"sessionize:{seed}:invalid")
    n_invalid = 0
    if invalid_share > 0:
        wanted = round(invalid_share * len(copies) / (1 - invalid_share))
        n_invalid = max(len(_MANDATORY_VARIANTS), wanted)
    invalid = _invalid_lines(
        bad_rng, people, n_invalid, days, start_ms, _date_ms(pipeline_start), valid_ids
    )

    valid_events, late_events, rejections = _expected_outcome(
        copies, invalid, _date_ms(pipeline_start)
    )

    lines = [
        _Line(
            batch=(c.received - start_ms) // _DAY,
            pos=c.pos,
            seq=i,
            text=_dumps(_render(c)),
        )
        for i, c in enumerate(copies)
    ]
    lines.extend(
        _Line(batch=b, pos=p, seq=len(copies) + i, text=t)
        for i, (b, p, t, _reason) in enumerate(invalid)
    )
    files = _write_batches(
        out, batch_names, lines, random.Random(f"sessionize:{seed}:files"), gzip_share
    )
    return GenerationReport(
        out=out,
        batches=days,
        files=files,
        lines=len(lines),
        valid_events=valid_events,
        late_events=late_events,
        expected_rejections={r: rejections.get(r, 0) for r in REJECTION_REASONS},
    )


# --------------------------------------------------------------------------- users


def _check_args(days: int, users: int, *shares: float) -> None:
    if days < 1:
        raise ValueError(f"days must be at least 1, got {days}")
    if users < 0:
        raise ValueError(f"users must be >= 0, got {users}")
    for share in shares:
        if not 0 <= share < 1:
            raise ValueError(f"shares must be in [0, 1), got {share}")


def _make_users(seed: int, users: int, days: int, bot_share: float) -> list[_User]:
    """Users differ in platform, identity, time zone and habits, as in a real product."""
    rng = random.Random(f"sessionize:{seed}:users")
    n_bots = round(users * bot_share)
    if bot_share > 0 and users >= 20:
        n_bots = max(1, n_bots)
    bot_slots = set(rng.sample(range(users), n_bots)) if n_bots else set()
    people: list[_User] = []
    for index in range(users):
        is_bot = index in bot_slots
        platform = (
            "web"
            if is_bot
            else rng.choices(("web", "ios", "android", "server"), (50, 20, 20, 10))[0]
        )
        tz_name, offset = rng.choices(_TIMEZONES, _TZ_WEIGHTS)[0]
        if platform == "web":
            style = "z_ms"
        elif platform == "ios":
            style = rng.choices(("z_ms", "offset"), (60, 40))[0]
        elif platform == "android":
            style = rng.choices(("z_ms", "offset"), (50, 50))[0]
        else:
            style = rng.choices(("utc_us", "naive", "z_s"), (40, 30, 30))[0]
        if is_bot:
            identity = "anonymous"
        elif platform == "server":
            identity = "identified"
        else:
            identity = rng.choices(("identified", "anonymous", "converting"), (55, 30, 15))[0]
        segment = rng.choices(("power", "regular", "casual", "one_off"), (15, 35, 30, 20))[0]
        activity = {"power": 0.85, "regular": 0.45, "casual": 0.15, "one_off": 0.0}[segment]
        first_day = 0 if days == 1 or rng.random() < 0.4 else rng.randint(1, days - 1)
        churn_day = first_day + rng.randint(0, 4) if rng.random() < 0.2 else None
        break_days = range(0)
        if segment in ("power", "regular") and rng.random() < 0.2:
            b = first_day + rng.randint(1, 5)
            break_days = range(b, b + rng.randint(3, 9))
        return_day = None
        if segment == "one_off" and rng.random() < 0.35:
            return_day = first_day + rng.randint(8, 12)
        anonymous_id = None if platform == "server" else _uuid(rng)
        people.append(
            _User(
                index=index,
                is_bot=is_bot,
                platform=platform,
                identity=identity,
                anon_user_field=rng.choice(("absent", "null", "empty")),
                user_id=f"u_{rng.getrandbits(48):012x}",
                anonymous_id=anonymous_id,
                ts_style=style,
                offset_min=offset if style == "offset" else 0,
                first_day=first_day,
                activity=activity,
                churn_day=churn_day,
                break_days=break_days,
                return_day=return_day,
                context=_context(rng, platform, tz_name, is_bot),
                identified=identity == "identified",
            )
        )
    return people


def _context(rng: random.Random, platform: str, tz_name: str, is_bot: bool) -> dict[str, Any]:
    """A Segment-like `context` object per device, reused by all of the user's events."""
    ip = f"{rng.randint(11, 223)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
    locale = rng.choice(("en-US", "de-DE", "pt-BR", "hi-IN", "ja-JP", "en-GB", "fr-FR"))
    if platform == "web":
        agent = (
            rng.choice(_BOT_AGENTS)
            if is_bot
            else (
                "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 "
                "(KHTML, like Gecko) Version/17.2 Safari/605.1.15"
                if rng.random() < 0.4
                else "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like "
                "Gecko) Chrome/120.0.0.0 Safari/537.36"
            )
        )
        return {
            "library": {"name": "analytics.js", "version": "next-1.62.0"},
            "ip": ip,
            "locale": locale,
            "userAgent": agent,
        }
    if platform in ("ios", "android"):
        ios = platform == "ios"
        return {
            "library": {
                "name": "analytics-ios" if ios else "analytics-android",
                "version": "4.1.8" if ios else "4.11.3",
            },
            "app": {"name": "Shoply", "version": rng.choice(("3.4.0", "3.5.1", "3.6.0"))},
            "device": {
                "id": _uuid(rng),
                "manufacturer": "Apple" if ios else rng.choice(("samsung", "Google", "Xiaomi")),
                "model": rng.choice(("iPhone14,5", "iPhone15,2"))
                if ios
                else rng.choice(("SM-S911B", "Pixel 8", "2201117TG")),
                "type": platform,
            },
            "os": {
                "name": "iOS" if ios else "Android",
                "version": rng.choice(("17.2", "16.7.4")) if ios else rng.choice(("14", "13")),
            },
            "network": {"wifi": rng.random() < 0.6, "carrier": rng.choice(("T-Mobile", "Vivo"))},
            "ip": ip,
            "locale": locale,
            "timezone": tz_name,
        }
    return {"library": {"name": "analytics-python", "version": "2.3.2"}, "ip": ip}


# --------------------------------------------------------------------------- events


def _human_copies(
    user: _User, rng: random.Random, start_ms: int, end_ms: int, days: int, late_share: float
) -> list[_Copy]:
    """A few sessions on active days, separated by more than the gap, planned in local time."""
    result: list[_Copy] = []
    cursor: int | None = None
    first_session = True
    for day in range(user.first_day, days):
        if user.churn_day is not None and day > user.churn_day:
            break
        if day == user.first_day or day == user.return_day:
            active = True
        else:
            active = day not in user.break_days and rng.random() < user.activity
        if not active:
            continue
        local_midnight = start_ms + day * _DAY - user.offset_min * _MINUTE
        n_sessions = rng.choices((1, 2, 3, 4), (50, 30, 15, 5))[0]
        starts = [
            (local_midnight + _local_hour(rng) * _HOUR + rng.randrange(_HOUR), False)
            for _ in range(n_sessions)
        ]
        if rng.random() < 0.08:  # late-night UTC session that runs past midnight UTC
            starts.append(
                (start_ms + day * _DAY + 23 * _HOUR + rng.randint(45, 58) * _MINUTE, True)
            )
        for session_start, long in sorted(starts):
            if cursor is not None and session_start <= cursor + _GAP:
                session_start = cursor + _GAP + rng.randint(_SECOND, 2 * _HOUR)
            if user.ts_style == "z_s":
                session_start = -(-session_start // _SECOND) * _SECOND
            times = _session_times(user, rng, session_start, long)
            result.extend(_session_copies(user, rng, times, first_session, late_share))
            first_session = False
            cursor = times[-1]
    return [c for c in result if c.ts < end_ms]


def _local_hour(rng: random.Random) -> int:
    return rng.choices(range(24), cum_weights=_HOUR_CUM_WEIGHTS)[0]


def _session_times(user: _User, rng: random.Random, t0: int, long: bool) -> list[int]:
    """Gaps of seconds to ~20 minutes, with some exactly-30-minute gaps and identical stamps."""
    n = 1 + min(60, int(rng.expovariate(1 / 7)))
    if long:
        n = max(n, 10)
    times = [t0]
    for _ in range(n - 1):
        r = rng.random()
        if r < 0.012:
            gap = 0
        elif r < 0.03:
            gap = _GAP  # the boundary: still the same session
        else:
            gap = int(
                min(20 * _MINUTE, max(3 * _SECOND, rng.lognormvariate(math.log(45_000), 1.2)))
            )
        if user.ts_style == "z_s":
            gap = gap // _SECOND * _SECOND
        times.append(times[-1] + gap)
    return times


def _session_copies(
    user: _User, rng: random.Random, times: list[int], first_session: bool, late_share: float
) -> list[_Copy]:
    """Build the session's messages and when they reach Segment (late uploads come in bulk)."""
    result: list[_Copy] = []
    identify_now = (first_session and user.identity == "identified") or (
        user.identity == "converting"
        and not user.identified
        and not first_session
        and rng.random() < 0.4
    )
    if identify_now:
        user.identified = True
    late_session = rng.random() < late_share * 0.6
    flush = times[-1] + _lateness(rng) if late_session else 0
    for i, ts in enumerate(times):
        if i == 0 and identify_now:
            kind = "identify"
        elif i == 0:
            kind = "open"
        else:
            kind = "any"
        payload = _message(user, rng, ts, kind)
        if late_session:
            received = flush + i * rng.randint(2, 40)
        elif rng.random() < late_share * 0.4:
            received = ts + _lateness(rng)
        else:
            received = ts + rng.randint(100, 30 * _SECOND)
        result.append(
            _Copy(payload, payload["messageId"], ts, received, received, rng.randint(20, 800))
        )
    return result


def _lateness(rng: random.Random) -> int:
    """Heavy tail from 1 day: mostly a few days, some weeks or months (offline mobile SDKs)."""
    return int(min(_MAX_LATENESS_DAYS, rng.paretovariate(1.15)) * _DAY)


def _bot_copies(user: _User, rng: random.Random, start_ms: int, end_ms: int) -> list[_Copy]:
    """Crawlers and monitors: an event every 1-10 minutes for runs longer than 24 hours."""
    result: list[_Copy] = []
    t = start_ms + rng.randrange(10 * _HOUR)
    while t < end_ms:
        run_end = t + rng.randint(26 * _HOUR, 40 * _HOUR)
        while t < run_end and t < end_ms:
            payload = _message(user, rng, t, "bot")
            received = t + rng.randint(100, 3 * _SECOND)
            result.append(_Copy(payload, payload["messageId"], t, received, received, 50))
            t += rng.randint(_MINUTE, 10 * _MINUTE)
        t += rng.randint(6 * _HOUR, 3 * _DAY)
    return result


def _message(user: _User, rng: random.Random, ts: int, kind: str) -> dict[str, Any]:
    """One Segment message; sentAt/receivedAt are filled in per delivered copy."""
    mobile = user.platform in ("ios", "android")
    if kind == "identify":
        mtype, name = "identify", None
    elif kind == "bot":
        mtype, name = "page", rng.choice(_PAGES)
    elif kind == "open":
        if mobile:
            mtype, name = "track", "Application Opened"
        elif user.platform == "web":
            mtype, name = "page", "Home"
        else:
            mtype, name = "track", rng.choice(("Order Completed", "Subscription Renewed"))
    elif user.platform == "server":
        mtype, name = "track", rng.choice(("Order Completed", "Subscription Renewed", "Refunded"))
    else:
        r = rng.random()
        if r < 0.45:
            mtype, name = (
                ("screen", rng.choice(_SCREENS)) if mobile else ("page", rng.choice(_PAGES))
            )
        else:
            mtype = "track"
            name = rng.choice(
                (
                    "Product Viewed",
                    "Product Viewed",
                    "Product Added",
                    "Products Searched",
                    "Checkout Started",
                    "Order Completed",
                    "Signed In",
                )
            )
    msg: dict[str, Any] = {"messageId": _message_id(user, rng), "type": mtype}
    if mtype == "track":
        msg["event"] = name
    elif name is not None:
        msg["name"] = name
    if user.identified or user.identity == "identified":
        msg["userId"] = user.user_id
    elif user.anon_user_field == "null":
        msg["userId"] = None
    elif user.anon_user_field == "empty":
        msg["userId"] = ""
    if user.anonymous_id is not None:
        msg["anonymousId"] = user.anonymous_id
    msg["timestamp"] = _iso(ts, user.ts_style, user.offset_min)
    msg["sentAt"] = None
    msg["receivedAt"] = None
    if mtype == "identify":
        msg["traits"] = {
            "email": f"{user.user_id}@example.com",
            "plan": rng.choice(("free", "plus", "pro")),
        }
    else:
        msg["properties"] = _properties(rng, mtype, name or "")
    msg["context"] = user.context
    msg["channel"] = "server" if user.platform == "server" else "client"
    msg["version"] = 2
    return msg


def _properties(rng: random.Random, mtype: str, name: str) -> dict[str, Any]:
    if mtype == "page":
        path = "/" if name == "Home" else f"/{name.lower()}/{rng.randint(1, 500)}"
        return {
            "path": path,
            "url": f"https://shop.example.com{path}",
            "title": f"{name} | Shoply",
            "referrer": rng.choice(("", "https://www.google.com/", "https://t.co/x")),
        }
    if mtype == "screen":
        return {"name": name}
    if name in ("Product Viewed", "Product Added"):
        props: dict[str, Any] = {
            "product_id": f"sku-{rng.randint(1000, 9999)}",
            "category": rng.choice(_CATEGORIES),
            "price": round(rng.uniform(3, 250), 2),
            "currency": rng.choice(("EUR", "USD")),
        }
        if name == "Product Added":
            props["quantity"] = rng.randint(1, 3)
        return props
    if name == "Products Searched":
        return {"query": rng.choice(_QUERIES)}
    if name in ("Checkout Started", "Order Completed", "Subscription Renewed", "Refunded"):
        return {
            "order_id": f"ord-{rng.getrandbits(32):08x}",
            "total": round(rng.uniform(5, 400), 2),
            "currency": rng.choice(("EUR", "USD")),
            "products": [
                {"product_id": f"sku-{rng.randint(1000, 9999)}", "quantity": rng.randint(1, 2)}
                for _ in range(rng.randint(1, 3))
            ],
        }
    if name == "Signed In":
        return {"method": rng.choice(("password", "google", "apple"))}
    return {}


def _message_id(user: _User, rng: random.Random) -> str:
    """Id formats of the different SDKs (all unique: 122 random bits)."""
    u = _uuid(rng)
    if user.platform == "web":
        return f"ajs-next-{u.replace('-', '')}"
    if user.platform == "ios":
        return u.upper()
    return u


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


# --------------------------------------------------------------------------- retries


def _retries(
    copies: list[_Copy],
    rng: random.Random,
    end_ms: int,
    duplicate_share: float,
    pipeline_start_ms: int,
) -> list[_Copy]:
    """SDK retries: same messageId re-sent after a timeout (same batch) or replayed days later."""
    extra: list[_Copy] = []
    if duplicate_share <= 0:
        return extra
    for c in copies:
        if rng.random() < duplicate_share:
            previous = c
            for _ in range(1 if rng.random() < 0.85 else 2):
                retry = _retry_of(c, previous, rng)
                if retry.received >= end_ms:
                    break
                extra.append(retry)
                previous = retry
    if not extra:  # guarantee at least one `duplicate` rejection whenever one can exist
        eligible = [
            c for c in copies if c.ts >= pipeline_start_ms and c.received + _MINUTE < end_ms
        ]
        if eligible:
            c = rng.choice(eligible)
            retry = _Copy(
                c.payload,
                c.message_id,
                c.ts,
                c.received + rng.randint(1, 59) * _SECOND,
                c.pos - 1,
                30,
            )
            extra.append(retry)
    return extra


def _retry_of(original: _Copy, previous: _Copy, rng: random.Random) -> _Copy:
    if rng.random() < 0.6:
        received = previous.received + rng.randint(_SECOND, 15 * _MINUTE)
    else:
        day = previous.received // _DAY + rng.randint(1, 3)
        received = day * _DAY + rng.randrange(_DAY)
    # Files are not ordered by receivedAt: a same-day retry is sometimes written first.
    same_day = received // _DAY == original.received // _DAY
    pos = original.pos - 1 if same_day and rng.random() < 0.5 else received
    return _Copy(
        original.payload, original.message_id, original.ts, received, pos, rng.randint(20, 800)
    )


# --------------------------------------------------------------------------- invalid lines

_MANDATORY_VARIANTS: tuple[tuple[str, str], ...] = (
    ("malformed_json", "truncated"),
    ("malformed_json", "array"),
    ("malformed_json", "string"),
    ("malformed_json", "html"),
    ("missing_message_id", "absent"),
    ("missing_message_id", "empty"),
    ("missing_message_id", "number"),
    ("missing_user", "absent"),
    ("missing_user", "empty"),
    ("bad_timestamp", "absent"),
    ("bad_timestamp", "word"),
    ("bad_timestamp", "number"),
    ("bad_timestamp", "date_only"),
    ("bad_received_at", "absent"),
    ("bad_received_at", "word"),
    ("bad_received_at", "number"),
    ("future_timestamp", "clock_skew"),
    ("before_start", "old"),
)
_EXTRA_VARIANTS: dict[str, tuple[str, ...]] = {
    "malformed_json": ("truncated", "array", "string", "html", "null", "python_repr"),
    "missing_message_id": ("absent", "empty", "number", "null"),
    "missing_user": ("absent", "empty", "null_and_empty", "numeric_user_id"),
    "bad_timestamp": ("absent", "word", "number", "date_only", "null", "impossible"),
    "bad_received_at": ("absent", "word", "number", "null", "date_only"),
    "future_timestamp": ("clock_skew",),
    "before_start": ("old",),
}
_EXTRA_WEIGHTS = (3, 1, 1, 1.5, 1, 1.5, 1)


def _invalid_lines(
    rng: random.Random,
    people: list[_User],
    count: int,
    days: int,
    start_ms: int,
    pipeline_start_ms: int,
    taken_ids: set[str],
) -> list[tuple[int, int, str, str]]:
    """Broken lines, each failing exactly one SPEC §2 check: (batch, pos, text, reason)."""
    if count == 0:
        return []
    humans = [u for u in people if not u.is_bot] or people
    mandatory = list(_MANDATORY_VARIANTS)
    rng.shuffle(mandatory)
    reasons = tuple(_EXTRA_VARIANTS)
    variants = list(mandatory)
    for _ in range(count - len(mandatory)):
        reason = rng.choices(reasons, _EXTRA_WEIGHTS)[0]
        variants.append((reason, rng.choice(_EXTRA_VARIANTS[reason])))
    rotation = rng.randrange(days)
    result: list[tuple[int, int, str, str]] = []
    for i, (reason, variant) in enumerate(variants):
        batch = (rotation + i) % days if i < len(mandatory) else rng.randrange(days)
        received = start_ms + batch * _DAY + rng.randrange(_DAY)
        ts = received - rng.randint(100, 30 * _SECOND)
        if reason == "future_timestamp":
            ts = received + rng.randint(10 * _MINUTE, 3 * _DAY)
        elif reason == "before_start":
            ts = min(pipeline_start_ms, received) - rng.randint(_HOUR, 10 * _DAY)
        user = rng.choice(humans) if humans else None
        if user is None:  # no users at all: a bare anonymous web-like user
            user = _make_users(0, 1, 1, 0.0)[0]
        msg = _message(user, rng, ts, "any")
        if "userId" not in msg and user.anonymous_id is None:
            msg["userId"] = user.user_id
        while msg["messageId"] in taken_ids:  # never share an id with a valid line
            msg["messageId"] = _uuid(rng)
        taken_ids.add(msg["messageId"])
        msg["sentAt"] = _iso(received - rng.randint(20, 800), "z_ms", 0)
        msg["receivedAt"] = _iso(received, "z_ms", 0)
        result.append((batch, received, _corrupt(rng, msg, reason, variant), reason))
    return result


def _corrupt(rng: random.Random, msg: dict[str, Any], reason: str, variant: str) -> str:
    """Render `msg` so that the first failing SPEC §2 check is `reason`."""
    if reason == "malformed_json":
        if variant == "truncated":
            text = _dumps(msg)
            return text[: rng.randint(len(text) // 3, len(text) - 2)]
        return {
            "array": "[1,2]",
            "string": '"x"',
            "html": "<html><head><title>502 Bad Gateway</title></head></html>",
            "null": "null",
            "python_repr": repr({"messageId": msg["messageId"], "userId": "u_1"}),
        }[variant]
    if reason == "missing_message_id":
        if variant == "absent":
            del msg["messageId"]
        else:
            msg["messageId"] = {"empty": "", "number": rng.randint(10**5, 10**9), "null": None}[
                variant
            ]
    elif reason == "missing_user":
        msg.pop("userId", None)
        msg.pop("anonymousId", None)
        if variant == "empty":
            msg["userId"], msg["anonymousId"] = "", ""
        elif variant == "null_and_empty":
            msg["userId"], msg["anonymousId"] = None, ""
        elif variant == "numeric_user_id":
            msg["userId"] = rng.randint(1, 99_999)
    elif reason in ("bad_timestamp", "bad_received_at"):
        key = "timestamp" if reason == "bad_timestamp" else "receivedAt"
        if variant == "absent":
            del msg[key]
        else:
            msg[key] = {
                "word": "yesterday" if key == "timestamp" else "pending",
                "number": rng.randint(1_700_000_000_000, 1_800_000_000_000),
                "date_only": msg[key][:10],
                "null": None,
                "impossible": msg[key][:5] + "02-30" + msg[key][10:],
            }[variant]
    return _dumps(msg)


# --------------------------------------------------------------------------- outcome and files


def _expected_outcome(
    copies: list[_Copy], invalid: list[tuple[int, int, str, str]], pipeline_start_ms: int
) -> tuple[int, int, Counter[str]]:
    """SPEC §2 on the generator's own records: before_start, then duplicate winners, then late."""
    rejections: Counter[str] = Counter(reason for _b, _p, _t, reason in invalid)
    winners: dict[str, _Copy] = {}
    for c in copies:
        if c.ts < pipeline_start_ms:
            rejections["before_start"] += 1
            continue
        best = winners.get(c.message_id)
        if best is None:
            winners[c.message_id] = c
            continue
        rejections["duplicate"] += 1
        if (c.received // _DAY, c.received) < (best.received // _DAY, best.received):
            winners[c.message_id] = c
    late = sum(1 for c in winners.values() if c.received // _DAY > c.ts // _DAY)
    return len(winners), late, rejections


def _render(c: _Copy) -> dict[str, Any]:
    msg = dict(c.payload)
    msg["sentAt"] = _iso(max(c.ts, c.received - c.sent_latency), "z_ms", 0)
    msg["receivedAt"] = _iso(c.received, "z_ms", 0)
    return msg


def _write_batches(
    out: Path, batch_names: list[str], lines: list[_Line], rng: random.Random, gzip_share: float
) -> int:
    """Split each batch into 1-3 files (some gzip, some with blank lines) and write atomically."""
    by_batch: list[list[_Line]] = [[] for _ in batch_names]
    for line in lines:
        by_batch[line.batch].append(line)
    plans: list[tuple[Path, list[str], bool]] = []
    for name, batch_lines in zip(batch_names, by_batch, strict=True):
        batch_lines.sort(key=lambda x: (x.pos, x.seq))
        texts = [x.text for x in batch_lines]
        n_files = max(1, min(len(texts), rng.choices((1, 2, 3), (55, 30, 15))[0]))
        cuts = sorted(rng.sample(range(1, len(texts)), n_files - 1)) if n_files > 1 else []
        bounds = [0, *cuts, len(texts)]
        for k in range(n_files):
            chunk = texts[bounds[k] : bounds[k + 1]]
            if chunk and rng.random() < 0.25:
                chunk.insert(rng.randrange(len(chunk) + 1), "")
            if chunk and rng.random() < 0.15:
                chunk.append("")
            plans.append(
                (out / name / f"part-{k:05d}", chunk, bool(chunk) and rng.random() < gzip_share)
            )
    if gzip_share > 0 and len(plans) >= 2 and not any(g for _p, _c, g in plans):
        path, chunk, _g = plans[-1]
        plans[-1] = (path, chunk, bool(chunk))
    written: dict[Path, set[str]] = {}
    for stem, chunk, use_gzip in plans:
        data = ("\n".join(chunk) + "\n").encode() if chunk else b""
        name = stem.name + (".jsonl.gz" if use_gzip else ".jsonl")
        if use_gzip:
            data = gzip.compress(data, compresslevel=6, mtime=0)
        stem.parent.mkdir(parents=True, exist_ok=True)
        tmp = stem.parent / f".{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, stem.parent / name)
        written.setdefault(stem.parent, set()).add(name)
    for folder, names in written.items():  # a re-delivery replaces the folder's files
        for old in sorted(folder.iterdir()):
            if old.name not in names and old.name.endswith((".jsonl", ".jsonl.gz")):
                old.unlink()
    return len(plans)


def _refuse_foreign_batches(out: Path, names: set[str]) -> None:
    if not out.exists():
        return
    foreign = sorted(
        p.name for p in out.iterdir() if p.name.startswith("received_date=") and p.name not in names
    )
    if foreign:
        raise FileExistsError(
            f"{out} already holds batches outside the generated range ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}); use an empty folder"
        )


# --------------------------------------------------------------------------- formatting


def _date_ms(d: date) -> int:
    return (d - _EPOCH_DATE).days * _DAY


def _iso(ms: int, style: str, offset_min: int) -> str:
    """ISO-8601 in the formats SDKs send; all parse with datetime.fromisoformat (3.11)."""
    dt = _EPOCH + timedelta(milliseconds=ms + offset_min * _MINUTE)
    base = (
        f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}"
    )
    frac = ms % _SECOND
    if style == "z_ms":
        return f"{base}.{frac:03d}Z"
    if style == "z_s":
        return f"{base}Z"
    if style == "naive":
        return f"{base}.{frac:03d}"
    if style == "utc_us":
        return f"{base}.{frac:03d}000+00:00"
    sign = "-" if offset_min < 0 else "+"
    hours, minutes = divmod(abs(offset_min), 60)
    return f"{base}.{frac:03d}{sign}{hours:02d}:{minutes:02d}"


def _dumps(msg: Any) -> str:
    return json.dumps(msg, ensure_ascii=False, separators=(",", ":"))
