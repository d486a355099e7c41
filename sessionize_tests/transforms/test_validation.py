"""SPEC §2 rules, one by one, and their order (first failure wins)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

import pytest

from sessionize_assets.transforms.attributes import EVENT_ATTRIBUTE_COLUMNS, UTM_FIELDS
from sessionize_assets.transforms.copies import rank_copies, split_batch
from sessionize_assets.transforms.validation import (
    BAD_RECEIVED_AT,
    BAD_TIMESTAMP,
    BEFORE_START,
    FUTURE_TIMESTAMP,
    INVALID_ENCODING,
    LINE_TOO_LONG,
    MALFORMED_JSON,
    MISSING_MESSAGE_ID,
    MISSING_USER,
    REASONS,
    parse_iso_timestamp,
    parse_line,
    parse_lines,
)

START = date(2026, 1, 1)
TOLERANCE = timedelta(minutes=5)
GOOD = {
    "messageId": "m1",
    "userId": "u1",
    "anonymousId": "a1",
    "timestamp": "2026-01-05T10:00:00.000Z",
    "receivedAt": "2026-01-05T10:00:02.000Z",
    "type": "track",
    "event": "Clicked",
    "properties": {"x": 1},
    "context": {"ip": "127.0.0.1"},
    "sentAt": "2026-01-05T10:00:01.000Z",
}


def check(message: object, **changes: object) -> str | None:
    if isinstance(message, dict):
        message = {**message, **changes}
        message = {k: v for k, v in message.items() if v is not _DROP}
    line = message if isinstance(message, str) else json.dumps(message)
    return parse_line(line, start_date=START, future_tolerance=TOLERANCE).reason


_DROP = object()


def test_a_good_line_keeps_every_field():
    parsed = parse_line(json.dumps(GOOD), start_date=START, future_tolerance=TOLERANCE)
    assert parsed.reason is None
    assert parsed.message_id == "m1" and parsed.user_id == "u1"
    assert parsed.event_ts == datetime(2026, 1, 5, 10, tzinfo=UTC)
    assert parsed.received_at == datetime(2026, 1, 5, 10, 0, 2, tzinfo=UTC)
    assert parsed.event_type == "track" and parsed.event_name == "Clicked"
    assert json.loads(parsed.properties) == {"x": 1}
    assert json.loads(parsed.context) == {"ip": "127.0.0.1"}
    assert json.loads(parsed.extra) == {"sentAt": "2026-01-05T10:00:01.000Z"}


@pytest.mark.parametrize("line", ["not json", "{", "[1, 2]", '"text"', "42", "null", '{"a": NaN}'])
def test_malformed_json(line):
    assert check(line) == MALFORMED_JSON


@pytest.mark.parametrize("value", [_DROP, None, "", 123, ["m"]])
def test_missing_message_id(value):
    assert check(GOOD, messageId=value) == MISSING_MESSAGE_ID


@pytest.mark.parametrize(
    ("user_id", "anonymous_id", "expected"),
    [
        (_DROP, _DROP, MISSING_USER),
        ("", "", MISSING_USER),
        (None, None, MISSING_USER),
        (42, _DROP, MISSING_USER),  # a number is not a string
        ("", "anon", None),
        (_DROP, "anon", None),
    ],
)
def test_user_key(user_id, anonymous_id, expected):
    assert check(GOOD, userId=user_id, anonymousId=anonymous_id) == expected


def test_user_key_prefers_user_id_then_anonymous_id():
    line = json.dumps({**GOOD, "userId": ""})
    assert parse_line(line, start_date=START, future_tolerance=TOLERANCE).user_id == "a1"
    line = json.dumps(GOOD)
    assert parse_line(line, start_date=START, future_tolerance=TOLERANCE).user_id == "u1"


@pytest.mark.parametrize(
    "value", [_DROP, None, "", "yesterday", 1767607200, "2026-01-05", "2026-02-30T10:00:00Z"]
)
def test_bad_timestamp(value):
    assert check(GOOD, timestamp=value) == BAD_TIMESTAMP


@pytest.mark.parametrize("value", [_DROP, None, "soon", 5, "2026-01-05"])
def test_bad_received_at(value):
    assert check(GOOD, receivedAt=value) == BAD_RECEIVED_AT


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-05T10:00:00Z", datetime(2026, 1, 5, 10, tzinfo=UTC)),
        ("2026-01-05T12:00:00+02:00", datetime(2026, 1, 5, 10, tzinfo=UTC)),
        ("2026-01-05T04:30:00.5-05:30", datetime(2026, 1, 5, 10, 0, 0, 500_000, tzinfo=UTC)),
        ("2026-01-05T10:00:00", datetime(2026, 1, 5, 10, tzinfo=UTC)),  # no offset: UTC
        ("2026-01-05 10:00:00.123456+00:00", datetime(2026, 1, 5, 10, 0, 0, 123456, tzinfo=UTC)),
    ],
)
def test_iso_timestamps_in_any_offset_become_utc(text, expected):
    assert parse_iso_timestamp(text) == expected


def test_future_timestamp_allows_exactly_the_tolerance():
    assert check(GOOD, timestamp="2026-01-05T10:05:02.000Z") is None
    assert check(GOOD, timestamp="2026-01-05T10:05:02.001Z") == FUTURE_TIMESTAMP


def test_before_start_uses_the_utc_date():
    assert check(GOOD, timestamp="2025-12-31T23:59:59Z") == BEFORE_START
    # 23:30 on Dec 31 at -01:00 is 00:30 UTC on Jan 1: on or after the start date.
    assert check(GOOD, timestamp="2025-12-31T23:30:00-01:00") is None


def test_first_failure_wins():
    everything_wrong = {"userId": "", "timestamp": "bad", "receivedAt": "bad"}
    assert check(everything_wrong) == MISSING_MESSAGE_ID
    assert check(GOOD, userId="", anonymousId="", timestamp="bad") == MISSING_USER
    assert check(GOOD, timestamp="bad", receivedAt="bad") == BAD_TIMESTAMP
    assert check(GOOD, timestamp="2025-01-01T00:00:00Z", receivedAt="bad") == BAD_RECEIVED_AT
    # Both in the future and before the start: future is checked first.
    assert (
        check(GOOD, timestamp="2025-12-31T12:00:00Z", receivedAt="2025-12-30T00:00:00Z")
        == FUTURE_TIMESTAMP
    )


def test_rejections_explain_themselves():
    parsed = parse_line(
        json.dumps({**GOOD, "timestamp": "yesterday"}), start_date=START, future_tolerance=TOLERANCE
    )
    assert parsed.detail is not None and "yesterday" in parsed.detail
    assert parsed.message_id == "m1"


def _parse_bytes(spark, lines: list[bytes], *, max_line_bytes: int):
    """Lines given as bytes, as Spark's text source holds them (undecoded)."""
    df = spark.createDataFrame(
        [(line, date(2026, 1, 5), "received_date=2026-01-05/a.jsonl") for line in lines],
        "raw binary, received_date date, source_file string",
    ).selectExpr("cast(raw as string) as raw_line", "received_date", "source_file")
    parsed = parse_lines(
        df, start_date=START, future_tolerance=TOLERANCE, max_line_bytes=max_line_bytes
    )
    return split_batch(rank_copies(parsed))


def test_a_line_that_is_not_utf8_is_rejected_with_its_exact_bytes(spark):
    good = json.dumps(GOOD).encode()
    latin1 = json.dumps({**GOOD, "messageId": "m2", "event": "Café"}, ensure_ascii=False).encode(
        "latin-1"
    )
    accepted, rejected = _parse_bytes(spark, [good, latin1], max_line_bytes=10_000)

    assert [r.message_id for r in accepted.collect()] == ["m1"]
    (row,) = rejected.collect()
    assert row.reason == INVALID_ENCODING
    assert row.raw_bytes == bytearray(latin1)  # exactly what was received
    assert row.raw_line == latin1.decode("utf-8", errors="replace")  # readable, with U+FFFD
    assert row.message_id is None and f"{len(latin1)} bytes" in row.detail


def test_a_line_over_the_limit_is_rejected_whole(spark):
    line = json.dumps({**GOOD, "properties": {"blob": "x" * 500}})
    accepted, rejected = _parse_bytes(
        spark, [line.encode(), json.dumps(GOOD).encode()], max_line_bytes=len(line) - 1
    )
    assert [r.message_id for r in accepted.collect()] == ["m1"]
    (row,) = rejected.collect()
    assert (row.reason, row.raw_line, row.raw_bytes) == (LINE_TOO_LONG, line, None)
    assert row.detail == f"{len(line)} bytes, over the limit of {len(line) - 1} bytes"


def test_the_encoding_check_comes_first(spark):
    latin1 = json.dumps({**GOOD, "event": "é" * 300}, ensure_ascii=False).encode("latin-1")
    _, rejected = _parse_bytes(spark, [latin1, b"\xff{"], max_line_bytes=100)
    assert [r.reason for r in rejected.collect()] == [INVALID_ENCODING] * 2
    assert REASONS[:2] == (INVALID_ENCODING, LINE_TOO_LONG)  # the order they are reported in


def test_spark_parse_carries_each_events_attribute_values(spark):
    """The session attributes' values of each accepted line (transforms/attributes.py), with
    the campaigns as structs: `campaign` null unless context.campaign is a non-empty object."""
    page = {
        **GOOD,
        "messageId": "page",
        "type": "page",
        "properties": {"url": "https://www.Shop.example/p?utm_source=a+b&utm_medium=CPC"},
        "context": {
            "page": {"path": "/p", "referrer": "https://t.co/x"},
            "campaign": {"name": "spring", "source": ""},
            "device": {"type": "ios"},
            "os": {"name": "iOS"},
        },
    }
    bare = {**GOOD, "messageId": "bare", "properties": [1], "context": "not an object"}
    df = spark.createDataFrame(
        [(json.dumps(m), date(2026, 1, 5), "a.jsonl") for m in (page, bare)],
        "raw_line string, received_date date, source_file string",
    )
    accepted, _ = split_batch(
        rank_copies(
            parse_lines(df, start_date=START, future_tolerance=TOLERANCE, max_line_bytes=10_000)
        )
    )
    got = {r.message_id: r.asDict(recursive=True) for r in accepted.collect()}
    url = "https://www.Shop.example/p?utm_source=a+b&utm_medium=CPC"
    assert {k: got["page"][k] for k in EVENT_ATTRIBUTE_COLUMNS} == {
        "page_url": url,
        "page_path": "/p",
        "page_referrer": "https://t.co/x",
        "page_host": "shop.example",
        "referrer_host": "t.co",
        "campaign": dict.fromkeys(UTM_FIELDS) | {"utm_campaign": "spring"},
        "url_campaign": dict.fromkeys(UTM_FIELDS) | {"utm_source": "a b", "utm_medium": "CPC"},
        "device_type": "ios",
        "os_name": "iOS",
    }
    assert {k: got["bare"][k] for k in EVENT_ATTRIBUTE_COLUMNS} == dict.fromkeys(
        EVENT_ATTRIBUTE_COLUMNS
    ) | {"url_campaign": dict.fromkeys(UTM_FIELDS)}
