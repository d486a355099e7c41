"""Shared fixtures: one local Spark session for the whole run, tmp lake and landing folders."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sessionize_assets.checks import scope as check_scope
from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_assets.pipeline import (
    keyed_reads,
    sessions_additions,
    sessions_diff,
    sessions_events,
)
from sessionize_assets.pipeline import sessions as sessions_pipeline
from sessionize_assets.resources import spark as spark_resource_module
from sessionize_assets.resources.spark import (
    DEFAULT_CONF,
    DRIVER_OPTIONS,
    SparkResource,
    delta_jars,
    s3a_jars,
    spark_config,
)
from sessionize_assets.settings import Settings
from sessionize_tests.harness import Pipeline

TEST_START = date(2026, 1, 1)
# `make jars` puts them there: the tests' session loads them, for the delta-spark backend and
# a lake on S3 (test_object_storage.py).
DELTA_JARS_DIR = Path(__file__).resolve().parents[1] / "jars" / "delta"
S3A_JARS_DIR = DELTA_JARS_DIR.parent / "s3a"
# `make jvm-archive` (which `make test` runs first) writes it: every driver JVM the tests start,
# theirs and those of the `sessionize` and `dagster dev` runs, maps its classes from it.
JVM_CLASS_ARCHIVE = DELTA_JARS_DIR.parent / "spark-driver.jsa"
# The tests' data is a few hundred rows, and each test process lives a few minutes: compiling
# and scheduling are most of the work. Expressions are interpreted, not compiled to Java
# (Spark's own suites run both ways), and the driver JVM stops at the C1 compiler: C2 spends
# most of a core on code that never runs long. Adaptive execution is off: on a few hundred
# rows it only adds a planning round and a job per shuffle stage. The serial collector spares
# the other test process the concurrent GC threads. No Spark UI: the `sessionize` and `dagster
# dev` processes the tests start would each serve one nobody reads. Results depend on none of
# these; the Spark cluster test runs with the production Spark settings (its JVMs compile as
# these do) and compares with these.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
TEST_SPARK_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.ui.enabled": "false",
    DRIVER_OPTIONS: f"{DEFAULT_CONF[DRIVER_OPTIONS]} {TEST_JVM_OPTIONS}",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow modules first, each in its own order (a stable sort). `make test` hands its
    workers whole modules in this order (`--dist loadfile --no-loadscope-reorder`): the
    modules of several minutes start at once and the short ones fill in around them, instead
    of one worker running a long module alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def spark_resource() -> SparkResource:
    return SparkResource(
        spark_config=spark_config(
            master="local[2]",
            conf=TEST_SPARK_CONF,
            ui_enabled=False,
            jars=[*delta_jars(DELTA_JARS_DIR), *s3a_jars(S3A_JARS_DIR)],
            class_archive=JVM_CLASS_ARCHIVE,
        )
    )


@pytest.fixture(scope="session")
def spark(spark_resource: SparkResource) -> Iterator[SparkSession]:
    session = spark_resource.session()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def make_settings(root: Path, **overrides: Any) -> Settings:
    """Settings for a landing zone and lake under `root`, on the tests' small local Spark."""
    values: dict[str, Any] = {
        "landing_dir": root / "landing",
        "lake_dir": root / "lake",
        "start_date": TEST_START,
        "spark_master": "local[2]",
        "spark_conf": TEST_SPARK_CONF,
        "maintenance_cron": None,  # off in tests: maintenance runs when a test asks for it
        "delta_jars_dir": DELTA_JARS_DIR,
        "s3a_jars_dir": S3A_JARS_DIR,
        "jvm_class_archive": JVM_CLASS_ARCHIVE,
    }
    return Settings(**(values | overrides))


def settings_environment(settings: Settings) -> dict[str, str]:
    """The environment that gives a `sessionize` or `dagster dev` subprocess these settings."""
    return {
        "SESSIONIZE_LANDING_DIR": str(settings.landing_dir),
        "SESSIONIZE_LAKE_DIR": str(settings.lake_dir),
        "SESSIONIZE_START_DATE": settings.start_date.isoformat(),
        "SESSIONIZE_SPARK_MASTER": settings.spark_master,
        "SESSIONIZE_SPARK_CONF": ";".join(f"{k}={v}" for k, v in settings.spark_conf.items()),
        "SESSIONIZE_SPARK_SERVER_MASTER": settings.spark_server_master,
        "SESSIONIZE_SPARK_SERVER_PORT": str(settings.spark_server_port),
        "SESSIONIZE_SPARK_SERVER_UI_PORT": str(settings.spark_server_ui_port),
        "SESSIONIZE_LAKE_BACKEND": settings.lake_backend,
        "SESSIONIZE_DELTA_JARS_DIR": str(settings.delta_jars_dir),
        "SESSIONIZE_JVM_CLASS_ARCHIVE": str(settings.jvm_class_archive or "off"),
        "SESSIONIZE_MAINTENANCE_CRON": settings.maintenance_cron or "off",
        "SESSIONIZE_SENSOR_INTERVAL_SECONDS": str(settings.sensor_interval_seconds),
        "SESSIONIZE_RETRY_BACKOFF_SECONDS": str(settings.retry_backoff.total_seconds()),
    }


def run_command(
    command: Sequence[str], *, env: Mapping[str, str], cwd: Path | None = None, timeout: float
) -> str:
    """`command`'s output, run in a process of its own with `env` over this one's
    environment; it must succeed (the assertion shows the end of its output)."""
    done = subprocess.run(
        list(command),
        env={**os.environ, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def run_sessionize(
    *args: str, env: Mapping[str, str], cwd: Path | None = None, timeout: float
) -> str:
    """`sessionize ARGS` (this venv's command) through `run_command`."""
    sessionize = str(Path(sys.executable).with_name("sessionize"))
    return run_command([sessionize, *args], env=env, cwd=cwd, timeout=timeout)


PROJECT = Path(__file__).resolve().parents[1]


def killed_at_commit(
    settings: Settings,
    *,
    home: Path,
    at: int,
    when: str = "before",
    command: Sequence[str] = (),
    cwd: Path,
    timeout: float = 900,
) -> subprocess.CompletedProcess[str]:
    """`sessionize COMMAND` (`replay` by default) with these settings and Dagster home, under
    the fault injector (`fault_runner.py`), killed with SIGKILL `when` its `at`-th commit (0:
    not killed); in a process group of its own, which is gone when this returns (the crash is
    over: what an operator reruns after). A timeout kills the group and raises."""
    process = subprocess.Popen(
        [sys.executable, "-m", "sessionize_tests.fault_runner", str(at), when, *command],
        env={
            **os.environ,
            **settings_environment(settings),
            "DAGSTER_HOME": str(home),
            # The injector is a test module: importable from the project, not the package.
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")])
            ),
        },
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the JVM dies with it
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    wait_until_group_is_gone(process.pid)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def wait_until_group_is_gone(pgid: int, *, timeout: float = 60.0) -> None:
    """Until no live process of process group `pgid` is left: a crash is over then.

    SIGKILL reaches every member at once, but they die one by one; a process forked an
    instant before (a subprocess starting) still holds its parent's open files, the replay
    lock among them, until it is gone.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_live_member(stat, pgid) for stat in Path("/proc").glob("[0-9]*/stat")):
            return
        time.sleep(0.1)
    raise TimeoutError(f"process group {pgid} still has live processes after {timeout}s")


def _live_member(stat: Path, pgid: int) -> bool:
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):  # gone meanwhile
        return False
    state, group = fields[0], int(fields[2])
    return group == pgid and state not in ("Z", "X")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
def store(spark: SparkSession, settings: Settings) -> EmbeddedDeltaStore:
    return EmbeddedDeltaStore(spark=spark, lake=settings.lake_dir)


@pytest.fixture
def pipeline(request, spark, settings) -> Pipeline:
    """On the embedded store, or the one a test's parameter gives (`indirect`)."""
    return Pipeline(spark, settings, store=getattr(request, "param", EmbeddedDeltaStore))


@pytest.fixture
def additions_at_any_size(monkeypatch) -> None:
    """A sessions run updates the pairs it can from their old rows and added events whatever
    the events that saves reading (ADDITIONS_MIN_EVENTS_SKIPPED 0): the tests' lakes are far
    below the size where the path pays for its Spark job."""
    monkeypatch.setattr(sessions_additions, "ADDITIONS_MIN_EVENTS_SKIPPED", 0)


@pytest.fixture(params=["hash_set", "join"])
def pair_placement(request, monkeypatch, pipeline: Pipeline) -> str:
    """Up to PUSHED_KEYS_TOTAL keys or pairs are a hash-set filter in the queries, more are a
    join; a small change's keys are found on the driver, a large one's by Spark: the same
    rules in every placement, under the same tests ("join": PUSHED_KEYS_TOTAL 0 forces the
    joins, BROADCAST_KEYS 0 makes them sort-merge joins, `driver_write_bytes` 0 has Spark find
    the keys and write the rows, EVENTS_BUILT_ON_DRIVER 0 has Spark read the events and build the
    sessions, KEPT_IN_MEMORY_EVENTS below 0 keeps a sessions run's frames on disk,
    and SHUFFLE_PARTITION_ROWS of 500 gives its shuffles more partitions, as a large range's)."""
    if request.param == "join":
        for module in (sessions_events, sessions_diff, keyed_reads, check_scope):
            monkeypatch.setattr(module, "PUSHED_KEYS_TOTAL", 0)
        monkeypatch.setattr(keyed_reads, "BROADCAST_KEYS", 0)
        monkeypatch.setattr(sessions_pipeline, "KEPT_IN_MEMORY_EVENTS", -1)
        monkeypatch.setattr(sessions_events, "EVENTS_BUILT_ON_DRIVER", 0)
        monkeypatch.setattr(spark_resource_module, "SHUFFLE_PARTITION_ROWS", 500)
        pipeline.settings = replace(pipeline.settings, driver_write_bytes=0)
        pipeline.store = type(pipeline.store)(
            spark=pipeline.spark, lake=pipeline.settings.lake_dir, driver_write_bytes=0
        )
    return request.param
