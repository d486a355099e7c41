"""SPEC §8 without Dagster, on the embedded backend with Spark's writer (`test_forget.py` runs
it end to end with the driver's writes, `test_object_storage.py` the delta-spark backend on
S3): an erasure's rules, one at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_assets.lake.location import Location
from sessionize_assets.lake.tables import (
    ALL_TABLES,
    ERASURES,
    EVENT_IDS,
    REJECTED_EVENTS,
    SESSION_CHANGES,
)
from sessionize_assets.pipeline.erased_keys import erasure_book
from sessionize_assets.pipeline.forget import (
    ERASED_USER,
    ErasureNotCaughtUp,
    begin_erasure,
    data_files_on_disk,
    finish_erasure,
)
from sessionize_tests.driver import catch_up
from sessionize_tests.harness import Killed, KilledBeforeCommitTo, Pipeline, day
from sessionize_tests.reference import without_erased_lines
from sessionize_tests.table_rows import table_rows

# Keys long enough that a byte search finds them only where they are written.
ALICE, DEVICE = "alice-5f1c2a", "device-of-alice-9d3e"
BOB, CAROL = "bob-b81e44", "carol-c3d9f1"


def _anonymous(device: str) -> dict:
    return {
        "userId": None,
        "anonymousId": device,
        "type": "page",
        "properties": {"url": "https://x.io/a"},
    }


def _signed_in(device: str) -> dict:
    return {"anonymousId": device, "type": "track", "event": "Tapped"}


def _land(pipeline: Pipeline) -> None:
    pipeline.land(
        day(0),
        [
            ("d1", DEVICE, "2026-01-10 09:00", _anonymous(DEVICE)),
            ("a1", ALICE, "2026-01-10 09:10", _signed_in(DEVICE)),
            # An id alice's copy wins (earlier batch); bob's later copy is a duplicate.
            ("shared", ALICE, "2026-01-10 09:20"),
            ("b1", BOB, "2026-01-10 09:05"),
            ("b2", BOB, "2026-01-10 23:50"),
            ("c1", CAROL, "2026-01-10 12:00"),
        ],
    )
    # A malformed line that names alice: a rejection whose text holds her key.
    folder = pipeline.settings.landing_dir / f"received_date={day(0).isoformat()}"
    with (folder / "part.jsonl").open("a") as out:
        out.write(f'{{"messageId": "bad", "userId": "{ALICE}", "timestamp": \n')
    pipeline.land(
        day(1),
        [
            ("a2", ALICE, "2026-01-10 09:30"),  # late: extends her session of day 0
            ("shared", BOB, "2026-01-11 08:00"),
            ("b3", BOB, "2026-01-11 00:10"),  # joins bob's session across midnight
        ],
    )


def test_an_erasure_removes_a_user_and_their_devices_and_what_followed_them(
    pipeline: Pipeline, spark, tmp_path
):
    # Spark's writer writes every change (`_commit_with_spark` too): the end-to-end test
    # writes the small ones from the driver.
    pipeline.store = EmbeddedDeltaStore(
        spark=spark, lake=pipeline.settings.lake_dir, driver_write_bytes=0
    )
    _land(pipeline)
    pipeline.process(day(0))
    pipeline.process(day(1))
    store, settings = pipeline.store, pipeline.settings

    # Killed between its batches' raw_events commit and their id index's: the raw rows are
    # clean already, and a second run must still finish those batches.
    with pytest.raises(Killed):
        begin_erasure(
            KilledBeforeCommitTo(store, EVENT_IDS.name),
            keys=[ALICE],
            settings=settings,
            run_id="forget-1",
        )
    begun = begin_erasure(store, keys=[ALICE], settings=settings, run_id="forget-2")
    assert begun.erasure.erasure_id == "forget-1" and begun.ingested is not None
    assert sorted(begun.ingested.batches) == [day(0), day(1)]
    assert len(begun.erasure.stitched_hashes) == 1  # her device
    assert begun.erasure.rows_removed["raw_events"] == 4  # d1, a1, shared (day 0), a2
    assert begun.erasure.rows_removed["rejected_events"] == 1  # the malformed line
    with pytest.raises(ErasureNotCaughtUp, match="events"):
        finish_erasure(store, lambda: spark, run_id="finish-early")
    catch_up(store, spark, settings=settings, run_id="follow")
    naming = _files_naming(pipeline, [ALICE, DEVICE])
    before = _data_files(pipeline)
    # The files on disk are named as the log names the live ones (what finish compares).
    assert {path for spec in ALL_TABLES for path in store.live_files(spec)} <= before
    assert naming, "the replaced files are still on disk before the erasure finishes"
    finished = finish_erasure(store, lambda: spark, run_id="finish")
    # Only the files that held a key are gone (the corrections log's rewrite added some).
    assert before - _data_files(pipeline) == {line.split(": ")[0] for line in naming}
    assert [e.erasure_id for e in finished.erasures] == ["forget-1"]

    zone = tmp_path / "without"
    assert (
        without_erased_lines(settings.landing_dir, zone, {ALICE, DEVICE}, settings.start_date) == 5
    )
    pipeline.assert_equals_full_recompute(landing=zone)
    # bob's copy of the shared id was a duplicate of hers: it is his event now.
    assert not [r for r in table_rows(store, REJECTED_EVENTS) if r.reason == "duplicate"]
    # The corrections log keeps her sessions' removal, without her key.
    erased_changes = [r for r in table_rows(store, SESSION_CHANGES) if r.user_id == ERASED_USER]
    assert {r.change for r in erased_changes} == {"added", "removed"}
    assert _files_naming(pipeline, [ALICE, DEVICE]) == []
    book = erasure_book(store)
    assert book.salt and not book.pending
    assert ALICE not in json.dumps([str(r) for r in table_rows(store, ERASURES)])

    # Her lines re-delivered: `erased` rejections with nothing of the line; nothing else moves.
    pipeline.land(
        day(1),
        [
            ("a2", ALICE, "2026-01-10 09:30"),
            ("shared", BOB, "2026-01-11 08:00"),
            ("b3", BOB, "2026-01-11 00:10"),
            ("a3", ALICE, "2026-01-11 10:00", _signed_in("another-device")),
        ],
    )
    pipeline.process(day(1))
    erased = [r for r in table_rows(store, REJECTED_EVENTS) if r.reason == "erased"]
    assert [(r.raw_line, r.message_id, r.raw_bytes) for r in erased] == [("", None, None)] * 2
    assert _files_naming(pipeline, [ALICE, DEVICE]) == []

    # A second erasure ingests day 1 again: it keeps the lines rejected as `erased` there
    # (the comparison below covers the re-delivery's as well).
    begin_erasure(store, keys=[BOB], settings=settings, run_id="forget-bob")
    catch_up(store, spark, settings=settings, run_id="follow-bob")
    finish_erasure(store, lambda: spark, run_id="finish-bob")
    gone = {ALICE, DEVICE, BOB}
    without_erased_lines(settings.landing_dir, tmp_path / "without-bob", gone, settings.start_date)
    pipeline.assert_equals_full_recompute(landing=tmp_path / "without-bob", erased_lines=2)
    assert _files_naming(pipeline, sorted(gone)) == []


def _data_files(pipeline: Pipeline) -> set[str]:
    return {
        path
        for spec in ALL_TABLES
        for path in data_files_on_disk(Location.of(pipeline.store.uri(spec)))
    }


def _files_naming(pipeline: Pipeline, keys: list[str]) -> list[str]:
    """The data files under the lake (the logs aside) whose bytes hold one of `keys`."""
    found = []
    for spec in ALL_TABLES:
        for path in data_files_on_disk(Location.of(pipeline.store.uri(spec))):
            data = Path(path).read_bytes()
            found += [f"{path}: {key}" for key in keys if key.encode() in data]
    return found
