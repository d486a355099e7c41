"""Broken lines, each failing exactly one SPEC §2 check (or the encoding check before them), so
every rejection reason is exercised.

Why these variants: they are the type traps real pipelines fall into (a numeric messageId, a
numeric userId, a date without a time, February 30th, JSON that is valid but not an object).
"""

from __future__ import annotations

import json
import random
from typing import Any

from sessionize_assets.generator.content import delivery_line, message_payload
from sessionize_assets.generator.formats import DAY, HOUR, MINUTE, SECOND, dumps, message_id
from sessionize_assets.generator.population import User

MANDATORY_VARIANTS: tuple[tuple[str, str], ...] = (
    ("invalid_encoding", "latin1"),
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


def invalid_variants(rng: random.Random, count: int, with_mandatory: bool) -> list[tuple[str, str]]:
    """(reason, variant) of a batch's broken lines: every mandatory one if asked, then random."""
    variants = list(MANDATORY_VARIANTS) if with_mandatory else []
    rng.shuffle(variants)
    reasons = tuple(_EXTRA_VARIANTS)
    for _ in range(count - len(variants)):
        reason = rng.choices(reasons, _EXTRA_WEIGHTS)[0]
        variants.append((reason, rng.choice(_EXTRA_VARIANTS[reason])))
    return variants


def invalid_line(
    rng: random.Random,
    user: User,
    reason: str,
    variant: str,
    day_ms: int,
    pipeline_start_ms: int,
    key: int,
    salt: int,
) -> tuple[int, str]:
    """A broken line received on the day starting at `day_ms`: (receivedAt, text)."""
    received = day_ms + rng.randrange(DAY)
    ts = received - rng.randint(100, 30 * SECOND)
    if reason == "future_timestamp":
        ts = received + rng.randint(10 * MINUTE, 3 * DAY)
    elif reason == "before_start":
        ts = min(pipeline_start_ms, received) - rng.randint(HOUR, 10 * DAY)
    mid = message_id(user.platform, rng.getrandbits(64), key, salt)
    message = message_payload(user, rng, ts, "any", user.identity == "identified", mid)
    line = delivery_line(message, ts, received, rng.randint(20, 800))
    return received, _corrupt(rng, json.loads(line), reason, variant)


def _corrupt(rng: random.Random, msg: dict[str, Any], reason: str, variant: str) -> str:
    """Render `msg` so that the first failing SPEC §2 check is `reason`."""
    if reason == "invalid_encoding":
        # A collector that wrote Latin-1: "é" as the single byte 0xE9. The writer encodes
        # lines with surrogateescape, so the lone surrogate U+DCE9 becomes that byte.
        msg["event"] = "Caf\udce9 visited"
        return dumps(msg)
    if reason == "malformed_json":
        if variant == "truncated":
            text = dumps(msg)
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
    return dumps(msg)
