"""The processes of a `sessionize dev` tree (or of a `sessionize serve` deployment) the soak
kills besides run workers (which the fault points' hook names, `faults.py`): the daemon, the
Spark Connect server, the whole tree. Found from /proc (Linux), never by name alone: the soak's
server is the one listening on its own port, its daemon the one in its own session. A
deployment's programs are found by their supervisor (`ServedDeployment.program_pid`)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

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


def session_members(session: int) -> list[int]:
    """The live processes of `session` (a deployment's supervisor and every program it
    started: supervisord gives each program a process group, not a session, of its own)."""
    return [pid for pid in command_lines() if session_of(pid) == session and alive(pid)]


def alive(pid: int) -> bool:
    """Whether `pid` runs: not gone, and not a zombie its parent has yet to reap."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


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


def kill(pid: int | None) -> bool:
    """SIGKILL `pid`; whether there was one to kill."""
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True
