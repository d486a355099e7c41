"""A replay killed with `kill -9` leaves a STARTED run behind: the next replay reports it
failed and finishes the work; a run left STARTING with no process is dead too (run_health.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import date, timedelta
from pathlib import Path
from uuid import uuid4

import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter, instance_for_test

from sessionize_assets.definitions import INGEST_JOB
from sessionize_assets.generator import ZoneSpec, generate_landing_zone
from sessionize_assets.replay.command import ReplayBusyError, replay, replay_lock
from sessionize_assets.run_health import UNFINISHED, is_dead, unfinished_runs
from sessionize_tests.conftest import make_settings, settings_environment, wait_until_group_is_gone
from sessionize_tests.test_replay import assert_tables_equal_the_full_recompute

START = date(2026, 1, 1)
PROJECT = Path(__file__).resolve().parents[1]


def _wait_for_started_run(instance: DagsterInstance, job_name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = instance.get_runs(RunsFilter(job_name=job_name, statuses=[DagsterRunStatus.STARTED]))
        if runs:
            return
        time.sleep(0.2)
    pytest.fail(f"no {job_name} run started within {timeout}s")


def test_a_killed_replay_leaves_a_dead_run_that_the_next_replay_fails_and_redoes(tmp_path, spark):
    settings = make_settings(tmp_path)
    generate_landing_zone(ZoneSpec(out=settings.landing_dir, start=START, users=20, seed=4), days=2)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT / "dagster.yaml", home / "dagster.yaml")  # the project's instance
    instance = DagsterInstance.local_temp(tempdir=str(home))
    killed = subprocess.Popen(
        [str(Path(sys.executable).with_name("sessionize")), "replay"],
        env={**os.environ, **settings_environment(settings), "DAGSTER_HOME": str(home)},
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the JVM dies with it, as in a crash
    )
    try:
        _wait_for_started_run(instance, INGEST_JOB, timeout=120)
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
        wait_until_group_is_gone(killed.pid)
    (orphan,) = instance.get_runs(RunsFilter(statuses=UNFINISHED))

    lines: list[str] = []
    summary = replay(settings=settings, instance=instance, echo=lines.append)

    assert instance.get_run_by_id(orphan.run_id).status == DagsterRunStatus.FAILURE
    assert any(orphan.run_id in line and "no process any more" in line for line in lines)
    assert summary.ok and [b.received for b in summary.batches] == [
        (START, START),
        (date(2026, 1, 2),) * 2,
    ]
    assert unfinished_runs(instance, log=lines.append) == []
    assert_tables_equal_the_full_recompute(settings, spark)


def test_one_replay_at_a_time(tmp_path):
    busy = pytest.raises(ReplayBusyError, match="another sessionize replay is running")
    with replay_lock(tmp_path), busy, replay_lock(tmp_path):
        pass
    with replay_lock(tmp_path):  # released with the first
        pass


def test_a_run_left_starting_before_its_launch_is_dead_after_the_launch_timeout():
    """The soak's finding: a machine's restart between the daemon marking a run STARTING and
    its process starting leaves a STARTING run with no process at all. It held the lake's
    pool until run monitoring's start timeout (180 s); now it is dead once no process has
    named itself for `launch_timeout`."""
    with instance_for_test() as instance:
        run = instance.add_run(
            DagsterRun(job_name=INGEST_JOB, run_id=str(uuid4()), status=DagsterRunStatus.STARTING)
        )
        assert not is_dead(instance, run)  # a launch may still be under way
        time.sleep(0.1)
        assert is_dead(instance, run, launch_timeout=timedelta(seconds=0.05))
        alive = unfinished_runs(instance, log=lambda line: None)  # the sensors' path
        assert alive == [run]  # within the default timeout: not failed
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.STARTING
