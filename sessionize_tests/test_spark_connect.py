"""The command line over a Spark Connect server, as a deployed daemon's runs use it.

`sessionize spark-server`'s server (`spark_server.running_server`, on the tests' small local
master) serves `sessionize replay` and `sessionize rebuild`, each in a process of its own: a
Connect client in a process turns every pyspark call of that process into a Connect call, so
no test process may hold one beside its classic session. Two months of history land first as
a backlog (`replay --at-once`: one run per step over 56 dates, whose plans must fit Spark
Connect's messages), then a daily batch. The tables must equal the full recompute, each
batch reports its Spark jobs (counted by the server), the runs share one server session (one
Python daemon for all their Python functions), and a rebuild of every date and the
maintenance job leave them so.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from datetime import date, timedelta
from pathlib import Path

import pytest

from sessionize_assets.generator import ZoneSpec, generate_landing_zone
from sessionize_assets.resources.spark import answers
from sessionize_assets.spark_server import running_server
from sessionize_tests.conftest import (
    make_settings,
    run_command,
    run_sessionize,
    settings_environment,
)
from sessionize_tests.dev_server import free_port
from sessionize_tests.soak.processes import command_lines, spark_server_pids
from sessionize_tests.test_replay import assert_tables_equal_the_full_recompute

# Minutes of end-to-end runs: started first (conftest.py).
pytestmark = pytest.mark.slow

START = date(2026, 1, 1)
TIMEOUT = 600
# Two months of history landed at once, then a day landed on its own.
BACKLOG_DAYS = 56
DAILY = 1
BACKLOG_USERS = 20


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("spark_connect")
    settings = make_settings(
        root,
        start_date=START,
        spark_server_master="local[2]",
        spark_server_port=free_port(),
        spark_server_ui_port=free_port(),
    )
    generate_landing_zone(
        ZoneSpec(
            out=settings.landing_dir,
            start=START,
            users=BACKLOG_USERS,
            seed=23,
            late_share=0.2,
            late_shape="uniform",
        ),
        days=BACKLOG_DAYS + DAILY,
    )
    # The last day lands later, on its own.
    later = root / "later"
    later.mkdir()
    daily = sorted(settings.landing_dir.iterdir())[-DAILY:]
    for folder in daily:
        folder.rename(later / folder.name)
    with running_server(settings, log_path=root / "spark-server.log") as address:
        env = settings_environment(settings) | {
            "SESSIONIZE_SPARK_MASTER": address,
            "DAGSTER_HOME": str(root / "dagster_home"),
        }
        backlog = run_sessionize("replay", "--at-once", env=env, cwd=root, timeout=TIMEOUT)
        for folder in daily:
            (later / folder.name).rename(folder)
        replayed = run_sessionize("replay", env=env, cwd=root, timeout=TIMEOUT)
        yield settings, env, root, backlog + replayed


def test_a_backlog_then_a_daily_batch_over_the_server_equal_the_full_recompute(served, spark):
    """The backlog's range runs cover 56 dates at once: before its reads were one flat IN,
    the events run's filter nested an OR per batch, and Spark Connect failed to parse it
    (`DecodeError: Error parsing message with type 'spark.connect.Expression'`)."""
    settings, _, _, output = served
    assert f"Spark started (sc://127.0.0.1:{settings.spark_server_port}/;session_id=" in output
    last = START + timedelta(days=BACKLOG_DAYS - 1)
    assert f"[1/1] {START}..{last} ({BACKLOG_DAYS} new): ok in " in output, output
    progress = [
        line
        for line in output.splitlines()
        if re.match(rf"\[\d/{DAILY}\] ", line) and not line.startswith(f"[1/1] {START}..")
    ]
    assert len(progress) == DAILY and all(" ok in " in line for line in progress), output
    # Counted by the server (the client has no SparkContext): the client alone would count
    # none of the backlog's. A daily batch is ingested, settled and sessionized on the
    # driver: none of its runs asks the server for a job.
    (backlog,) = [line for line in output.splitlines() if line.startswith(f"[1/1] {START}..")]
    assert _spark_jobs(backlog) > 0, backlog
    assert [_spark_jobs(line) for line in progress] == [0] * DAILY, progress
    assert_tables_equal_the_full_recompute(settings, spark)


def _spark_jobs(progress: str) -> int:
    """The Spark jobs a replay's progress line reports for its batch."""
    found = re.search(r"spark jobs=(\d+),", progress)
    assert found is not None, progress
    return int(found.group(1))


def test_the_runs_share_one_python_daemon_of_the_server(served):
    settings, *_ = served
    (server,) = spark_server_pids(settings.spark_server_port)
    daemons = [pid for pid, parent in _python_daemons() if parent == server]
    # One for the shared session: a session per run would leave one per ingest run (four).
    assert len(daemons) == 1, daemons


def test_a_rebuild_over_the_server_changes_nothing(served, spark):
    settings, env, root, _ = served
    output = run_sessionize("rebuild", env=env, cwd=root, timeout=TIMEOUT)
    assert re.search(r"^recomputed (\d+) event days and \1 session days$", output, re.M), output
    assert "events changed on 0 days" in output.splitlines(), output
    assert "sessions changed on 0 days" in output.splitlines(), output
    assert_tables_equal_the_full_recompute(settings, spark)


MAINTAIN = """
from dagster import DagsterInstance
from sessionize_assets.definitions import build_definitions
from sessionize_assets.schedules import MAINTENANCE_JOB
from sessionize_assets.settings import Settings

job = build_definitions(Settings.from_env()).resolve_job_def(MAINTENANCE_JOB)
result = job.execute_in_process(instance=DagsterInstance.get())
print("compacted", result.output_for_node("maintain_tables") is None and result.success)
"""


def test_the_maintenance_job_over_the_server_keeps_every_row(served, spark):
    settings, env, root, _ = served
    output = run_command([sys.executable, "-c", MAINTAIN], env=env, cwd=root, timeout=TIMEOUT)
    assert "compacted True" in output, output
    assert_tables_equal_the_full_recompute(settings, spark)


COUNT = """
import os
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(os.environ["SESSIONIZE_SPARK_MASTER"]).getOrCreate()
print("rows", spark.range(3).count())
"""


def test_a_killed_server_is_started_again_on_its_port(served):
    """The server dies (SIGKILL, as the OOM killer does): `running_server` starts it again on
    the same port, and a client reaches it at the same address (the soak found every run
    failing until a person restarted `sessionize dev`)."""
    settings, env, root, _ = served
    port = settings.spark_server_port
    (killed,) = spark_server_pids(port)
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while not (spark_server_pids(port) not in ([], [killed]) and answers("127.0.0.1", port)):
        assert time.monotonic() < deadline, "the server was not started again within 120 s"
        time.sleep(0.5)
    output = run_command([sys.executable, "-c", COUNT], env=env, cwd=root, timeout=TIMEOUT)
    assert "rows 3" in output, output


def _python_daemons() -> list[tuple[int, int]]:
    """(pid, parent pid) of every pyspark Python worker daemon on the machine."""
    found = []
    for pid, args in command_lines().items():
        if "pyspark.daemon" in args:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            found.append((pid, int(stat[1])))
    return found
