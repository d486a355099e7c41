"""Independent full-recompute references of the SPEC, in plain Python, for the tests.

Nothing here imports the pipeline: it reads the landing files and applies SPEC §2-§3 as
written, so the pipeline's incremental results can be compared with it.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

FUTURE_TOLERANCE = timedelta(minutes=5)


@dataclass(frozen=True)
class Accepted:
    message_id: str
    user_key: str
    ts: datetime
    received: datetime
    received_date: date
    raw_timestamp: str


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


def non_empty_str(value: Any) -> bool:
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
    return None, Accepted(obj["messageId"], key, ts, received, received_date, obj["timestamp"])


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


def reference_sessions(
    winners: dict[str, Accepted], *, gap: timedelta, max_length: timedelta
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
                )
            )
    return out
