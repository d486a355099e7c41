"""`parse_lines` and `mark_erased` on the driver, for a small batch the driver reads.

A daily batch is a few megabytes of text. Parsing it in Spark costs a job whose Python
workers, shuffle and Arrow hand-over take longer than the parsing itself, and a session to
start when the run has none. When every file of the batch is UTF-8 text with no carriage
return (`resources/landing.py`'s `read_plain_lines`), the driver reads its lines and parses
them here with the same rules: each line by `parse_line` through `parsed_values`, as Spark's
UDF does; around it, the columns `parse_lines` builds, the erased keys' marks (`mark_erased`)
and the id index's hash (`pipeline/event_ids.id_hash`). Any other batch (a line that is not
UTF-8 is kept undecoded, as Spark's text source holds it) is read and parsed by Spark. The
tests compare both on arbitrary lines.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pyarrow as pa

from sessionize_assets.transforms.attributes import DEVICE_FIELDS, PAGE_FIELDS, UTM_FIELDS
from sessionize_assets.transforms.erased import ErasedKeys
from sessionize_assets.transforms.id_hash import SPARK_SEED, xxhash64
from sessionize_assets.transforms.validation import (
    CAMPAIGN_SET,
    ERASED,
    ERASED_DETAIL,
    LINE_TOO_LONG,
    PARSED_VALUE_NAMES,
    TOO_LONG_DETAIL,
    parsed_values,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_CAMPAIGN = pa.struct([(name, pa.string()) for name in UTM_FIELDS])
# The parsed texts `parse_lines` keeps, in its order (after `reason` and `detail`).
_FIELDS = (
    "message_id",
    "user_id",
    "segment_user_id",
    "anonymous_id",
    "event_type",
    "event_name",
    "properties",
    "context",
    "extra",
    *PAGE_FIELDS,
    *DEVICE_FIELDS,
)
# What Spark's Arrow hand-over of `parse_lines`' rows with their `id_hash` gives.
PARSED_ROWS_SCHEMA = pa.schema(
    [
        ("raw_line", pa.string()),
        ("raw_bytes", pa.binary()),
        ("received_date", pa.date32()),
        pa.field("source_file", pa.string(), nullable=False),
        ("reason", pa.string()),
        ("detail", pa.string()),
        *((name, pa.string()) for name in _FIELDS),
        ("event_ts", _TIMESTAMP),
        ("received_at", _TIMESTAMP),
        ("campaign", _CAMPAIGN),
        ("url_campaign", _CAMPAIGN),
        ("event_date", pa.date32()),
        pa.field("id_hash", pa.int64(), nullable=False),
    ]
)


def parsed_rows(
    lines: pa.Table,
    *,
    start_date: date,
    future_tolerance: timedelta,
    max_line_bytes: int,
    erased: ErasedKeys | None,
) -> pa.Table:
    """The rows of `mark_erased(parse_lines(lines), erased)` with their `id_hash`, as Spark
    hands them over (PARSED_ROWS_SCHEMA), for lines of valid UTF-8 (`raw_line`,
    `received_date`, `source_file`)."""
    texts: list[str] = lines.column("raw_line").to_pylist()
    too_long: dict[int, str] = {}
    for at, text in enumerate(texts):
        size = len(text.encode())
        if size > max_line_bytes:  # rejected on its bytes: never parsed
            too_long[at] = TOO_LONG_DETAIL % (size, max_line_bytes)
    rows = [
        parsed_values(
            None if at in too_long else text,
            start_date=start_date,
            future_tolerance=future_tolerance,
        )
        for at, text in enumerate(texts)
    ]
    value = {name: [row[i] for row in rows] for i, name in enumerate(PARSED_VALUE_NAMES)}
    reason = [LINE_TOO_LONG if at in too_long else r for at, r in enumerate(value["reason"])]
    detail = [too_long.get(at, d) for at, d in enumerate(value["detail"])]
    raw_line, message_id = list(texts), value["message_id"]
    if erased is not None and erased.hashes:
        for at, text in enumerate(texts):
            if reason[at] is None:
                hit = erased.holds(value["segment_user_id"][at]) or erased.holds(
                    value["anonymous_id"][at]
                )
            else:
                hit = erased.text_holds(text)
            if hit:  # nothing of the line is kept
                reason[at], detail[at] = ERASED, ERASED_DETAIL
                raw_line[at], message_id[at] = "", None
    event_ts = [_timestamp(us) for us in value["event_us"]]
    columns = {
        "raw_line": raw_line,
        "raw_bytes": [None] * len(texts),
        "received_date": lines.column("received_date"),
        "source_file": lines.column("source_file"),
        "reason": reason,
        "detail": detail,
        **{name: value[name] for name in _FIELDS},  # `message_id` as marked above
        "event_ts": event_ts,
        "received_at": [_timestamp(us) for us in value["received_us"]],
        "campaign": [
            _campaign(value, "campaign_", at) if value[CAMPAIGN_SET][at] else None
            for at in range(len(texts))
        ],
        "url_campaign": [
            _campaign(value, "url_", at) if us is not None else None
            for at, us in enumerate(value["event_us"])
        ],
        "event_date": [None if ts is None else ts.date() for ts in event_ts],
        # Spark's hash of a null is its seed.
        "id_hash": [SPARK_SEED if mid is None else xxhash64(mid) for mid in message_id],
    }
    return pa.table(
        [
            values.cast(field.type)
            if isinstance(values, pa.ChunkedArray)
            else pa.array(values, field.type)
            for field in PARSED_ROWS_SCHEMA
            for values in (columns[field.name],)
        ],
        schema=PARSED_ROWS_SCHEMA,
    )


def _timestamp(micros: int | None) -> datetime | None:
    return None if micros is None else _EPOCH + timedelta(microseconds=micros)


def _campaign(value: dict[str, list], prefix: str, at: int) -> dict[str, str | None]:
    return {name: value[f"{prefix}{name}"][at] for name in UTM_FIELDS}
