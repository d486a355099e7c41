"""SPEC §8 end to end over a generated zone: `sessionize forget` erases three people (a
signed-in user with stitched devices, a quarantined bot, and one whose late events are
re-delivered after the erasure), killed with SIGKILL halfway the first time, through the
project's Dagster jobs and a real instance."""

from __future__ import annotations

import gzip
import shutil
from collections import Counter
from datetime import date
from pathlib import Path

import pytest
from dagster import DagsterInstance

from sessionize_assets.forget import forget
from sessionize_assets.generator import ZoneSpec, generate_landing_zone
from sessionize_assets.lake.location import Location
from sessionize_assets.lake.tables import ALL_TABLES, REJECTED_EVENTS
from sessionize_assets.pipeline.erased_keys import erasure_book
from sessionize_assets.pipeline.forget import data_files_on_disk
from sessionize_assets.replay.command import replay
from sessionize_assets.resources.lake import STORES
from sessionize_tests.conftest import PROJECT, killed_at_commit, make_settings
from sessionize_tests.full_recompute import differences
from sessionize_tests.reference import (
    is_erased_line,
    read_lines,
    reference_identities,
    reference_sessions,
    reference_validate,
    without_erased_lines,
)
from sessionize_tests.table_rows import table_rows

pytestmark = pytest.mark.slow

START = date(2026, 1, 1)
# The first forget is killed just before this commit of its own (counting from 1): past the
# erasure's begin (the record, then the batches' five commits) and its events run's first.
KILLED_AT_COMMIT = 9


def _people(settings) -> tuple[str, list[str], str, str, date]:
    """From the zone: the signed-in user with the most stitched devices (and those devices), a
    quarantined bot, and a third user with a late event in a batch after the first (and that
    batch)."""
    ref = reference_validate(settings.landing_dir, START)
    identities = reference_identities(ref.winners)
    devices = Counter(found.user_id for found in identities.values())
    signed_in = max(sorted(devices), key=lambda user: devices[user])
    stitched = sorted(anon for anon, found in identities.items() if found.user_id == signed_in)
    sessions = reference_sessions(
        ref.winners,
        gap=settings.session_gap,
        max_length=settings.max_session_length,
        conversion_events=settings.conversion_events,
    )
    taken = {signed_in, *stitched}
    bot = min(s.user_id for s in sessions if s.is_quarantined and s.user_id not in taken)
    late = min(
        (a.received_date, a.user_key)
        for a in ref.winners.values()
        if a.received_date > max(START, a.ts.date()) and a.user_key not in {*taken, bot}
    )
    return signed_in, stitched, bot, late[1], late[0]


def _rewrite(path: Path, lines: list[bytes]) -> None:
    data = b"\n".join(lines)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)


def test_forget_erases_three_people_exactly_even_killed_halfway(spark, tmp_path):
    zone = tmp_path / "landing"
    settings = make_settings(tmp_path, landing_dir=zone)
    generate_landing_zone(
        ZoneSpec(out=zone, start=START, users=30, seed=9, late_share=0.3, bot_share=0.1), days=4
    )
    signed_in, devices, bot, late, redelivered = _people(settings)
    assert devices, "the zone has a signed-in user with stitched devices"
    keys = {signed_in, *devices, bot, late}
    # The late user's lines of one batch arrive after the erasure, in that batch re-delivered.
    folder = zone / f"received_date={redelivered.isoformat()}"
    originals = tmp_path / "originals"
    shutil.copytree(folder, originals)
    held_back = 0
    for path in sorted(folder.iterdir()):
        lines = read_lines(path)
        kept = [raw for raw in lines if not is_erased_line(raw, {late}, START)]
        held_back += len(lines) - len(kept)
        _rewrite(path, kept)
    assert held_back

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT / "dagster.yaml", home / "dagster.yaml")
    with DagsterInstance.from_config(str(home)) as instance:
        # The history at once (one ingest range run, followed through together): what matters
        # here is what the lake holds, and `test_replay.py` proves both ways equal.
        assert replay(settings=settings, instance=instance, echo=lambda _: None, at_once=True).ok

        # kill -9 halfway through the first erasure (the JVM with it)...
        command = ["forget", *(arg for key in (signed_in, bot, late) for arg in ("--user", key))]
        done = killed_at_commit(
            settings, home=home, at=KILLED_AT_COMMIT, command=command, cwd=tmp_path, timeout=600
        )
        assert done.returncode == -9, f"not killed: {done.stdout[-2000:]} {done.stderr[-2000:]}"
        store = STORES[settings.lake_backend](spark=spark, lake=settings.lake)
        assert erasure_book(store).pending, "killed after the erasure was recorded"

        # ... and forget again: it finishes the erasure.
        said: list[str] = []
        assert forget(
            settings=settings, instance=instance, keys=[signed_in, bot, late], echo=said.append
        ), said
        assert not erasure_book(store).pending
        assert _files_naming(settings, keys) == []

        # The late user's lines re-delivered: `erased` rejections, whatever else the batch holds.
        for path in sorted(originals.iterdir()):
            shutil.copy(path, folder / path.name)
        summary = replay(settings=settings, instance=instance, echo=lambda _: None)
        assert summary.ok and len(summary.batches) == 1
        # A replay afterwards does nothing.
        again = replay(settings=settings, instance=instance, echo=lambda _: None)
        assert again.ok and not again.batches and again.caught_up is None

    erased = [r for r in table_rows(store, REJECTED_EVENTS) if r.reason == "erased"]
    expected = sum(
        is_erased_line(raw, keys, START)
        for path in folder.iterdir()
        for raw in read_lines(path)
        if raw.strip()
    )
    assert len(erased) == expected >= held_back
    assert {(r.raw_line, r.message_id, r.raw_bytes) for r in erased} == {("", None, None)}
    without = tmp_path / "without"
    without_erased_lines(zone, without, keys, START)
    found = differences(
        settings.with_overrides(landing_dir=without), spark, start=START, erased_lines=expected
    )
    assert not found, "the lake differs from the full recompute without them:\n" + "\n".join(found)
    assert _files_naming(settings, keys) == []


def _files_naming(settings, keys: set[str]) -> list[str]:
    """Data files under the lake (the Delta logs aside) whose bytes hold one of `keys`."""
    store_root = Location.of(settings.lake)
    found = []
    for spec in ALL_TABLES:
        for path in data_files_on_disk(store_root / spec.name):
            data = Path(path).read_bytes()
            found += [f"{path}: {key}" for key in sorted(keys) if key.encode() in data]
    return found
