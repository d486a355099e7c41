"""A batch parsed on the driver holds what Spark's `parse_lines` and `mark_erased` give."""

from __future__ import annotations

import json
from datetime import date, timedelta

import pyarrow as pa
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st

from sessionize_assets.pipeline.event_ids import id_hash
from sessionize_assets.resources.landing import LINES_SCHEMA
from sessionize_assets.transforms.erased import ErasedKeys, key_hash
from sessionize_assets.transforms.parsed_rows import PARSED_ROWS_SCHEMA, parsed_rows
from sessionize_assets.transforms.validation import LINE_TOO_LONG, mark_erased, parse_lines

START = date(2026, 1, 1)
TOLERANCE = timedelta(minutes=5)
BATCH = date(2026, 1, 5)
SALT = "5a17"
# Keys the examples draw from; the first two are erased.
KEYS = ("gone", "gone\u2028", "u1", "a1", "")
ERASED_KEYS = ErasedKeys(salt=SALT, hashes=frozenset(key_hash(salt=SALT, key=k) for k in KEYS[:2]))
# Text that is no JSON value, or an odd one: Java's line terminators, escapes, astral planes.
_ODD_TEXT = st.text(
    alphabet=st.sampled_from(['"', "\\", "{", "}", " ", "\t", "\u0085", "\u2028", "é", "😀", "x"]),
    max_size=12,
)
_TIMES = st.sampled_from(
    [
        "2026-01-05T10:00:00Z",
        "2026-01-05T23:59:59.999999+00:00",
        "2026-01-05 10:00:00.5-03:00",
        "2026-01-05T10:04:59Z",  # within the tolerance of the batch's receivedAt
        "2025-12-31T23:59:59Z",  # before the start
        "2026-01-06T10:00:00Z",  # in the future
        "yesterday",
        "",
    ]
)
_URLS = st.sampled_from(
    [
        "https://www.Shop.example/p?utm_source=a+b&utm_medium=CPC",
        "https://t.co/x?utm_campaign=%E2%82%AC&utm_term=",
        "not a url",
        "",
    ]
)


@st.composite
def _message(draw: st.DrawFn) -> str:
    message: dict[str, object] = {}
    for key, values in (
        ("messageId", st.sampled_from(["m1", "m2", "m\u2028", "", 7])),
        ("userId", st.sampled_from([*KEYS, None])),
        ("anonymousId", st.sampled_from([*KEYS, None])),
        ("timestamp", _TIMES),
        ("receivedAt", st.sampled_from(["2026-01-05T10:00:00Z", "2026-01-05T10:00:00", "x"])),
        ("type", st.sampled_from(["track", "page", None])),
        ("event", _ODD_TEXT),
        ("properties", st.fixed_dictionaries({}, optional={"url": _URLS, "path": _ODD_TEXT})),
        (
            "context",
            st.fixed_dictionaries(
                {},
                optional={
                    "campaign": st.one_of(
                        st.just({}), st.fixed_dictionaries({"source": _ODD_TEXT, "name": _ODD_TEXT})
                    ),
                    "page": st.fixed_dictionaries({"referrer": _URLS}),
                    "device": st.fixed_dictionaries({"type": st.sampled_from(["ios", ""])}),
                    "userAgent": st.just("Mozilla"),
                },
            ),
        ),
        ("extraField", _ODD_TEXT),
    ):
        if draw(st.booleans()) or key in ("messageId", "timestamp", "receivedAt"):
            message[key] = draw(values)
    return json.dumps(message, ensure_ascii=draw(st.booleans()))


_LINES = st.lists(
    st.one_of(
        _message(),
        _message().map(lambda line: line[:-1]),  # cut short
        _ODD_TEXT.map(lambda text: f'{{"userId": "{text}", "x": "gone"}}'),
        _ODD_TEXT,
        st.just("[1, 2]"),
    ),
    max_size=30,
)


@given(lines=_LINES, max_line_bytes=st.sampled_from([60, 10_000]), erasing=st.booleans())
@examples(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_driver_parses_lines_as_spark_does(spark, lines, max_line_bytes, erasing):
    erased = ERASED_KEYS if erasing else None
    files = [f"received_date={BATCH}/{name}" for name in ("a.jsonl", "b.jsonl")]
    rows = [(line, BATCH, files[at % 2]) for at, line in enumerate(lines)]
    frame = spark.createDataFrame(rows, LINES_SCHEMA)  # as the landing zone's are read
    expected = mark_erased(
        parse_lines(
            frame, start_date=START, future_tolerance=TOLERANCE, max_line_bytes=max_line_bytes
        ),
        erased,
    ).withColumn("id_hash", id_hash("message_id"))
    spark_rows = expected.toArrow()

    got = parsed_rows(
        pa.table(
            {
                "raw_line": pa.array([line for line, _, _ in rows], pa.string()),
                "received_date": pa.array([day for _, day, _ in rows], pa.date32()),
                "source_file": pa.array([name for _, _, name in rows], pa.string()),
            }
        ),
        start_date=START,
        future_tolerance=TOLERANCE,
        max_line_bytes=max_line_bytes,
        erased=erased,
    )

    assert got.schema == PARSED_ROWS_SCHEMA
    # Spark's nullability follows its input frame's.
    assert [(f.name, f.type) for f in spark_rows.schema] == [
        (f.name, f.type) for f in PARSED_ROWS_SCHEMA
    ]
    assert sorted(map(repr, got.to_pylist())) == sorted(map(repr, spark_rows.to_pylist()))


def _lines(texts: list[str]) -> pa.Table:
    return pa.table(
        {
            "raw_line": pa.array(texts, pa.string()),
            "received_date": pa.array([BATCH] * len(texts), pa.date32()),
            "source_file": pa.array(["a.jsonl"] * len(texts), pa.string()),
        }
    )


def test_the_limit_counts_a_lines_bytes_on_the_driver():
    line = json.dumps(
        {
            "messageId": "m1",
            "userId": "u1",
            "timestamp": "2026-01-05T10:00:00Z",
            "receivedAt": "2026-01-05T10:00:00Z",
            "event": "é" * 20,
        },
        ensure_ascii=False,
    )
    size = len(line.encode())
    assert size > len(line)

    def outcome(limit: int) -> tuple[str | None, str | None]:
        (row,) = parsed_rows(
            _lines([line]),
            start_date=START,
            future_tolerance=TOLERANCE,
            max_line_bytes=limit,
            erased=None,
        ).to_pylist()
        return row["reason"], row["detail"]

    assert outcome(size) == (None, None)
    assert outcome(size - 1) == (LINE_TOO_LONG, f"{size} bytes, over the limit of {size - 1} bytes")
