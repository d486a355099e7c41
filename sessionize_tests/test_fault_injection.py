"""kill -9 at commits chosen by seed, then a replay again: every table must be as an
uninterrupted replay leaves it (`fault_runner.py` is the injector).

The killed replays are `sessionize replay` processes (the JVM dies with them); the replay a user
runs next is `replay()`, what that command runs, in the tests' process on the same lake and
Dagster home: its warm Spark session spares a process's start and the JVM's warm-up (about a
third of a trial).

SESSIONIZE_FAULT_TRIALS (default 4) and SESSIONIZE_FAULT_SEED choose how many kills and where.
"""

from __future__ import annotations

import os
import random
import shutil
from collections import Counter
from datetime import date
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import DagsterInstance
from deltalake import DeltaTable

from sessionize_assets.definitions import build_definitions
from sessionize_assets.generator import ZoneSpec, generate_landing_zone
from sessionize_assets.replay.command import replay
from sessionize_tests.conftest import PROJECT, killed_at_commit, make_settings
from sessionize_tests.fault_runner import COMMITS_LINE

# Minutes of end-to-end runs: started first (conftest.py).
pytestmark = pytest.mark.slow

START = date(2026, 1, 1)
TRIALS = int(os.environ.get("SESSIONIZE_FAULT_TRIALS", "4"))
SEED = int(os.environ.get("SESSIONIZE_FAULT_SEED", "12"))
# Every asset's table (the bookkeeping tables record run ids, times and versions).
TABLES = sorted(
    key.path[-1]
    for key in build_definitions(make_settings(Path("/nonexistent")), spark_ui=False)
    .resolve_asset_graph()
    .get_all_asset_keys()
)
# Which run wrote a row, when, and at which table version: not the content.
_VOLATILE = {"run_id", "changed_at", "commit_version"}


def _replay(
    root: Path, zone: Path, *, at: int, when: str = "before", backend: str = "embedded"
) -> str:
    """Replay `zone` into the lake under `root` in a `sessionize replay` process, killed at
    commit `at` (0: not killed)."""
    settings = make_settings(root, landing_dir=zone, lake_backend=backend)
    home = root / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROJECT / "dagster.yaml", home / "dagster.yaml")
    done = killed_at_commit(settings, home=home, at=at, when=when, cwd=root)
    if at == 0:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    else:
        assert done.returncode == -9, f"not killed at commit {at}: {done.stdout[-2000:]}"
    return done.stdout


def _replay_again(root: Path, zone: Path, *, backend: str = "embedded") -> None:
    """What a user runs after the crash: a replay of `zone` on the killed one's lake and
    Dagster home, in this process (on the tests' Spark session: the callers ask for `spark`)."""
    settings = make_settings(root, landing_dir=zone, lake_backend=backend)
    with DagsterInstance.from_config(str(root / "dagster_home")) as instance:
        summary = replay(settings=settings, instance=instance, echo=lambda _: None)
    assert summary.ok


def _content(lake: Path) -> dict[str, Counter]:
    tables = {}
    for name in TABLES:
        rows = pa.table(DeltaTable(str(lake / name)).to_pyarrow_table()).to_pylist()
        tables[name] = Counter(
            tuple(sorted((k, _hashable(v)) for k, v in row.items() if k not in _VOLATILE))
            for row in rows
        )
    return tables


def _hashable(value: object) -> object:
    """A struct column's value (a dict) as a sorted tuple of its fields."""
    return tuple(sorted(value.items())) if isinstance(value, dict) else value


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    zone = root / "zone"
    generate_landing_zone(ZoneSpec(out=zone, start=START, users=30, seed=9, late_share=0.2), days=3)
    clean = root / "uninterrupted"
    out = _replay(clean, zone, at=0)
    commits = int(out.rsplit(COMMITS_LINE, 1)[1].split()[0])
    return zone, _content(clean / "lake"), commits


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_kill_at_any_commit_then_replay_leaves_the_uninterrupted_tables(
    uninterrupted, spark, tmp_path, trial
):
    zone, expected, commits = uninterrupted
    rng = random.Random(f"{SEED}:{trial}")
    at, when = rng.randint(1, commits), rng.choice(("before", "after"))
    _replay(tmp_path, zone, at=at, when=when)
    _replay_again(tmp_path, zone)
    got = _content(tmp_path / "lake")
    differences = {
        name: (expected[name] - got[name]) + (got[name] - expected[name])
        for name in TABLES
        if got[name] != expected[name]
    }
    print(
        f"trial {trial}: killed {when} commit {at} of {commits}; {len(differences)} tables differ"
    )
    assert differences == {}, f"killed {when} commit {at} of {commits}"


def test_a_kill_on_the_delta_spark_backend_then_replay_leaves_the_uninterrupted_tables(
    uninterrupted, spark, tmp_path
):
    """SESSIONIZE_LAKE_BACKEND=delta-spark, killed at one commit (Delta Spark's or
    delta-rs's) and replayed: its tables equal the embedded backend's uninterrupted ones."""
    zone, expected, commits = uninterrupted
    rng = random.Random(f"{SEED}:delta-spark")
    # The delta-spark backend makes every commit the embedded one makes, and more (it creates
    # each table in a commit of its own): a kill at one of the first `commits` always lands.
    at, when = rng.randint(1, commits), rng.choice(("before", "after"))
    _replay(tmp_path, zone, at=at, when=when, backend="delta-spark")
    _replay_again(tmp_path, zone, backend="delta-spark")
    got = _content(tmp_path / "lake")
    differences = {name for name in TABLES if got[name] != expected[name]}
    print(f"delta-spark: killed {when} commit {at}; {len(differences)} tables differ")
    assert differences == set(), f"killed {when} commit {at}"
