"""SPEC §2's duplicate rule within a batch, by Spark's executors and on the driver."""

from __future__ import annotations

import itertools
import json
from datetime import date, datetime, timedelta

from sessionize_assets.transforms.copies import (
    DUPLICATE_DETAIL,
    rank_copies,
    split_batch,
    split_collected,
)
from sessionize_assets.transforms.validation import (
    BAD_TIMESTAMP,
    DUPLICATE,
    INGEST,
    MALFORMED_JSON,
    parse_lines,
)

START = date(2026, 1, 1)
TOLERANCE = timedelta(minutes=5)
BATCH = date(2026, 1, 5)


def _line(mid: str, received: str, *, tail: str = "", **extra: object) -> str:
    """A valid line; `tail` changes its text (not its fields' values) with a key at its end."""
    message = {
        "messageId": mid,
        "userId": "u1",
        "timestamp": "2026-01-05T10:00:00Z",
        "receivedAt": received,
        **extra,
    }
    return json.dumps(message, ensure_ascii=False)[:-1] + (f', "{tail}": 1}}' if tail else "}")


def _parsed(spark, rows: list[tuple[str, date, str]]):
    df = spark.createDataFrame(rows, "raw_line string, received_date date, source_file string")
    return parse_lines(df, start_date=START, future_tolerance=TOLERANCE, max_line_bytes=10_000)


def test_the_earliest_received_copy_wins_then_the_file_then_the_text(spark):
    lines = [
        (_line("m1", "2026-01-05T10:00:09Z"), "b.jsonl"),
        (_line("m1", "2026-01-05T10:00:03Z"), "b.jsonl"),  # earliest receivedAt wins
        (_line("m1", "2026-01-05T10:00:03Z"), "a.jsonl"),  # same time: file name decides
        (_line("m2", "2026-01-05T10:00:03Z", timestamp="nope"), "a.jsonl"),
        (_line("m2", "2026-01-05T10:00:04Z"), "a.jsonl"),  # the invalid copy does not compete
        ("{broken", "a.jsonl"),
    ]
    parsed = _parsed(spark, [(text, BATCH, f"received_date=2026-01-05/{f}") for text, f in lines])
    accepted, rejected = split_batch(rank_copies(parsed))

    got = {r.message_id: r for r in accepted.collect()}
    assert set(got) == {"m1", "m2"}
    assert got["m1"].source_file.endswith("a.jsonl")
    assert got["m1"].received_at == datetime(2026, 1, 5, 10, 0, 3)
    assert got["m1"].event_date == BATCH
    reasons = sorted(r.reason for r in rejected.collect())
    assert reasons == [BAD_TIMESTAMP, DUPLICATE, DUPLICATE, MALFORMED_JSON]
    assert accepted.count() + rejected.count() == len(lines)


def test_the_driver_splits_a_batch_as_spark_does(spark):
    # Copies that tie on every key but the last, in each order: the receivedAt, then the file,
    # then the text (whose order is the bytes': U+FF5E sorts before U+1F600 in UTF-8 and after
    # it in UTF-16), and lines that are the same text twice; over two batches, with invalid
    # copies that do not compete.
    rows = []
    for batch, mid, received, file, tail in itertools.product(
        (BATCH, BATCH + timedelta(days=1)),
        ("m1", "m2"),
        ("2026-01-05T10:00:03Z", "2026-01-05T10:00:01Z"),
        ("b.jsonl", "a.jsonl"),
        ("", "\uff5e", "\U0001f600"),
    ):
        rows.append((_line(mid, received, tail=tail), batch, f"received_date={batch}/{file}"))
    second = BATCH + timedelta(days=1)
    winner = _line("m2", "2026-01-05T10:00:01Z", tail="\uff5e")
    rows.append((winner, second, f"received_date={second}/a.jsonl"))  # the same line twice
    rows.append((_line("m3", "2026-01-05T10:00:01Z"), BATCH, "a.jsonl"))
    rows.append((_line("m3", "2026-01-05T10:00:00Z", timestamp="nope"), BATCH, "a.jsonl"))
    rows.append(("[1]", BATCH, "a.jsonl"))
    parsed = _parsed(spark, rows)
    accepted, rejected = split_batch(rank_copies(parsed))
    kept, turned_away = split_collected(parsed.toArrow())

    def accepted_rows(table: list[dict]) -> list[tuple]:
        keys = ("received_date", "message_id", "received_at", "source_file", "raw_line")
        # Arrow's timestamps carry the session's zone (UTC), Spark's rows none.
        naive = [
            {k: v.replace(tzinfo=None) if isinstance(v, datetime) else v for k, v in row.items()}
            for row in table
        ]
        return sorted(tuple(row[k] for k in keys) for row in naive)

    def rejected_rows(table: list[dict]) -> list[tuple]:
        return sorted(tuple((k, str(v)) for k, v in sorted(row.items())) for row in table)

    spark_kept = [row.asDict() for row in accepted.collect()]
    assert accepted_rows(kept.to_pylist()) == accepted_rows(spark_kept)
    assert winner in kept.column("raw_line").to_pylist()
    assert len(kept) == 5  # one copy of m1 and m2 in each batch, m3
    spark_rejected = [row.asDict() for row in rejected.collect()]
    assert rejected_rows(turned_away.to_pylist()) == rejected_rows(spark_rejected)
    assert set(turned_away.column_names) == set(rejected.columns)
    duplicates = [r for r in turned_away.to_pylist() if r["reason"] == DUPLICATE]
    assert len(duplicates) == len(rows) - 5 - 2
    assert {(r["detail"], r["origin"], r["event_date"]) for r in duplicates} == {
        (DUPLICATE_DETAIL, INGEST, None)
    }
    reasons = sorted(r["reason"] for r in turned_away.to_pylist() if r["reason"] != DUPLICATE)
    assert reasons == [BAD_TIMESTAMP, MALFORMED_JSON]


def test_the_driver_splits_an_empty_batch(spark):
    kept, turned_away = split_collected(_parsed(spark, []).toArrow())
    assert (kept.num_rows, turned_away.num_rows) == (0, 0)
