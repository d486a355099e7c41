"""The id index's hash on the driver equals Spark's `xxhash64`, whatever the text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from sessionize_assets.transforms.id_hash import xxhash64

# Every length class of XXH64 (under 4, 4-7, 8-31, 32 and more bytes, with each tail), and
# texts of several bytes a character.
FIXED = ["", "a", "abc", "abcd", "é", "中文", "msg-0001", "x" * 31, "y" * 32, "z" * 33, "w" * 71]


def test_the_hash_on_the_driver_is_sparks(spark):
    texts = list(FIXED)

    @settings(max_examples=300, database=None)
    @given(st.text(max_size=90))
    def collect(text: str) -> None:
        texts.append(text)

    collect()
    frame = spark.createDataFrame([(t,) for t in texts], "text string")
    expected = {row[0]: row[1] for row in frame.select("text", F.xxhash64("text")).collect()}
    assert {t: xxhash64(t) for t in texts} == expected
