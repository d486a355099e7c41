"""SPEC §8's rules for a line or row of an erased key, known only by its salted hash."""

from __future__ import annotations

import json
from datetime import date, timedelta

from pyspark.sql import functions as F

from sessionize_assets.transforms.erased import ErasedKeys, key_hash
from sessionize_assets.transforms.validation import ERASED, mark_erased, parse_lines

SALT = "5a17"
ERASED_KEYS = ErasedKeys(salt=SALT, hashes=frozenset({key_hash(salt=SALT, key="gone")}))


def test_the_hash_on_the_driver_is_sparks(spark):
    got = spark.range(1).select(ERASED_KEYS.value_is_erased(F.lit("gone")).alias("v")).first()
    assert got is not None and got.v is True
    assert ERASED_KEYS.holds("gone") and not ERASED_KEYS.holds("gone2")
    assert not ERASED_KEYS.holds(None)
    # The salt is part of the hash: the same key under another salt is another hash.
    assert key_hash(salt="other", key="gone") != key_hash(salt=SALT, key="gone")


def test_a_json_string_of_the_key_is_erased_and_a_longer_string_is_not(spark):
    texts = [
        '{"userId": "gone", "timestamp": ',  # malformed, names the key
        '{"x": "not gone", "y": "gone-too"}',  # the key inside longer strings
        '{"x": "a \\"quoted\\" word", "y": "gone"}',  # escapes before it
        "x" * 200_000 + ' "gone"',  # a long line: no regex stack overflow
        None,
    ]
    frame = spark.createDataFrame([(t,) for t in texts], "raw_line string")
    found = [
        r.v for r in frame.select(ERASED_KEYS.text_holds_erased("raw_line").alias("v")).collect()
    ]
    assert found == [True, False, True, True, False]
    assert [ERASED_KEYS.text_holds(t) for t in texts if t is not None] == found[:-1]


def test_the_driver_finds_the_json_strings_java_finds(spark):
    # Java's `.` stops at its line terminators: an escape of one is no escape, and the string
    # found after it differs from the one Python's `.` would find.
    texts = [f'"\\{end}" "gone"' for end in ("\u2028", "\u2029", "\u0085", "x", "\t", "\u00a0")] + [
        f'"a\\{end}gone" "gone" x"' for end in ("\u2028", "x")
    ]
    frame = spark.createDataFrame([(t,) for t in texts], "raw_line string")
    found = [
        r.v for r in frame.select(ERASED_KEYS.text_holds_erased("raw_line").alias("v")).collect()
    ]
    assert [ERASED_KEYS.text_holds(t) for t in texts] == found
    assert True in found and False in found


def test_a_line_of_an_erased_key_keeps_nothing_of_the_line(spark):
    def line(**fields):
        message = {
            "messageId": "m",
            "timestamp": "2026-01-05T10:00:00Z",
            "receivedAt": "2026-01-05T10:00:01Z",
            **fields,
        }
        return json.dumps(message)

    lines = [
        line(userId="gone"),  # erased by its userId
        line(userId="kept", anonymousId="gone"),  # by its anonymousId
        line(userId="kept", properties={"friend": "gone"}),  # another's event: kept
        line(userId="gone", timestamp="yesterday"),  # invalid: by its text
        line(userId="kept", timestamp="yesterday"),  # invalid, another's: kept
    ]
    frame = spark.createDataFrame(
        [(text, date(2026, 1, 5), "received_date=2026-01-05/a.jsonl") for text in lines],
        "raw_line string, received_date date, source_file string",
    )
    parsed = parse_lines(
        frame,
        start_date=date(2026, 1, 1),
        future_tolerance=timedelta(minutes=5),
        max_line_bytes=1 << 20,
    )
    rows = (
        mark_erased(parsed, ERASED_KEYS)
        .select("reason", "raw_line", "message_id", "raw_bytes", "source_file")
        .collect()
    )
    assert [r.reason for r in rows] == [ERASED, ERASED, None, ERASED, "bad_timestamp"]
    for r in rows:
        if r.reason == ERASED:
            assert (r.raw_line, r.message_id, r.raw_bytes) == ("", None, None)
            assert r.source_file == "received_date=2026-01-05/a.jsonl"
    # No erasure: the lines are as parsed.
    assert mark_erased(parsed, None) is parsed
