"""`sessionize serve`: Dagster's own processes on Postgres, under a supervisor.

The deployment a Dagster engineer recognises, on one machine (docs/deployment.md):
- `postgres`, the local cluster (`postgres.py`), unless `DAGSTER_PG_URL` names another;
- `spark-server`, the warm Spark Connect server the runs share (`spark_server.py`), when the
  settings run Spark locally;
- `code-server`, `dagster code-server start`: the definitions, and the runs it launches;
- `webserver`, `dagster-webserver` (loopback by default), and `daemon`, `dagster-daemon run`,
  both reaching the code server through the deployment's `workspace.yaml`.

Everything lives in the deployment's folder (`SESSIONIZE_DEPLOY_DIR`): `supervisord.conf`, the
control socket, `logs/<program>.log`, Dagster's home with its `dagster.yaml` (the project's
instance settings, storage on Postgres), and the cluster. The Postgres URL reaches the
processes through their environment, never a file but the cluster's credentials.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from sessionize_assets.deployment.postgres import LocalPostgres
from sessionize_assets.deployment.supervisor import Program, supervisor_conf
from sessionize_assets.resources.spark import answers
from sessionize_assets.settings import DeploymentSettings, Settings
from sessionize_assets.spark_server import server_address, serves, shared_session_address
from sessionize_assets.workspace import CODE_LOCATION, DEFINITIONS_MODULE, grpc_workspace_yaml

# Dagster's storage, appended to the project's instance settings: the URL comes from the
# environment the supervisor gives every process.
POSTGRES_STORAGE_YAML = """
# Dagster's runs, events and schedules on Postgres (`sessionize serve`): the URL comes from the
# environment of each process (DAGSTER_PG_URL), never from this file.
storage:
  postgres:
    postgres_url:
      env: DAGSTER_PG_URL
"""
# How long a Dagster process waits for Postgres to accept connections before it starts.
POSTGRES_WAIT_SECONDS = 120.0
# Dagster's own setting, read on every event: a step's materializations of the partitions of
# one output (a range run reports one per date) are stored as one batch of at most this many,
# which dagster-postgres writes over one connection and in one index transaction, where it
# opens a connection for each event stored alone (docs/deployment.md, "What Postgres costs a
# batch"). Run creation's planned events are batched too, but dagster-postgres still stores
# those one by one. A value in the environment `sessionize serve` starts in wins.
EVENT_BATCH_SIZE = 1000


class DeploymentError(RuntimeError):
    """The deployment cannot be set up as its settings ask; the message says why."""


@dataclass(frozen=True, kw_only=True)
class Deployment:
    """A prepared deployment: the supervisor's config and the environment it runs in."""

    conf: Path
    environment: Mapping[str, str]
    programs: tuple[str, ...]


def prepare(
    *,
    settings: Settings,
    deployment: DeploymentSettings,
    instance_settings: Path,
    working_dir: Path,
    environ: Mapping[str, str],
) -> Deployment:
    """Write the deployment's files (making the Postgres cluster the first time), and return
    what `supervisord` is started with.

    `instance_settings` is the project's `dagster.yaml` (run queue, retries, monitoring): it
    holds no storage of its own. The relative paths of the settings resolve in `working_dir`,
    where every program starts.
    """
    folder = deployment.deploy_dir.absolute()
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    home = folder / "dagster_home"
    home.mkdir(exist_ok=True)
    instance = instance_settings.read_text()
    if re.search(r"^(storage|run_storage|event_log_storage|schedule_storage):", instance, re.M):
        raise DeploymentError(
            f"{instance_settings} names a storage of its own: `sessionize serve` puts Dagster's "
            "on Postgres (DAGSTER_PG_URL, or its own cluster)"
        )
    (home / "dagster.yaml").write_text(instance.rstrip("\n") + "\n" + POSTGRES_STORAGE_YAML)
    workspace = folder / "workspace.yaml"
    workspace.write_text(grpc_workspace_yaml("127.0.0.1", deployment.code_server_port))

    bin_dir = Path(sys.executable).parent
    sessionize = str(bin_dir / "sessionize")
    env = {"DAGSTER_EVENT_BATCH_SIZE": str(EVENT_BATCH_SIZE)} | dict(environ)
    env["DAGSTER_HOME"] = str(home)
    programs: list[Program] = []
    if deployment.postgres_url is None:
        cluster = LocalPostgres(folder / "postgres", port=deployment.postgres_port)
        env["DAGSTER_PG_URL"] = with_driver(cluster.ensure().url)
        programs.append(
            Program(
                name="postgres",
                command=cluster.server_command(),
                priority=10,
                # Postgres's fast shutdown: sessions rolled back, data flushed.
                stop_signal="INT",
                user=cluster.account,
                directory=cluster.folder,
            )
        )
    else:
        env["DAGSTER_PG_URL"] = with_driver(deployment.postgres_url)
    if serves(settings) is None:
        env["SESSIONIZE_SPARK_MASTER"] = shared_session_address(server_address(settings))
        programs.append(
            Program(name="spark-server", command=[sessionize, "spark-server"], priority=20)
        )
    after_postgres = [sessionize, "after-postgres", "--"]
    programs += [
        Program(
            name="code-server",
            command=[
                *after_postgres,
                str(bin_dir / "dagster"),
                "code-server",
                "start",
                "-m",
                DEFINITIONS_MODULE,
                "--location-name",
                CODE_LOCATION,
                "-h",
                "127.0.0.1",
                "-p",
                str(deployment.code_server_port),
            ],
            priority=30,
        ),
        Program(
            name="webserver",
            command=[
                *after_postgres,
                str(bin_dir / "dagster-webserver"),
                "-h",
                deployment.webserver_host,
                "-p",
                str(deployment.webserver_port),
                "-w",
                str(workspace),
            ],
            priority=40,
        ),
        Program(
            name="daemon",
            command=[*after_postgres, str(bin_dir / "dagster-daemon"), "run", "-w", str(workspace)],
            priority=40,
        ),
    ]
    conf = folder / "supervisord.conf"
    conf.write_text(
        supervisor_conf(programs=programs, folder=folder, working_dir=working_dir.absolute())
    )
    return Deployment(
        conf=conf, environment=env, programs=tuple(program.name for program in programs)
    )


def supervisord_command(deployment: Deployment) -> list[str]:
    """The supervisor in the foreground: Ctrl-C or SIGTERM stops every program, then itself."""
    from supervisor import supervisord

    return [sys.executable, "-m", supervisord.__name__, "-n", "-c", str(deployment.conf)]


def control(deployment: DeploymentSettings, arguments: Sequence[str]) -> int:
    """`supervisorctl` on the deployment's supervisor (`status`, `shutdown`, `restart NAME`)."""
    conf = deployment.deploy_dir.absolute() / "supervisord.conf"
    if not conf.is_file():
        raise DeploymentError(f"no deployment in {conf.parent}: start it with `sessionize serve`")
    from supervisor import supervisorctl

    command = [sys.executable, "-m", supervisorctl.__name__, "-c", str(conf), *arguments]
    return subprocess.run(command, check=False).returncode


def with_driver(url: str) -> str:
    """`url` naming psycopg2, the driver dagster-postgres installs, unless it names one:
    SQLAlchemy 2.1 reads a bare `postgresql://` as psycopg 3's."""
    scheme, separator, rest = url.partition("://")
    if scheme in ("postgresql", "postgres"):
        return f"postgresql+psycopg2{separator}{rest}"
    return url


def postgres_address(url: str) -> tuple[str, int] | None:
    """The TCP host and port of a `postgresql://` URL; None for a Unix socket's."""
    parsed = urlparse(url)
    if not parsed.hostname or parsed.hostname.startswith("/"):
        return None
    return parsed.hostname, parsed.port or 5432


def exec_after_postgres(command: Sequence[str], *, environ: Mapping[str, str]) -> None:
    """Wait until DAGSTER_PG_URL's server accepts connections, then become `command`.

    A Dagster process started while its storage is down exits at once; the supervisor would
    start it again, a second later each time, and give up after a few. Waiting here, a
    Postgres that is starting (the first start, or again after a crash) costs no restarts.
    """
    address = postgres_address(environ.get("DAGSTER_PG_URL", ""))
    deadline = time.monotonic() + POSTGRES_WAIT_SECONDS
    while address is not None and not answers(*address):
        if time.monotonic() > deadline:
            raise DeploymentError(
                f"Postgres at {address[0]}:{address[1]} did not accept connections within "
                f"{POSTGRES_WAIT_SECONDS:.0f} s"
            )
        time.sleep(0.2)
    os.execvpe(command[0], list(command), dict(environ))
