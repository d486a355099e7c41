"""Tests for the landing-zone generator.

The main test re-implements SPEC §2 over the written files, independently of the generator's
bookkeeping, so the report the pipeline tests rely on is known to be right.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import subprocess
import sys
import uuid
from collections import Counter, defaultdict
from dataclasses import replace
from datetime import date, timedelta
from itertools import pairwise
from pathlib import Path

import pytest

from sessionize_assets.generator import (
    LATE_SHAPES,
    REJECTION_REASONS,
    GenerationReport,
    ZoneSpec,
    append_day,
    generate_landing_zone,
)
from sessionize_tests.reference import (
    Accepted,
    Reference,
    non_empty_str,
    read_lines,
    reference_validate,
)

START = date(2026, 1, 1)
GAP = timedelta(minutes=30)


def chains(winners: dict[str, Accepted]) -> list[list[Accepted]]:
    """SPEC §3 chains (gap strictly more than G starts a new one), per user key."""
    by_user: dict[str, list[Accepted]] = defaultdict(list)
    for acc in winners.values():
        by_user[acc.user_key].append(acc)
    result: list[list[Accepted]] = []
    for events in by_user.values():
        events.sort(key=lambda a: (a.ts, a.message_id))
        current = [events[0]]
        for prev, ev in pairwise(events):
            if ev.ts - prev.ts > GAP:
                result.append(current)
                current = []
            current.append(ev)
        result.append(current)
    return result


def assert_report_matches(report: GenerationReport, landing: Path, pipeline_start: date) -> None:
    ref = reference_validate(landing, pipeline_start)
    assert ref.lines == report.lines
    assert {k: v for k, v in report.expected_rejections.items() if v} == dict(ref.rejections)
    assert len(ref.winners) == report.valid_events
    late = sum(1 for a in ref.winners.values() if a.received_date > a.ts.date())
    assert late == report.late_events


def all_files(landing: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(landing)): p.read_bytes()
        for p in sorted(landing.rglob("*"))
        if p.is_file()
    }


def lateness_days(ref: Reference) -> list[int]:
    """Days between event date and received date of the late winners."""
    return [
        (a.received_date - a.ts.date()).days
        for a in ref.winners.values()
        if a.received_date > a.ts.date()
    ]


# ----------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[GenerationReport, Path]:
    out = tmp_path_factory.mktemp("big") / "landing"
    report = generate_landing_zone(ZoneSpec(out=out, start=START, users=300, seed=11), days=10)
    return report, out


@pytest.fixture(scope="module")
def big_reference(big: tuple[GenerationReport, Path]) -> Reference:
    return reference_validate(big[1], START)


# ----------------------------------------------------------------------- tests


def test_report_matches_independent_spec_reimplementation(
    big: tuple[GenerationReport, Path],
) -> None:
    report, out = big
    assert_report_matches(report, out, START)


@pytest.mark.parametrize(
    ("days", "users", "seed", "pipeline_start"),
    [
        (2, 20, 1, None),
        (5, 60, 2, date(2026, 1, 3)),  # events of the first two days become before_start
        (4, 40, 3, date(2025, 12, 20)),  # pipeline started before the landing zone
        (1, 5, 4, None),
        (3, 0, 5, None),  # no users: broken lines only
    ],
)
@pytest.mark.parametrize("late_shape", LATE_SHAPES)
def test_report_matches_for_other_shapes(
    tmp_path: Path, days: int, users: int, seed: int, pipeline_start: date | None, late_shape: str
) -> None:
    report = generate_landing_zone(
        ZoneSpec(
            out=tmp_path,
            start=START,
            users=users,
            seed=seed,
            pipeline_start=pipeline_start,
            late_shape=late_shape,
        ),
        days=days,
    )
    assert_report_matches(report, tmp_path, pipeline_start or START)


def test_line_accounting(big: tuple[GenerationReport, Path]) -> None:
    report, _out = big
    assert report.lines == report.valid_events + sum(report.expected_rejections.values())
    assert list(report.expected_rejections) == list(REJECTION_REASONS)
    assert report.batches == report.written_batches == 10
    assert "valid events" in report.summary()
    assert report.events_per_user_day == report.valid_events / (300 * 10)
    assert report.late_share == report.late_events / report.valid_events


@pytest.mark.parametrize(("days", "users", "seed"), [(2, 20, 5), (2, 20, 6), (10, 300, 11)])
def test_every_rejection_reason_present(tmp_path: Path, days: int, users: int, seed: int) -> None:
    report = generate_landing_zone(
        ZoneSpec(out=tmp_path, start=START, users=users, seed=seed), days=days
    )
    ref = reference_validate(tmp_path, START)
    for reason in REJECTION_REASONS:
        assert report.expected_rejections[reason] > 0, reason
        assert ref.rejections[reason] > 0, reason


def test_deterministic_by_seed(tmp_path: Path) -> None:
    zone = ZoneSpec(out=tmp_path / "a", start=START, users=60, seed=3)
    first = generate_landing_zone(zone, days=5)
    second = generate_landing_zone(replace(zone, out=tmp_path / "b"), days=5)
    generate_landing_zone(replace(zone, out=tmp_path / "c", seed=4), days=5)
    assert all_files(tmp_path / "a") == all_files(tmp_path / "b")
    assert first.expected_rejections == second.expected_rejections
    assert first.valid_events == second.valid_events
    assert all_files(tmp_path / "a") != all_files(tmp_path / "c")


def test_rerun_replaces_files_and_refuses_foreign_batches(tmp_path: Path) -> None:
    generate_landing_zone(ZoneSpec(out=tmp_path, start=START, users=30, seed=1), days=3)
    before = all_files(tmp_path)
    generate_landing_zone(ZoneSpec(out=tmp_path, start=START, users=30, seed=1), days=3)
    assert all_files(tmp_path) == before
    with pytest.raises(FileExistsError):
        generate_landing_zone(ZoneSpec(out=tmp_path, start=START, users=30, seed=1), days=2)


def test_layout(big: tuple[GenerationReport, Path]) -> None:
    report, out = big
    folders = sorted(p.name for p in out.iterdir())
    assert folders == [f"received_date={START + timedelta(days=d)}" for d in range(10)]
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert len(files) == report.files
    assert all(re.fullmatch(r"part-\d{5}\.jsonl(\.gz)?", p.name) for p in files)
    gz = [p for p in files if p.name.endswith(".gz")]
    assert gz and len(gz) < len(files)
    for p in gz:
        data = p.read_bytes()
        assert data[4:8] == b"\0\0\0\0"  # mtime=0: byte-identical reruns
        gzip.decompress(data)
    per_folder = Counter(p.parent.name for p in files)
    assert max(per_folder.values()) >= 2
    blank = [line for p in files for line in read_lines(p)[:-1] if line.strip() == b""]
    assert b"" in blank and b" \t" in blank


def test_timestamp_formats(big_reference: Reference) -> None:
    raws = [a.raw_timestamp for a in big_reference.winners.values()]
    offsets = Counter(m.group(0) for r in raws if (m := re.search(r"[+-]\d\d:\d\d$", r)))
    assert sum(r.endswith("Z") for r in raws) > len(raws) / 2
    assert len([o for o in offsets if o != "+00:00"]) >= 3
    assert any(re.search(r"T[\d:.]+$", r) for r in raws)  # no offset: UTC


def test_sessions_cross_midnight_and_bots_exceed_24h(big_reference: Reference) -> None:
    found = chains(big_reference.winners)
    crossing = [c for c in found if c[0].ts.date() != c[-1].ts.date()]
    assert len(crossing) >= 5
    assert any(c[-1].ts - c[0].ts > timedelta(hours=24) for c in found)
    # Gap boundary and identical timestamps occur inside chains.
    gaps = [b.ts - a.ts for c in found for a, b in pairwise(c)]
    assert timedelta(minutes=30) in gaps
    assert timedelta(0) in gaps


def test_late_events(big: tuple[GenerationReport, Path], big_reference: Reference) -> None:
    report, _out = big
    late = [a for a in big_reference.winners.values() if a.received_date > a.ts.date()]
    assert report.late_events >= 100
    very_late = [a for a in late if (a.received_date - a.ts.date()).days > 2]
    assert len(very_late) >= 10
    assert any(a.received - a.ts > timedelta(days=2) for a in late)


def test_anonymous_users_present(big: tuple[GenerationReport, Path]) -> None:
    _report, out = big
    shapes: Counter[str] = Counter()
    for path in sorted(out.rglob("part-*")):
        for line in read_lines(path):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if not isinstance(obj, dict) or not non_empty_str(obj.get("anonymousId")):
                continue
            if "userId" not in obj:
                shapes["absent"] += 1
            elif obj["userId"] is None:
                shapes["null"] += 1
            elif obj["userId"] == "":
                shapes["empty"] += 1
    assert shapes["absent"] > 0 and shapes["null"] > 0 and shapes["empty"] > 0


def test_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        generate_landing_zone(ZoneSpec(out=tmp_path, start=START, users=10, seed=1), days=0)
    with pytest.raises(ValueError):
        generate_landing_zone(
            ZoneSpec(out=tmp_path, start=START, users=10, seed=1, late_share=1.5), days=2
        )


def test_zero_shares(tmp_path: Path) -> None:
    report = generate_landing_zone(
        ZoneSpec(
            out=tmp_path,
            start=START,
            users=60,
            seed=8,
            late_share=0,
            duplicate_share=0,
            invalid_share=0,
            gzip_share=0,
        ),
        days=4,
    )
    assert not [p for p in tmp_path.rglob("*.gz")]
    assert sum(report.expected_rejections.values()) == 0
    assert report.lines == report.valid_events > 0
    assert_report_matches(report, tmp_path, START)


# ----------------------------------------------------------------------- consistent extension


@pytest.mark.parametrize("late_shape", LATE_SHAPES)
def test_first_days_do_not_depend_on_days(tmp_path: Path, late_shape: str) -> None:
    zone = ZoneSpec(out=tmp_path / "short", start=START, users=80, seed=7, late_shape=late_shape)
    generate_landing_zone(zone, days=3)
    generate_landing_zone(replace(zone, out=tmp_path / "long"), days=7)
    first_days = {f"received_date={START + timedelta(days=d)}" for d in range(3)}
    long = all_files(tmp_path / "long")
    assert all_files(tmp_path / "short") == {
        k: v for k, v in long.items() if k.split("/")[0] in first_days
    }
    assert len({k.split("/")[0] for k in long}) == 7


@pytest.mark.parametrize("late_shape", LATE_SHAPES)
def test_append_day_writes_the_batch_of_the_longer_run(tmp_path: Path, late_shape: str) -> None:
    grown = ZoneSpec(
        out=tmp_path / "grown",
        start=START,
        users=80,
        seed=9,
        late_shape=late_shape,
        pipeline_start=START + timedelta(days=1),
    )
    longer = generate_landing_zone(replace(grown, out=tmp_path / "longer"), days=6)
    generate_landing_zone(grown, days=4)
    append_day(grown)
    appended = append_day(grown)
    assert all_files(tmp_path / "grown") == all_files(tmp_path / "longer")
    assert appended.written_batches == 1
    assert dataclasses.replace(appended, out=longer.out, written_batches=6) == longer
    assert "the zone now holds 6" in appended.summary()
    assert_report_matches(appended, tmp_path / "grown", START + timedelta(days=1))


def test_append_day_refuses_zones_it_cannot_extend(tmp_path: Path) -> None:
    zone = ZoneSpec(out=tmp_path, start=START, users=10, seed=1)
    with pytest.raises(FileNotFoundError):
        append_day(zone)
    generate_landing_zone(zone, days=2)
    with pytest.raises(ValueError, match="consecutive"):
        append_day(replace(zone, start=START + timedelta(days=1)))
    with pytest.raises(ValueError, match="generated with"):
        append_day(ZoneSpec(out=tmp_path, start=START, users=10, seed=2))
    (tmp_path / f"received_date={START + timedelta(days=5)}").mkdir()
    with pytest.raises(ValueError, match="consecutive"):
        append_day(zone)
    assert len(list(tmp_path.iterdir())) == 3  # nothing was written


def message_bodies(landing: Path) -> dict[str, set[str]]:
    """Each messageId's message as sent, without the per-delivery stamps."""
    bodies: dict[str, set[str]] = defaultdict(set)
    for path in sorted(landing.rglob("part-*")):
        for line in read_lines(path):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and non_empty_str(obj.get("messageId")):
                obj.pop("sentAt", None)
                obj.pop("receivedAt", None)
                bodies[obj["messageId"]].add(json.dumps(obj, sort_keys=True))
    return bodies


def test_message_ids_never_collide(tmp_path: Path) -> None:
    """Lines share an id only when they are deliveries of one message (retries)."""
    recent = ZoneSpec(out=tmp_path / "recent", start=START, users=150, seed=21)
    generate_landing_zone(recent, days=5)
    append_day(recent)
    generate_landing_zone(replace(recent, out=tmp_path / "uniform", late_shape="uniform"), days=6)
    for zone in ("recent", "uniform"):
        bodies = message_bodies(tmp_path / zone)
        assert len(bodies) > 3_000
        assert [mid for mid, found in bodies.items() if len(found) > 1] == []
        for mid in bodies:
            parsed = uuid.UUID(mid.removeprefix("ajs-next-"))
            assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


# ----------------------------------------------------------------------- lateness shapes


@pytest.fixture(scope="module")
def shapes(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[GenerationReport, Reference]]:
    result = {}
    for shape in LATE_SHAPES:
        out = tmp_path_factory.mktemp(shape) / "landing"
        report = generate_landing_zone(
            ZoneSpec(out=out, start=START, users=300, seed=13, late_shape=shape), days=20
        )
        result[shape] = (report, reference_validate(out, START))
    return result


def test_recent_lateness_is_mostly_days_with_a_long_tail(
    shapes: dict[str, tuple[GenerationReport, Reference]],
) -> None:
    report, ref = shapes["recent"]
    late = lateness_days(ref)
    assert sum(1 for d in late if d <= 3) > 0.75 * len(late)
    assert max(late) >= 7
    assert 0.02 < report.late_share < 0.05  # some late events arrive after the zone's end


def test_uniform_lateness_spreads_over_the_whole_history(
    shapes: dict[str, tuple[GenerationReport, Reference]],
) -> None:
    report, ref = shapes["uniform"]
    late = lateness_days(ref)
    recent_late = lateness_days(shapes["recent"][1])

    def share_older(days: list[int], than: int) -> float:
        return sum(1 for d in days if d >= than) / len(days)

    # Uniform over 1..r days for batch r: about half of it at least 5 days late.
    assert share_older(late, 5) > 0.3
    assert share_older(late, 5) > 3 * share_older(recent_late, 5)
    assert max(late) >= 15
    # late_share holds per batch, not only as a probability.
    assert 0.04 < report.late_share < 0.06
    assert report.late_share == pytest.approx(len(late) / len(ref.winners))


@pytest.mark.parametrize("late_shape", LATE_SHAPES)
def test_report_matches_for_late_shapes(
    shapes: dict[str, tuple[GenerationReport, Reference]], late_shape: str
) -> None:
    report, ref = shapes[late_shape]
    assert ref.lines == report.lines
    assert {k: v for k, v in report.expected_rejections.items() if v} == dict(ref.rejections)
    assert len(ref.winners) == report.valid_events
    assert len(lateness_days(ref)) == report.late_events


# ----------------------------------------------------------------------- streaming


# Measured in a process of its own: tracemalloc counts every thread's allocations, and a test
# worker may hold other tests' threads (py4j, Dagster) and their uncollected garbage.
_PEAK_OF_GENERATION = """
import json, sys, tracemalloc
from datetime import date
from pathlib import Path
from sessionize_assets.generator import ZoneSpec, generate_landing_zone
tracemalloc.start()
report = generate_landing_zone(
    ZoneSpec(out=Path(sys.argv[1]), start=date.fromisoformat(sys.argv[2]), users=120, seed=6,
             gzip_share=0),
    days=60,
)
print(json.dumps({"peak": tracemalloc.get_traced_memory()[1], "lines": report.lines}))
"""


def test_memory_stays_bounded_by_a_few_batches(tmp_path: Path) -> None:
    """The zone is written a batch at a time: peak memory is a small part of what is written."""
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_OF_GENERATION, str(tmp_path), START.isoformat()],
        check=True,
        capture_output=True,
        text=True,
    )
    measured = json.loads(out.stdout)
    written = sum(p.stat().st_size for p in tmp_path.rglob("*.jsonl"))
    assert measured["lines"] > 20_000
    assert measured["peak"] < written / 3, (measured["peak"], written)
