"""`dagster dev` in the background, driven over GraphQL: for the end-to-end test and scripts.

It runs the real webserver and daemon (sensors, automation, backfills, run queue) on loopback,
the same processes `make ui` starts, and stops them by PID.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from dagster import DagsterInstance

from sessionize_assets.deployment.postgres import LocalPostgres
from sessionize_assets.deployment.serve import with_driver
from sessionize_assets.spark_server import stop_process_group
from sessionize_assets.workspace import CODE_LOCATION, workspace_yaml

REPOSITORY = "__repository__"
# The project's instance settings (run queue, retries, monitoring), which `make ui` and
# `make serve` start from.
PROJECT_INSTANCE_SETTINGS = Path(__file__).resolve().parents[1] / "dagster.yaml"
T = TypeVar("T")


class DevServerError(RuntimeError):
    """dagster dev did not start, or a GraphQL call failed."""


def land_folder(source: Path, landing: Path) -> None:
    """Land the batch folder `source` in `landing` as a collector writes it: its files are
    copied aside, then moved in one by one (what the landing sensor sees under `dagster dev`)."""
    staging = landing.parent / f"incoming-{source.name}"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging)
    target = landing / source.name
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(staging.iterdir()):
        os.replace(path, target / path.name)
    staging.rmdir()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DagsterDev:
    """A `dagster dev` process tree on 127.0.0.1 with its own DAGSTER_HOME.

    `program="sessionize"` starts it as `make ui` does, through `sessionize dev`: its runs on a
    Spark Connect server started before it and stopped after it. Its output goes to
    `<workdir>/dagster_dev.log`, which the errors quote.
    """

    def __init__(
        self,
        *,
        workdir: Path,
        dagster_home: Path,
        env: Mapping[str, str],
        port: int = 0,
        program: str = "dagster",
    ) -> None:
        self.program = program
        self.workdir = workdir
        self.dagster_home = dagster_home
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "dagster_dev.log"
        self._env = {**os.environ, **env, "DAGSTER_HOME": str(dagster_home)}
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> DagsterDev:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop it for good (a deployment's folder goes too)."""
        self.stop()

    def start(self, *, timeout: float = 120.0) -> None:
        self.dagster_home.mkdir(parents=True, exist_ok=True)
        instance_yaml = self.dagster_home / "dagster.yaml"
        if not instance_yaml.exists():
            instance_yaml.write_text("telemetry:\n  enabled: false\n")
        with self.log_path.open("ab") as log:
            # A new session, so stop() can signal the whole tree (webserver, daemon, code server).
            self._process = subprocess.Popen(
                self._command(),
                cwd=self.workdir,
                env=self._env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.wait_for(self._daemons_healthy, timeout=timeout, what="webserver and daemons")

    def _command(self) -> list[str]:
        workspace = self.workdir / "workspace.yaml"
        workspace.write_text(workspace_yaml())
        program = Path(sys.executable).with_name(self.program)
        return [str(program), "dev", "-w", str(workspace), "-h", "127.0.0.1", "-p", str(self.port)]

    def stop(self, *, timeout: float = 30.0) -> None:
        if self._process is not None:
            stop_process_group(self._process, timeout=timeout)
        self._process = None

    @contextmanager
    def instance(self) -> Iterator[DagsterInstance]:
        """The Dagster instance the processes store their runs in, read from this process."""
        with DagsterInstance.from_config(str(self.dagster_home)) as instance:
            yield instance

    @property
    def session(self) -> int:
        """The session (and process group) of the tree: its first process's pid."""
        assert self._process is not None, "dagster dev is not started"
        return self._process.pid

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return "(no output)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def graphql(self, query: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": dict(variables or {})}).encode()
        request = urllib.request.Request(
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                payload = json.load(response)
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:2000]
            raise DevServerError(f"GraphQL HTTP {error.code}: {detail}") from error
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            # Not listening (a webserver killed and not yet started again), or not answering.
            raise DevServerError(f"GraphQL unreachable at {self.url}: {error}") from error
        if payload.get("errors"):
            raise DevServerError(f"GraphQL errors: {payload['errors']}")
        return payload["data"]

    def wait_for(
        self, probe: Callable[[], T | None], *, timeout: float, what: str, every: float = 2.0
    ) -> T:
        """Poll `probe` until it returns something truthy; fail with the server's log tail."""
        deadline = time.monotonic() + timeout
        while True:
            if self._process is not None and self._process.poll() is not None:
                raise DevServerError(
                    f"dagster dev exited while waiting for {what}:\n{self.log_tail()}"
                )
            result = probe()
            if result:
                return result
            if time.monotonic() > deadline:
                raise DevServerError(
                    f"timed out after {timeout:.0f}s waiting for {what}:\n{self.log_tail()}"
                )
            time.sleep(every)

    def _daemons_healthy(self) -> bool:
        try:
            data = self.graphql(
                "{ instance { daemonHealth { allDaemonStatuses { healthy required } } } }"
            )
        except (urllib.error.URLError, ConnectionError, TimeoutError, DevServerError):
            return False
        statuses = data["instance"]["daemonHealth"]["allDaemonStatuses"]
        return bool(statuses) and all(s["healthy"] for s in statuses if s["required"])

    # The calls the UI makes.

    def launch_job(self, job: str) -> str:
        """The Launchpad's Launch Run for an unpartitioned job; returns the run id."""
        data = self.graphql(
            """
            mutation Launch($params: ExecutionParams!) {
              launchPipelineExecution(executionParams: $params) {
                __typename
                ... on LaunchRunSuccess { run { runId } }
                ... on PythonError { message }
                ... on RunConfigValidationInvalid { errors { message } }
              }
            }
            """,
            {
                "params": {
                    "selector": {
                        "repositoryLocationName": CODE_LOCATION,
                        "repositoryName": REPOSITORY,
                        "pipelineName": job,
                    }
                }
            },
        )["launchPipelineExecution"]
        if data["__typename"] != "LaunchRunSuccess":
            raise DevServerError(f"launching {job} failed: {data}")
        return data["run"]["runId"]

    def launch_backfill(self, *, assets: list[str], partitions: list[str]) -> str:
        """The Materialize button with several partitions selected; returns the backfill id."""
        data = self.graphql(
            """
            mutation Backfill($params: LaunchBackfillParams!) {
              launchPartitionBackfill(backfillParams: $params) {
                __typename
                ... on LaunchBackfillSuccess { backfillId }
                ... on PythonError { message }
                ... on PartitionSetNotFoundError { message }
              }
            }
            """,
            {
                "params": {
                    "assetSelection": [{"path": [key]} for key in assets],
                    "partitionNames": partitions,
                    "fromFailure": False,
                }
            },
        )["launchPartitionBackfill"]
        if data["__typename"] != "LaunchBackfillSuccess":
            raise DevServerError(f"backfill of {assets} over {partitions} failed: {data}")
        return data["backfillId"]

    def backfill_status(self, backfill_id: str) -> str:
        data = self.graphql(
            """
            query Status($id: String!) {
              partitionBackfillOrError(backfillId: $id) {
                __typename
                ... on PartitionBackfill { status }
                ... on PythonError { message }
              }
            }
            """,
            {"id": backfill_id},
        )["partitionBackfillOrError"]
        if data["__typename"] != "PartitionBackfill":
            raise DevServerError(f"backfill {backfill_id}: {data}")
        return data["status"]

    def runs(self) -> list[dict[str, Any]]:
        """Every run with its status, job, tags and the partitions it targeted."""
        data = self.graphql(
            """
            {
              runsOrError {
                __typename
                ... on Runs {
                  results { runId status jobName tags { key value } assetSelection { path } }
                }
              }
            }
            """
        )["runsOrError"]
        return data["results"]

    def sensor_ticks(self, sensor: str, *, limit: int = 50) -> list[dict[str, Any]]:
        """The sensor's latest ticks, newest first: status, time, cursor, runs, skip reason."""
        data = self.graphql(
            """
            query Ticks($selector: SensorSelector!, $limit: Int) {
              sensorOrError(sensorSelector: $selector) {
                __typename
                ... on Sensor {
                  sensorState {
                    ticks(limit: $limit) { status timestamp cursor runIds skipReason }
                  }
                }
                ... on PythonError { message }
                ... on SensorNotFoundError { message }
              }
            }
            """,
            {
                "selector": {
                    "repositoryLocationName": CODE_LOCATION,
                    "repositoryName": REPOSITORY,
                    "sensorName": sensor,
                },
                "limit": limit,
            },
        )["sensorOrError"]
        if data["__typename"] != "Sensor":
            raise DevServerError(f"sensor {sensor}: {data}")
        return data["sensorState"]["ticks"]

    def unsynced(self) -> dict[str, dict[str | None, list[str]]]:
        """What the UI shows as unsynced ("Unsynced" on the asset and its partitions): per
        asset, each STALE partition (None for an unpartitioned asset) with its causes, as
        "<asset>[<partition>]: <reason>"."""
        causes = "key { path } partitionKey reason"
        fields = {
            True: f"partitionKeys staleStatusByPartition staleCausesByPartition {{ {causes} }}",
            False: f"staleStatus staleCauses {{ {causes} }}",
        }
        found: dict[str, dict[str | None, list[str]]] = {}
        for node in self.graphql("{ assetNodes { assetKey { path } isPartitioned } }")[
            "assetNodes"
        ]:
            partitioned = node["isPartitioned"]
            [status] = self.graphql(
                f"query($key: AssetKeyInput!) {{ assetNodes(assetKeys: [$key]) "
                f"{{ {fields[partitioned]} }} }}",
                {"key": node["assetKey"]},
            )["assetNodes"]
            if partitioned:
                rows: Iterable[tuple[Any, Any, Any]] = zip(
                    status["partitionKeys"],
                    status["staleStatusByPartition"],
                    status["staleCausesByPartition"],
                    strict=True,
                )
            else:
                rows = [(None, status["staleStatus"], status["staleCauses"])]
            stale = {
                key: [
                    f"{'/'.join(c['key']['path'])}[{c['partitionKey']}]: {c['reason']}"
                    for c in reasons
                ]
                for key, state, reasons in rows
                if state == "STALE"
            }
            if stale:
                found["/".join(node["assetKey"]["path"])] = stale
        return found

    def backfills(self) -> list[dict[str, Any]]:
        data = self.graphql(
            "{ partitionBackfillsOrError { ... on PartitionBackfills { results { id status } } } }"
        )["partitionBackfillsOrError"]
        return data["results"]

    def idle(self) -> bool:
        """No run queued or going and no backfill requested."""
        active = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"}
        return not any(r["status"] in active for r in self.runs()) and not any(
            b["status"] == "REQUESTED" for b in self.backfills()
        )


class ServedDeployment(DagsterDev):
    """`sessionize serve` (`make serve`) in the background: Postgres, the Spark Connect server,
    the code server, the webserver and the daemon under supervisord, driven over GraphQL as
    `DagsterDev` is.

    The deployment's folder is a new one in the system's temp (Postgres runs as its own account
    when the tests run as root, and must reach it: pytest's folders are private to their
    owner); `close()` removes it (`stop()` keeps it: a deployment started again finds its
    storage). `dagster_home` is the deployment's, on Postgres.
    """

    def __init__(self, *, workdir: Path, env: Mapping[str, str], port: int = 0) -> None:
        self.deploy_dir = Path(tempfile.mkdtemp(prefix="sessionize-deploy-"))
        self.deploy_dir.chmod(0o755)
        self.postgres_port = free_port()
        self.code_server_port = free_port()
        deployment = {
            "SESSIONIZE_DEPLOY_DIR": str(self.deploy_dir),
            "SESSIONIZE_CODE_SERVER_PORT": str(self.code_server_port),
            "SESSIONIZE_POSTGRES_PORT": str(self.postgres_port),
        }
        super().__init__(
            workdir=workdir,
            dagster_home=self.deploy_dir / "dagster_home",
            env={**env, **deployment},
            port=port,
            program="sessionize",
        )
        self._env["SESSIONIZE_WEBSERVER_PORT"] = str(self.port)
        self.log_path = workdir / "serve.log"

    def _command(self) -> list[str]:
        program = Path(sys.executable).with_name(self.program)
        return [str(program), "serve", "--instance", str(PROJECT_INSTANCE_SETTINGS)]

    def stop(self, *, timeout: float = 60.0) -> None:
        # supervisord stops its programs in turn on SIGTERM (the group's other processes are
        # theirs: the supervisor signals them itself).
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                stop_process_group(self._process, timeout=timeout)
        self._process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.deploy_dir, ignore_errors=True)

    def supervisorctl(self, *arguments: str) -> str:
        """`supervisorctl` on the deployment (`status`, `stop daemon`, `start daemon`)."""
        done = subprocess.run(
            [sys.executable, "-m", "supervisor.supervisorctl"]
            + ["-c", str(self.deploy_dir / "supervisord.conf"), *arguments],
            capture_output=True,
            text=True,
            check=False,
        )
        return done.stdout + done.stderr

    def program_pid(self, name: str) -> int | None:
        """The pid of the deployment's program `name` (`webserver`, `postgres`: the
        postmaster), as its supervisor knows it; None when it is not running."""
        answer = self.supervisorctl("pid", name).strip()
        return int(answer) if answer.isdigit() and int(answer) > 0 else None

    @property
    def postgres_url(self) -> str:
        """The deployment's Dagster storage, as its processes reach it (`DAGSTER_PG_URL`)."""
        cluster = LocalPostgres(self.deploy_dir / "postgres", port=self.postgres_port)
        return with_driver(cluster.ensure().url)

    @property
    def environment(self) -> dict[str, str]:
        """What a command given the deployment's instance runs with (`sessionize replay`)."""
        return {"DAGSTER_HOME": str(self.dagster_home), "DAGSTER_PG_URL": self.postgres_url}

    @contextmanager
    def instance(self) -> Iterator[DagsterInstance]:
        saved = os.environ.get("DAGSTER_PG_URL")
        os.environ["DAGSTER_PG_URL"] = self.postgres_url
        try:
            with DagsterInstance.from_config(str(self.dagster_home)) as instance:
                yield instance
        finally:
            if saved is None:
                os.environ.pop("DAGSTER_PG_URL", None)
            else:
                os.environ["DAGSTER_PG_URL"] = saved
