"""Time, JSON and message-id formatting shared by the generator's parts.

Rendering is the generator's hot path (tens of millions of lines for the scale benchmark), so
these helpers avoid `datetime` objects and re-creating JSON encoders per line.
"""

from __future__ import annotations

import json
from datetime import date, timedelta
from functools import cache
from typing import Any

SECOND = 1_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR
GAP = 30 * MINUTE  # SPEC §3 default inactivity gap: used to place sessions and boundary gaps

_EPOCH_DATE = date(1970, 1, 1)
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))

# Message-id streams: every id is built from a distinct (stream, day, index) key, see message_id.
EVENTS_STREAM = 0  # the users' own messages: index = user << 20 | n-th message of the user-day
LATE_STREAM = 1  # uniform-shape late uploads, made when their batch is completed
INVALID_STREAM = 2  # broken lines
_MASK62 = (1 << 62) - 1
MAX_USERS = 1 << 24
MAX_DAYS = 1 << 16
MAX_PER_USER_DAY = 1 << 20


def date_ms(d: date) -> int:
    return (d - _EPOCH_DATE).days * DAY


# "HH:MM:SS" of every second of a day (5 MB): formatting times is the hottest path.
_CLOCK = [f"{h:02d}:{m:02d}:{s:02d}" for h in range(24) for m in range(60) for s in range(60)]


@cache
def _day_text(day: int) -> str:
    return (_EPOCH_DATE + timedelta(days=day)).isoformat()


def iso(ms: int, style: str, offset_min: int) -> str:
    """ISO-8601 in the formats SDKs send; all parse with datetime.fromisoformat (3.11)."""
    day, rest = divmod(ms + offset_min * MINUTE, DAY)
    second, frac = divmod(rest, SECOND)
    base = f"{_day_text(day)}T{_CLOCK[second]}"
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


def dumps(obj: Any) -> str:
    return _ENCODER.encode(obj)


def message_key(stream: int, day: int, index: int) -> int:
    """A 62-bit key unique per message of a zone: stream (2 bits), day (16), index (44)."""
    if not (0 <= day < MAX_DAYS and 0 <= index < 1 << 44):
        raise ValueError(f"message key out of range: day {day}, index {index}")
    return stream << 60 | day << 44 | index


def message_id(platform: str, random_bits: int, key: int, salt: int) -> str:
    """A UUID v4 in the sending SDK's format whose low 62 bits are a bijection of `key`.

    Why not 122 random bits: ids must never collide, across days, users, retries and later
    `append_day` runs, and a bijection of a unique key guarantees it instead of making it merely
    unlikely. The mixing (odd multipliers and xorshifts modulo 2**62, each invertible) keeps the
    ids looking random; `salt` (from the seed) gives other seeds other ids, and `random_bits`
    fill the high half.
    """
    x = (key + salt) & _MASK62
    x = (x * 0x9E3779B97F4A7C15) & _MASK62
    x ^= x >> 31
    x = (x * 0xBF58476D1CE4E5B9) & _MASK62
    x ^= x >> 29
    high = (random_bits & ~0xF000) | 0x4000  # version 4
    text = f"{high:016x}{2 << 62 | x:016x}"  # variant bits 10
    if platform == "web":
        return f"ajs-next-{text}"
    dashed = f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
    return dashed.upper() if platform == "ios" else dashed
