"""SPEC §2: turn landing lines into parsed events or rejections with a reason.

Two checks come before SPEC §2's and are made on the line's bytes, in Spark: a line that is
not valid UTF-8 (`invalid_encoding`, its bytes kept in `raw_bytes`) and a line longer than
`max_line_bytes` (`line_too_long`). Neither reaches Python, so one bad line cannot fail its
batch's Arrow conversion and a huge one never crosses to a Python worker.

The JSON rules live in plain Python (`parse_line`) so they are exact and unit-testable;
Spark applies them in batches through an Arrow UDF, so lines never gather on the driver.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from operator import attrgetter
from typing import Any

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from sessionize_assets.transforms.attributes import (
    CAMPAIGN_TYPE,
    DEVICE_FIELDS,
    PAGE_FIELDS,
    UTM_FIELDS,
    EventAttributes,
    event_attributes,
)
from sessionize_assets.transforms.erased import ErasedKeys

INVALID_ENCODING = "invalid_encoding"
LINE_TOO_LONG = "line_too_long"
MALFORMED_JSON = "malformed_json"
MISSING_MESSAGE_ID = "missing_message_id"
MISSING_USER = "missing_user"
BAD_TIMESTAMP = "bad_timestamp"
BAD_RECEIVED_AT = "bad_received_at"
FUTURE_TIMESTAMP = "future_timestamp"
BEFORE_START = "before_start"
DUPLICATE = "duplicate"
ERASED = "erased"

# The detail of an `erased` rejection (SPEC §8), which keeps nothing of its line.
ERASED_DETAIL = "a line of a key erased on request (SPEC §8)"

# Who put a row in rejected_events: validation at ingestion, or cross-batch dedup in events.
INGEST = "ingest"
DEDUP = "events"

REASONS = (
    INVALID_ENCODING,
    LINE_TOO_LONG,
    MALFORMED_JSON,
    MISSING_MESSAGE_ID,
    MISSING_USER,
    BAD_TIMESTAMP,
    BAD_RECEIVED_AT,
    FUTURE_TIMESTAMP,
    BEFORE_START,
    DUPLICATE,
    ERASED,
)

_KNOWN_FIELDS = frozenset(
    {"messageId", "userId", "anonymousId", "timestamp", "receivedAt", "type", "event"}
    | {"properties", "context"}
)
_HAS_TIME = re.compile(r"\d[Tt ]\d")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, kw_only=True)
class ParsedLine:
    """One line's outcome: `reason` is None for a valid event."""

    reason: str | None
    detail: str | None = None
    message_id: str | None = None
    user_id: str | None = None
    segment_user_id: str | None = None
    anonymous_id: str | None = None
    event_ts: datetime | None = None
    received_at: datetime | None = None
    event_type: str | None = None
    event_name: str | None = None
    properties: str | None = None
    context: str | None = None
    extra: str | None = None
    attributes: EventAttributes | None = None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _non_empty_string(value: Any) -> str | None:
    return value if isinstance(value, str) and value != "" else None


def parse_iso_timestamp(value: Any) -> datetime | None:
    """An ISO-8601 date-time as aware UTC; no offset means UTC. None if not one."""
    if not isinstance(value, str) or not _HAS_TIME.search(value):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        return None


# Built once: json.loads and json.dumps with options build a new decoder or encoder per call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _json_text(value: Any) -> str | None:
    if value is None:
        return None
    return _ENCODER.encode(value)


def parse_line(line: str, *, start_date: date, future_tolerance: timedelta) -> ParsedLine:
    """Apply SPEC §2's checks in order; the first failure wins. Duplicates are decided later."""
    try:
        # json.loads's own message for a byte order mark; otherwise the shared decoder.
        message = json.loads(line) if line.startswith("\ufeff") else _DECODER.decode(line)
    except (ValueError, RecursionError) as exc:
        return ParsedLine(reason=MALFORMED_JSON, detail=f"not JSON: {exc}")
    if not isinstance(message, dict):
        return ParsedLine(
            reason=MALFORMED_JSON, detail=f"JSON {type(message).__name__}, not an object"
        )

    message_id = _non_empty_string(message.get("messageId"))
    if message_id is None:
        return ParsedLine(
            reason=MISSING_MESSAGE_ID,
            detail=f"messageId is {_describe(message, 'messageId')}",
        )

    segment_user_id = _non_empty_string(message.get("userId"))
    anonymous_id = _non_empty_string(message.get("anonymousId"))
    user_id = segment_user_id or anonymous_id
    if user_id is None:
        return ParsedLine(
            reason=MISSING_USER,
            message_id=message_id,
            detail=(
                f"userId is {_describe(message, 'userId')} and "
                f"anonymousId is {_describe(message, 'anonymousId')}"
            ),
        )

    event_ts = parse_iso_timestamp(message.get("timestamp"))
    if event_ts is None:
        return ParsedLine(
            reason=BAD_TIMESTAMP,
            message_id=message_id,
            detail=f"timestamp is {_describe(message, 'timestamp')}, not an ISO-8601 date-time",
        )
    received_at = parse_iso_timestamp(message.get("receivedAt"))
    if received_at is None:
        return ParsedLine(
            reason=BAD_RECEIVED_AT,
            message_id=message_id,
            detail=f"receivedAt is {_describe(message, 'receivedAt')}, not an ISO-8601 date-time",
        )
    if event_ts > received_at + future_tolerance:
        return ParsedLine(
            reason=FUTURE_TIMESTAMP,
            message_id=message_id,
            detail=f"timestamp is {event_ts - received_at} after receivedAt",
        )
    if event_ts.date() < start_date:
        return ParsedLine(
            reason=BEFORE_START,
            message_id=message_id,
            detail=f"event date {event_ts.date()} is before the start date {start_date}",
        )

    event_name = message.get("event")
    extra = {k: v for k, v in message.items() if k not in _KNOWN_FIELDS}
    return ParsedLine(
        reason=None,
        message_id=message_id,
        user_id=user_id,
        segment_user_id=segment_user_id,
        anonymous_id=anonymous_id,
        event_ts=event_ts,
        received_at=received_at,
        event_type=_text(message.get("type")),
        event_name=_text(event_name),
        properties=_json_text(message.get("properties")),
        context=_json_text(message.get("context")),
        extra=_json_text(extra) if extra else None,
        attributes=event_attributes(message.get("properties"), message.get("context")),
    )


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return _json_text(value)


def _describe(message: dict[str, Any], key: str) -> str:
    if key not in message:
        return "missing"
    value = message[key]
    shown = json.dumps(value, ensure_ascii=False)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return shown


# -- Spark -------------------------------------------------------------------------------------

_PARSED_SCHEMA = StructType(
    [
        StructField("reason", StringType()),
        StructField("detail", StringType()),
        StructField("message_id", StringType()),
        StructField("user_id", StringType()),
        StructField("segment_user_id", StringType()),
        StructField("anonymous_id", StringType()),
        StructField("event_us", LongType()),
        StructField("received_us", LongType()),
        StructField("event_type", StringType()),
        StructField("event_name", StringType()),
        StructField("properties", StringType()),
        StructField("context", StringType()),
        StructField("extra", StringType()),
    ]
)
# The session attributes' values of an accepted line (`EventAttributes`), flattened: the
# campaigns become structs in Spark (`parse_lines`).
CAMPAIGN_SET = "campaign_set"
_ATTRIBUTE_SCHEMA = StructType(
    [
        *(StructField(name, StringType()) for name in PAGE_FIELDS),
        StructField(CAMPAIGN_SET, BooleanType()),
        *(StructField(f"campaign_{name}", StringType()) for name in UTM_FIELDS),
        *(StructField(f"url_{name}", StringType()) for name in UTM_FIELDS),
        *(StructField(name, StringType()) for name in DEVICE_FIELDS),
    ]
)
_NO_ATTRIBUTES = (None,) * len(_ATTRIBUTE_SCHEMA.fields)


def _attribute_values(attributes: EventAttributes | None) -> tuple[Any, ...]:
    """`attributes` in `_ATTRIBUTE_SCHEMA`'s order."""
    if attributes is None:
        return _NO_ATTRIBUTES
    a = attributes
    return (
        *(getattr(a, name) for name in PAGE_FIELDS),
        a.campaign is not None,
        *(a.campaign or (None,) * len(UTM_FIELDS)),
        *a.url_campaign,
        *(getattr(a, name) for name in DEVICE_FIELDS),
    )


def _micros(value: datetime | None) -> int | None:
    if value is None:
        return None
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


# A parsed line's values (`parsed_values`), in this order: the texts, the times as
# microseconds, the attributes (`_ATTRIBUTE_SCHEMA`).
_TEXT_NAMES = [field.name for field in _PARSED_SCHEMA if not field.name.endswith("_us")]
PARSED_VALUE_NAMES = (*_TEXT_NAMES, "event_us", "received_us", *_ATTRIBUTE_SCHEMA.fieldNames())
_texts = attrgetter(*_TEXT_NAMES)
_UNPARSED = (None,) * len(PARSED_VALUE_NAMES)
# The detail of a `line_too_long` rejection: the line's bytes, and the limit.
TOO_LONG_DETAIL = "%d bytes, over the limit of %d bytes"


def parsed_values(
    line: str | None, *, start_date: date, future_tolerance: timedelta
) -> tuple[Any, ...]:
    """`parse_line`'s outcome as flat values (PARSED_VALUE_NAMES), what `parse_lines` builds
    its columns from in Spark and `transforms/parsed_rows.py` on the driver; all None for a
    line rejected on its bytes (None)."""
    if line is None:
        return _UNPARSED
    parsed = parse_line(line, start_date=start_date, future_tolerance=future_tolerance)
    times = (_micros(parsed.event_ts), _micros(parsed.received_at))
    return _texts(parsed) + times + _attribute_values(parsed.attributes)


def parse_lines(
    lines: DataFrame, *, start_date: date, future_tolerance: timedelta, max_line_bytes: int
) -> DataFrame:
    """Parse and validate a `raw_line` column; adds `reason` (null when valid) and the fields.

    `raw_line` may hold any bytes (Spark's text source does not decode). A line that is not
    valid UTF-8 keeps them in `raw_bytes` and shows them in `raw_line` with U+FFFD for each
    invalid sequence; every other line has `raw_bytes` null. Keeps the input's other columns
    (`received_date`, `source_file`, ...). `transforms/parsed_rows.py` does the same on the
    driver.
    """
    schema = StructType([*_PARSED_SCHEMA.fields, *_ATTRIBUTE_SCHEMA.fields])
    names = [field.name for field in schema]

    def parse_batches(batches: Iterator[pd.Series]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            rows = [
                parsed_values(line, start_date=start_date, future_tolerance=future_tolerance)
                for line in batch
            ]
            frame = pd.DataFrame.from_records(rows, columns=PARSED_VALUE_NAMES, nrows=len(rows))[
                names
            ]
            for column in ("event_us", "received_us"):
                frame[column] = frame[column].astype("Int64")
            yield frame

    line = F.col("raw_line")
    size = F.octet_length(line)
    valid_utf8 = F.is_valid_utf8(line)
    byte_reason = F.when(~valid_utf8, F.lit(INVALID_ENCODING)).when(
        size > max_line_bytes, F.lit(LINE_TOO_LONG)
    )
    byte_detail = F.when(
        ~valid_utf8,
        F.format_string("%d bytes, not valid UTF-8: the exact bytes are in raw_bytes", size),
    ).when(
        size > max_line_bytes,
        F.format_string(TOO_LONG_DETAIL, size, F.lit(max_line_bytes)),
    )
    # pandas ships no types (an Iterator[Any] function): no overload of pyspark's stub matches.
    parse = F.pandas_udf(parse_batches, returnType=schema)  # type: ignore[call-overload]
    checked = lines.select(
        "*", byte_reason.alias("_byte_reason"), byte_detail.alias("_byte_detail")
    )
    parsed = checked.withColumn(
        "_parsed", parse(F.when(F.col("_byte_reason").isNull(), F.col("raw_line")))
    )
    others = [c for c in lines.columns if c != "raw_line"]
    fields = [
        F.col(f"_parsed.{name}").alias(name)
        for name in (*_TEXT_NAMES, *PAGE_FIELDS, *DEVICE_FIELDS)
        if name not in ("reason", "detail")
    ]

    def campaign(prefix: str) -> Column:
        return F.struct(
            *(F.col(f"_parsed.{prefix}{name}").alias(name) for name in UTM_FIELDS)
        ).cast(CAMPAIGN_TYPE)

    return parsed.select(
        F.when(valid_utf8, line).otherwise(F.make_valid_utf8(line)).alias("raw_line"),
        F.when(~valid_utf8, line.cast("binary")).alias("raw_bytes"),
        *others,
        F.coalesce("_byte_reason", "_parsed.reason").alias("reason"),
        F.coalesce("_byte_detail", "_parsed.detail").alias("detail"),
        *fields,
        F.timestamp_micros(F.col("_parsed.event_us")).alias("event_ts"),
        F.timestamp_micros(F.col("_parsed.received_us")).alias("received_at"),
        F.when(F.col(f"_parsed.{CAMPAIGN_SET}"), campaign("campaign_")).alias("campaign"),
        F.when(F.col("_parsed.event_us").isNotNull(), campaign("url_")).alias("url_campaign"),
    ).withColumn("event_date", F.to_date("event_ts"))


def mark_erased(parsed: DataFrame, erased: ErasedKeys | None) -> DataFrame:
    """SPEC §8: a line of an erased key becomes an `erased` rejection that keeps nothing of the
    line (no raw line, bytes or messageId; its batch and file stay). A valid line is erased
    when its userId or anonymousId is; any other when its text holds an erased key as a JSON
    string. Before the duplicate rule: an erased copy is no copy of its messageId."""
    if erased is None or not erased.hashes:
        return parsed
    hit = F.when(
        F.col("reason").isNull(), erased.any_is_erased(["segment_user_id", "anonymous_id"])
    ).otherwise(erased.text_holds_erased("raw_line"))
    flagged = parsed.withColumn("_erased", hit)

    def unless_erased(value: Column, name: str) -> Column:
        return F.when(F.col("_erased"), value).otherwise(F.col(name))

    return flagged.withColumns(
        {
            "reason": unless_erased(F.lit(ERASED), "reason"),
            "detail": unless_erased(F.lit(ERASED_DETAIL), "detail"),
            "raw_line": unless_erased(F.lit(""), "raw_line"),
            "raw_bytes": unless_erased(F.lit(None).cast("binary"), "raw_bytes"),
            "message_id": unless_erased(F.lit(None).cast("string"), "message_id"),
        }
    ).drop("_erased")


def without_erased(parsed: DataFrame) -> DataFrame:
    """The lines `mark_erased` did not mark: an erasure removes its keys' lines without a
    trace (SPEC §8: the lake equals the full recompute of the zone without them)."""
    return parsed.where(F.col("reason").isNull() | (F.col("reason") != ERASED))
