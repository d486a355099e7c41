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
