"""What the landing zone says about its files without Spark."""

from __future__ import annotations

import gzip
from datetime import date
from pathlib import Path

from sessionize_assets.resources.landing import LandingZoneResource, text_bytes

DAY = date(2026, 1, 5)


def test_a_files_text_is_its_size_or_its_gzip_trailers_uncompressed_size(tmp_path: Path):
    text = b'{"messageId": "m1"}\n' * 500
    plain, packed = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz"
    plain.write_bytes(text)
    packed.write_bytes(gzip.compress(text))
    assert packed.stat().st_size < len(text)
    assert (text_bytes(plain), text_bytes(packed)) == (len(text), len(text))


def test_a_file_too_short_for_a_gzip_trailer_says_nothing(tmp_path: Path):
    short = tmp_path / "a.jsonl.gz"
    short.write_bytes(b"\x1f\x8b\x08")
    assert text_bytes(short) is None


def test_a_batchs_text_sums_its_batch_files_only(tmp_path: Path):
    folder = tmp_path / f"received_date={DAY.isoformat()}"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(b"x" * 100)
    (folder / "b.jsonl.gz").write_bytes(gzip.compress(b"y" * 1000))
    (folder / "notes.txt").write_bytes(b"z" * 10_000)  # not a batch file: not read
    landing = LandingZoneResource(landing_dir=str(tmp_path))
    assert landing.text_bytes([DAY]) == 1100
    assert landing.text_bytes([date(2026, 1, 6)]) == 0  # no folder: an empty batch
    (folder / "c.jsonl.gz").write_bytes(b"\x1f\x8b")
    assert landing.text_bytes([DAY]) is None


def _batch(tmp_path: Path, files: dict[str, bytes]) -> LandingZoneResource:
    folder = tmp_path / f"received_date={DAY.isoformat()}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return LandingZoneResource(landing_dir=str(tmp_path))


def test_the_driver_reads_the_lines_spark_reads(tmp_path: Path, spark):
    # Blank lines of Java's `\s` (and one ended by a line terminator Java's `$` passes over),
    # lines that only look blank to Python, and a last line without its newline.
    blank = ["", " \t", "\x0b\x0c ", "  \u2028", "\u0085"]
    kept = ['{"a": 1}', "\u00a0", "\u2028\u2028", "\x1c", " x ", "é\u2029é"]
    text = "\n".join([*blank, *kept, *blank, "last"]).encode()
    landing = _batch(tmp_path, {"a.jsonl": text, "b.jsonl.gz": text, "notes.txt": b"x\n"})
    plain = landing.read_plain_lines([DAY])
    assert plain is not None
    by_spark = landing.read_lines(spark, [DAY]).toArrow()
    assert plain.column_names == by_spark.column_names

    def rows(table):
        return sorted(map(repr, table.to_pylist()))

    assert rows(plain) == rows(by_spark)
    assert len(plain) == 2 * (len(kept) + 1)


def test_the_driver_leaves_other_text_to_spark(tmp_path: Path):
    good = b'{"a": 1}\n'
    cases = {
        "not utf-8": {"a.jsonl": good, "b.jsonl": good + b"\xff\n"},  # Spark keeps its bytes
        "carriage return": {"a.jsonl": good + b'{"b": 2}\r\n'},  # a line end to Spark too
        "plain": {"a.jsonl": good, "b.jsonl.gz": good},
    }
    read = {
        case: _batch(tmp_path / case.replace(" ", "_"), files).read_plain_lines([DAY])
        for case, files in cases.items()
    }
    assert read["not utf-8"] is None and read["carriage return"] is None
    assert read["plain"] is not None and read["plain"].num_rows == 2
    # A gzipped file cut short: Spark's read names it (`unreadable_file`).
    packed = tmp_path / "plain" / f"received_date={DAY.isoformat()}" / "b.jsonl.gz"
    packed.write_bytes(packed.read_bytes()[:-6])
    assert LandingZoneResource(landing_dir=str(tmp_path / "plain")).read_plain_lines([DAY]) is None
