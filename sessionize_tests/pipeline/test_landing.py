"""Batch folders against what was ingested: fingerprints, the comparison, the record."""

from __future__ import annotations

import dataclasses
import os
from datetime import date
from pathlib import Path

from sessionize_assets.lake.tables import LANDING_BATCHES
from sessionize_assets.pipeline.landing import (
    compare_landing,
    file_sha256,
    fingerprint,
    ingested_batches,
    record_ingested,
)

DAY = date(2026, 1, 5)


def _file(folder: Path, name: str, content: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(content)
    return path


def _touch_later(path: Path) -> None:
    status = path.stat()
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 10**9))


def test_fingerprint_is_the_content_not_the_file_times(tmp_path):
    path = _file(tmp_path, "a.jsonl", b'{"x": 1}\n')
    before = fingerprint(DAY, [path])
    _touch_later(path)
    assert fingerprint(DAY, [path]).digest == before.digest
    path.write_bytes(b'{"x": 2}\n')  # same size, other bytes
    assert fingerprint(DAY, [path]).digest != before.digest
    renamed = path.rename(tmp_path / "b.jsonl")
    assert fingerprint(DAY, [renamed]).digest != before.digest


def test_a_file_is_read_only_when_its_size_or_time_differs_from_what_is_known(tmp_path):
    path = _file(tmp_path, "a.jsonl", b"one\n")
    real = fingerprint(DAY, [path])
    # A record that says the same size and time with another digest is believed: not re-read.
    recorded = dataclasses.replace(
        real, files=(dataclasses.replace(real.files[0], sha256="recorded"),)
    )
    assert fingerprint(DAY, [path], known=recorded).files[0].sha256 == "recorded"
    _touch_later(path)
    digested: dict[str, tuple[int, int, str]] = {}
    again = fingerprint(DAY, [path], known=recorded, digested=digested)
    assert again.files[0].sha256 == file_sha256(path)
    assert digested == {str(path): (4, path.stat().st_mtime_ns, file_sha256(path))}
    # Digests passed back as `cached` spare the read next time, by path, size and time.
    cached = {str(path): (4, path.stat().st_mtime_ns, "cached")}
    assert fingerprint(DAY, [path], known=recorded, cached=cached).files[0].sha256 == "cached"


def test_compare_lists_new_changed_unchanged_and_vanished_batches(tmp_path):
    days = [date(2026, 1, d) for d in (1, 2, 3, 4)]
    paths = {
        day: _file(tmp_path / day.isoformat(), "p.jsonl", day.isoformat().encode()) for day in days
    }
    ingested = {day: fingerprint(day, [paths[day]]) for day in days[:3]}
    ingested[date(2025, 12, 31)] = fingerprint(date(2025, 12, 31), [paths[days[0]]])
    paths[days[1]].write_bytes(b"changed")
    _touch_later(paths[days[2]])  # re-delivered as it was
    folders = {day: [paths[day]] for day in days}
    folders[date(2026, 1, 9)] = []  # an empty folder: an empty batch, new

    comparison = compare_landing(folders, ingested)

    assert [(b.received, b.why) for b in comparison.pending] == [
        (days[1], "changed"),
        (days[3], "new"),
        (date(2026, 1, 9), "new"),
    ]
    assert comparison.pending[2].found.files == ()
    assert comparison.unchanged == [days[0], days[2]]
    assert comparison.vanished == [date(2025, 12, 31)]
    # The files the record does not vouch for: the changed, the touched and the new one.
    assert sorted(comparison.digests) == sorted(str(paths[d]) for d in days[1:])


def test_record_is_read_back_as_it_was_written(store, tmp_path):
    first = fingerprint(
        DAY, [_file(tmp_path / "1", "a.jsonl", b"a"), _file(tmp_path / "1", "b.jsonl.gz", b"bb")]
    )
    empty = fingerprint(date(2026, 1, 6), [])
    record_ingested(store, [first, empty], ingest_version=3, run_id="r1")
    assert ingested_batches(store.read_arrow(LANDING_BATCHES)) == {
        DAY: first,
        empty.received: empty,
    }
    # A batch recorded again replaces its record; the others stay.
    again = fingerprint(DAY, [_file(tmp_path / "2", "c.jsonl", b"c")])
    record_ingested(store, [again], ingest_version=4, run_id="r2")
    rows = store.read_arrow(LANDING_BATCHES).to_pylist()
    assert sorted((r["received_date"], r["ingest_version"], r["fingerprint"]) for r in rows) == [
        (DAY, 4, again.digest),
        (empty.received, 3, empty.digest),
    ]
