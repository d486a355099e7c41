"""The processes of a `sessionize dev` tree the soak kills: a run's worker, the daemon, the Spark
Connect server, the whole tree. Found from /proc (Linux) and the instance, never by name
alone: the soak's server is the one listening on its own port."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from dagster import DagsterEventType, DagsterInstance

from sessionize_assets.spark_server import GRPC_PORT, SERVER_CLASS


def command_lines() -> dict[int, str]:
    """Every process's command line, its arguments joined by spaces."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                raw = (entry / "cmdline").read_bytes()
            except OSError:  # gone meanwhile, or not ours to read
                continue
            found[int(entry.name)] = raw.replace(b"\0", b" ").decode(errors="replace")
    return found


def session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except ProcessLookupError:
        return None


def daemon_pid(session: int) -> int | None:
    """The `dagster-daemon run` process of the `dagster dev` started as session `session`."""
    for pid, line in command_lines().items():
        # Under `dagster dev`: `python -m dagster._daemon run`; alone: `dagster-daemon run`.
        daemon = "dagster._daemon run" in line or "dagster-daemon run" in line
        if daemon and session_of(pid) == session:
            return pid
    return None


def spark_server_pids(port: int) -> list[int]:
    """The JVMs of Spark Connect servers listening on `port` (one, when all is well)."""
    return [
        pid
        for pid, line in command_lines().items()
        if SERVER_CLASS in line and f"{GRPC_PORT}={port}" in line and "java" in line
    ]


def spark_server_pid(port: int) -> int | None:
    """The Spark Connect server's JVM listening on `port`."""
    return next(iter(spark_server_pids(port)), None)


def worker_pid(instance: DagsterInstance, run_id: str) -> int | None:
    """The pid that wrote the run's RUN_START: its worker (as `run_health` finds it)."""
    records = instance.get_records_for_run(
        run_id, of_type=DagsterEventType.RUN_START, limit=1
    ).records
    event = records[0].event_log_entry.dagster_event if records else None
    return event.pid if event is not None else None


def steps_going(instance: DagsterInstance, run_id: str) -> set[str]:
    """The steps of the run started and not yet ended."""
    going: set[str] = set()
    for record in instance.get_records_for_run(
        run_id,
        of_type={
            DagsterEventType.STEP_START,
            DagsterEventType.STEP_SUCCESS,
            DagsterEventType.STEP_FAILURE,
        },
    ).records:
        event = record.event_log_entry.dagster_event
        if event is None or event.step_key is None:
            continue
        if event.event_type == DagsterEventType.STEP_START:
            going.add(event.step_key)
        else:
            going.discard(event.step_key)
    return going


def kill(pid: int | None) -> bool:
    """SIGKILL `pid`; whether there was one to kill."""
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True
