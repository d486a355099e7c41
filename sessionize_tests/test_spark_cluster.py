"""The pipeline on a real Spark standalone cluster: a master and one worker on loopback.

Both are started from the installed pyspark's own launcher (`bin/spark-class`), and
`sessionize replay` runs in a subprocess with `SESSIONIZE_SPARK_MASTER=spark://127.0.0.1:PORT`
(one driver per process: this test process already holds a local session), on each storage
backend. Its tables must equal those of the same zone replayed in local mode.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pyspark
import pytest
from dagster import instance_for_test
from deltalake import DeltaTable

from sessionize_assets.generator import ZoneSpec, generate_landing_zone
from sessionize_assets.replay.command import replay
from sessionize_assets.resources.spark import DEFAULT_CONF, DRIVER_OPTIONS, EXECUTOR_OPTIONS
from sessionize_assets.settings import LAKE_BACKENDS
from sessionize_tests.conftest import (
    DELTA_JARS_DIR,
    TEST_JVM_OPTIONS,
    make_settings,
    run_sessionize,
)
from sessionize_tests.dev_server import free_port

# Minutes of end-to-end runs: started first (conftest.py).
pytestmark = pytest.mark.slow

START = date(2026, 1, 1)
SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
TABLES = {
    # table -> columns that are the same whichever run wrote them (no run ids, no clocks)
    "events": None,
    "rejected_events": None,
    "sessions": None,
    "session_quarantine": None,
    "user_lifecycle_state": None,
    "user_lifecycle_snapshot": None,
    "session_changes": ["change", "session_id", "session_date", "event_count"],
}


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(SPARK_CLASS), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={
                **os.environ,
                "SPARK_LOCAL_IP": "127.0.0.1",
                "SPARK_DAEMON_JAVA_OPTS": TEST_JVM_OPTIONS,
            },
        )


def _alive_workers(ui: str) -> int:
    try:
        with urllib.request.urlopen(f"{ui}/json/", timeout=5) as response:
            return int(json.load(response).get("aliveworkers", 0))
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("spark_cluster")
    port, ui_port = free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    processes = [
        _start(
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
            ],
            logs / "master.log",
        )
    ]
    try:
        processes.append(
            _start(
                [
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "2",
                    "--memory",
                    "2g",
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(logs / "work"),
                    master_url,
                ],
                logs / "worker.log",
            )
        )
        deadline = time.monotonic() + 120
        while _alive_workers(f"http://127.0.0.1:{ui_port}") < 1:
            if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                tails = {log.name: log.read_text()[-2000:] for log in logs.glob("*.log")}
                pytest.fail(f"the standalone cluster did not come up: {tails}")
            time.sleep(1)
        yield master_url
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)


def _rows(lake: Path, table: str, columns: list[str] | None) -> list[tuple]:
    data = DeltaTable(str(lake / table)).to_pyarrow_table(columns=columns)
    return sorted(tuple(row.values()) for row in data.to_pylist())


@pytest.fixture(scope="module")
def replayed_locally(tmp_path_factory) -> tuple[Path, Path]:
    """A zone, and its lake replayed in local mode (on the embedded backend)."""
    root = tmp_path_factory.mktemp("local_replay")
    zone = root / "zone"
    generate_landing_zone(
        ZoneSpec(out=zone, start=START, users=60, seed=3, late_share=0.2, bot_share=0.05), days=3
    )
    local = make_settings(root / "local", landing_dir=zone)
    with instance_for_test() as instance:
        assert replay(settings=local, instance=instance, echo=lambda _: None).ok
    return zone, local.lake_dir


@pytest.mark.parametrize("backend", LAKE_BACKENDS)
def test_replay_on_a_standalone_cluster_equals_local_mode(
    cluster, replayed_locally, tmp_path, spark, backend
):
    """On each storage backend: delta-spark's jars reach the executors through `spark.jars`."""
    zone, local_lake = replayed_locally
    on_cluster = make_settings(tmp_path / "cluster", landing_dir=zone)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path / "cluster" / "dagster_home"),
        "SESSIONIZE_LANDING_DIR": str(zone),
        "SESSIONIZE_LAKE_DIR": str(on_cluster.lake_dir),
        "SESSIONIZE_START_DATE": START.isoformat(),
        "SESSIONIZE_SPARK_MASTER": cluster,
        "SESSIONIZE_LAKE_BACKEND": backend,
        "SESSIONIZE_DELTA_JARS_DIR": str(DELTA_JARS_DIR),
        "SESSIONIZE_SPARK_CONF": ";".join(
            [
                "spark.ui.enabled=false",
                "spark.executor.memory=1g",
                # Its JVMs compile and collect as the tests' own (`TEST_JVM_OPTIONS`: the C1
                # compiler alone, the serial collector; so do the master's and the worker's);
                # Spark's settings stay production's (code generation on). No result depends
                # on the JIT's tier, and a replay of a few batches is too short for C2's
                # compilations to pay for the core they take: the module took 246 s with the
                # JVMs' defaults and 178 s with these, run alone (the delta-spark replay 111 s
                # -> 79 s, the embedded one 80 s -> 55 s).
                f"{DRIVER_OPTIONS}={DEFAULT_CONF[DRIVER_OPTIONS]} {TEST_JVM_OPTIONS}",
                f"{EXECUTOR_OPTIONS}={DEFAULT_CONF[EXECUTOR_OPTIONS]} {TEST_JVM_OPTIONS}",
                # One shuffle partition per core of the test's worker, as local mode runs on
                # its cores: the cluster default (8) runs each shuffle stage in four waves of
                # tiny tasks (run alone, the delta-spark replay took 169 s instead of 141 s;
                # in the full suite, beside the other worker, the difference is within noise).
                "spark.sql.shuffle.partitions=2",
                # And Delta Spark rebuilds a table's state from its log in 2 tasks, not 50, as
                # local mode does (`LOCAL_CONF`): the delta-spark replay took 193 s instead
                # of 256 s, its Delta jobs 36 s instead of 97 s (run alone, event log on).
                "spark.databricks.delta.snapshotPartitions=2",
                # The driver on loopback too, where the worker reaches it.
                "spark.driver.host=127.0.0.1",
                "spark.driver.bindAddress=127.0.0.1",
            ]
        ),
        "SPARK_LOCAL_IP": "127.0.0.1",
        # Executors start Python workers for the validation UDF: the interpreter of this venv.
        "PYSPARK_PYTHON": sys.executable,
    }
    output = run_sessionize("replay", env=env, timeout=900)
    assert f"Spark started ({cluster})" in output

    for table, columns in TABLES.items():
        expected = _rows(local_lake, table, columns)
        assert expected or table == "session_quarantine", f"{table} is empty"
        assert _rows(on_cluster.lake_dir, table, columns) == expected, table
