"""The supervisor's configuration: one program per process of the deployment.

`supervisord` (the `supervisor` package) starts the programs in priority order, restarts each
one that exits, writes each one's output to `<deploy>/logs/<name>.log`, and stops them all
with itself. Its control socket is a Unix socket in the deployment's folder, readable by this
account alone: `supervisorctl` (`sessionize serve --status`, `--stop`) talks to it there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# A program that exits within this many seconds of starting has failed to start, and is
# started again this many times (one second longer apart each time) before the supervisor gives
# up on it: enough to outlast a Postgres or a code server starting again after a kill.
START_SECONDS = 3
START_RETRIES = 20
# How long a program has to stop after its stop signal before it is killed.
STOP_WAIT_SECONDS = 30
LOG_BYTES = "50MB"
LOG_BACKUPS = 3


@dataclass(frozen=True, kw_only=True)
class Program:
    """One supervised process: its command, started after those of a lower priority."""

    name: str
    command: Sequence[str]
    priority: int
    stop_signal: str = "TERM"
    # The account it runs as (None: the supervisor's), and the folder it starts in (None: the
    # deployment's working folder, which another account may not be able to enter).
    user: str | None = None
    directory: Path | None = None


def supervisor_conf(*, programs: Sequence[Program], folder: Path, working_dir: Path) -> str:
    """supervisord.conf's text: the control socket, the logs and pid file in `folder`, each
    program started in `working_dir` (the relative paths of the settings resolve there) and
    restarted whenever it exits."""
    logs = folder / "logs"
    sections = [
        "[unix_http_server]",
        f"file={folder / 'supervisor.sock'}",
        "chmod=0700",
        "",
        "[supervisord]",
        f"logfile={logs / 'supervisord.log'}",
        f"pidfile={folder / 'supervisord.pid'}",
        f"childlogdir={logs}",
        "nodaemon=true",
        "",
        "[rpcinterface:supervisor]",
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        "",
        "[supervisorctl]",
        f"serverurl=unix://{folder / 'supervisor.sock'}",
        "",
    ]
    for program in programs:
        sections += [
            f"[program:{program.name}]",
            "command=" + " ".join(_quoted(part) for part in program.command),
            f"directory={program.directory or working_dir}",
            f"priority={program.priority}",
            "autostart=true",
            "autorestart=true",
            f"startsecs={START_SECONDS}",
            f"startretries={START_RETRIES}",
            f"stopsignal={program.stop_signal}",
            f"stopwaitsecs={STOP_WAIT_SECONDS}",
            # The whole process group: a Spark server's JVM, a code server's run workers.
            "stopasgroup=true",
            "killasgroup=true",
            "redirect_stderr=true",
            f"stdout_logfile={logs / f'{program.name}.log'}",
            f"stdout_logfile_maxbytes={LOG_BYTES}",
            f"stdout_logfile_backups={LOG_BACKUPS}",
            *([f"user={program.user}"] if program.user else []),
            "",
        ]
    return "\n".join(sections)


def _quoted(part: str) -> str:
    """A command word as supervisor's shell-like parser reads it back; `%` is its
    interpolation character."""
    escaped = part.replace("%", "%%")
    if not escaped or any(c in escaped for c in " \t\"'\\"):
        return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return escaped
