"""The warm Spark that the daemon's runs share: a Spark Connect server from the installed pyspark.

Under `dagster dev` every run is a process of its own. With a local master each run started a
JVM, loaded the jars and compiled Spark's generated code, then threw all of it away at its end:
a batch is four runs, and they cost 4-17 times the same batch in one process
(`docs/spark-server.md`).
The server is that JVM, started once and kept warm: `sessionize dev` (what `make ui` runs)
starts it with the webserver and daemon and stops it with them, and `sessionize spark-server`
runs it alone, beside a deployed daemon. The runs reach it by
`SESSIONIZE_SPARK_MASTER=sc://host:port` (`resources/spark.py`).

pyspark ships the server (`jars/spark-connect_2.13-*.jar`); it starts with the settings a local
session of the project starts with (`spark_config`), its Python workers on this interpreter
(they import sessionize: the install's, as it was when the server started). It listens on
loopback unless `SESSIONIZE_SPARK_SERVER_HOST` says otherwise: a Connect server runs what any
client sends it, with no authentication of its own.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pyspark

from sessionize_assets.resources.spark import answers, connect_address, spark_config
from sessionize_assets.settings import Settings

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# The server JVM starts, loads Spark and binds its port in about 5-10 s on 2 cores.
START_TIMEOUT_SECONDS = 180.0
STOP_TIMEOUT_SECONDS = 30.0
# How often `sessionize dev` looks whether its server is still running.
KEEP_UP_POLL_SECONDS = 1.0
# The server's own settings: where it listens and how much heap its driver has. Not sent by a
# client (a Connect client cannot change them).
GRPC_HOST = "spark.connect.grpc.binding.address"
GRPC_PORT = "spark.connect.grpc.binding.port"
# How long the runs' shared session may stay idle: longer than any server lives.
SHARED_SESSION_TIMEOUT = "3650d"


class SparkServerError(RuntimeError):
    """The Spark Connect server did not start, or its port is taken."""


def connect_jar() -> Path:
    """The Spark Connect server jar that pyspark ships (`spark-connect_2.13-<version>.jar`)."""
    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("spark-connect_*.jar"))
    if not jars:
        raise SparkServerError(
            f"no spark-connect_*.jar in {Path(pyspark.__file__).parent / 'jars'}: "
            "this pyspark does not ship Spark Connect's server"
        )
    return jars[-1]


def server_address(settings: Settings) -> str:
    """The `sc://host:port` the server of `settings` listens at."""
    return f"sc://{_reachable(settings.spark_server_host)}:{settings.spark_server_port}"


def shared_session_address(address: str) -> str:
    """`address` naming a new server session that every run shares (`;session_id=<uuid>`).

    A Connect server isolates each client session's Python workers: a run of its own session
    would start a Python daemon for its first Python function (ingest's parser) and import
    sessionize in it, about 1.3 s a run, and the server keeps each of those daemons until it
    stops. Sharing one session, the runs use the same warm workers. A session's state is its
    settings (the same for every run: `REQUIRED_CONF`) and its cached frames, which each run
    releases; the lake's pool has the runs write one at a time.
    """
    return f"{address}/;session_id={uuid.uuid4()}"


def _reachable(host: str) -> str:
    """The address this machine reaches a server listening on `host` at."""
    return "127.0.0.1" if host in {"0.0.0.0", "::", ""} else host


def serves(settings: Settings) -> str | None:
    """None when the runs of `settings` can use a local server; else why not.

    - `SESSIONIZE_SPARK_MASTER` set to other than a local master: the runs use that Spark.
    - The delta-spark backend: its operations go through Delta's Python API, which needs a
      Delta Connect server plugin over Spark Connect; none is published for Delta 4.0 on
      Maven Central (`io.delta:delta-connect-server_2.13` answers 404 for 4.0.0 and 4.0.1),
      so its runs keep a session of their own.
    """
    if not settings.spark_master.startswith("local"):
        return f"SESSIONIZE_SPARK_MASTER is {settings.spark_master}: the runs use it"
    if settings.lake_backend == "delta-spark":
        return (
            "the delta-spark backend needs a Delta Connect server, which Delta 4.0 does not "
            "publish: each run starts its own local session"
        )
    return None


def server_conf(settings: Settings) -> dict[str, str]:
    """The server's Spark settings: a local session's (`spark_config` with `spark_server_master`
    and the user's `SESSIONIZE_SPARK_CONF`), where it listens, its heap, and its Spark UI (the
    runs count their Spark jobs from the UI's status API, `resources/spark.tagged_jobs`)."""
    conf = spark_config(master=settings.spark_server_master, conf=settings.spark_conf)
    if settings.spark_server_master.startswith("local"):
        # Its UI on the interface it listens on (the runs ask the UI's status API for their job
        # counts); a cluster's executors reach the driver as SESSIONIZE_SPARK_CONF says.
        conf |= {
            "spark.driver.host": _reachable(settings.spark_server_host),
            "spark.driver.bindAddress": settings.spark_server_host,
        }
    return conf | {
        # On whatever SESSIONIZE_SPARK_CONF says: the runs count their jobs from it.
        "spark.ui.enabled": "true",
        # The runs' shared session lives as long as the server (an hour idle would end it).
        "spark.connect.session.manager.defaultSessionTimeout": SHARED_SESSION_TIMEOUT,
        GRPC_HOST: settings.spark_server_host,
        GRPC_PORT: str(settings.spark_server_port),
        "spark.driver.memory": settings.spark_server_memory,
        "spark.ui.port": str(settings.spark_server_ui_port),
    }


def server_command(settings: Settings) -> list[str]:
    """`spark-submit` of the server class with `server_conf`, from the installed pyspark."""
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    command = [str(spark_submit), "--class", SERVER_CLASS, "--name", "sessionize-spark-server"]
    for key, value in server_conf(settings).items():
        if key == "spark.app.name":
            continue
        command += ["--conf", f"{key}={value}"]
    return [*command, str(connect_jar())]


def server_environment(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The server's environment: its Python workers run this interpreter, which has sessionize
    (the user functions a run sends import it).

    A local server's Spark UI listens where the server does: Spark's web UI binds to
    `SPARK_LOCAL_IP`, or to every interface without it (`spark.driver.bindAddress` does not
    reach it), and it has no authentication either."""
    env = dict(os.environ if environ is None else environ)
    env["PYSPARK_PYTHON"] = sys.executable
    env.pop("SPARK_HOME", None)  # the installed pyspark's, which spark-submit finds itself
    if settings.spark_server_master.startswith("local"):
        env["SPARK_LOCAL_IP"] = settings.spark_server_host
    return env


@contextmanager
def running_server(settings: Settings, *, log_path: Path | None) -> Iterator[str]:
    """Start the server, wait until it answers, yield the address of the session the runs
    share (`shared_session_address`); keep it up meanwhile; stop it on exit.

    Kept up: a server that exits (killed, out of memory) is started again on the same port
    within a second or two of it, and says so in its output. The runs it was serving fail,
    and run retries and the sensors take them up again (`docs/orchestration.md`); without it
    every run after would fail until a person restarted `sessionize dev`.

    Its output goes to `log_path` (which an error quotes), or to this process's. It is stopped
    with this process even when this one is killed (Linux: the parent-death signal).

    Raises `SparkServerError` when its port is already taken (a server started before, or
    another program: this one would not be the one the runs reach) or when it does not answer
    within START_TIMEOUT_SECONDS.
    """
    address = server_address(settings)
    host, port = connect_address(address)
    if answers(host, port):
        raise SparkServerError(
            f"{host}:{port} is already taken: stop what listens there, or set "
            "SESSIONIZE_SPARK_SERVER_PORT to a free port"
        )
    server = _ServerProcess(settings, log_path=log_path)
    stopping = threading.Event()
    keeper = threading.Thread(target=server.keep_up, args=(stopping,), daemon=True)
    try:
        server.start()
        keeper.start()
        yield shared_session_address(address)
    finally:
        stopping.set()
        if keeper.is_alive():
            keeper.join()
        server.stop()


class _ServerProcess:
    """The server's process: started (and started again) with the same command and port."""

    def __init__(self, settings: Settings, *, log_path: Path | None) -> None:
        self._settings = settings
        self._log_path = log_path
        self._host, self._port = connect_address(server_address(settings))
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with ExitStack() as files:
            log = None
            if self._log_path is not None:
                self._log_path.parent.mkdir(parents=True, exist_ok=True)
                log = files.enter_context(self._log_path.open("ab"))
            # Its own process group (spark-submit execs the JVM, which starts the Python
            # workers): the terminal's Ctrl-C reaches this process, which stops the server last.
            self._process = subprocess.Popen(
                server_command(self._settings),
                env=server_environment(self._settings),
                stdout=log,
                stderr=subprocess.STDOUT if log else None,
                start_new_session=True,
                preexec_fn=_stop_with_parent,
            )
        _wait_until_answering(self._process, self._host, self._port, self._log_path)

    def keep_up(self, stopping: threading.Event) -> None:
        """Until `stopping` is set: start the server again whenever it has exited."""
        while not stopping.wait(KEEP_UP_POLL_SECONDS):
            process = self._process
            if process is None or process.poll() is None:
                continue
            self._say(f"the Spark Connect server exited with {process.returncode}: starting it")
            try:
                self.start()
            except SparkServerError as error:  # tried again at the next poll
                self._say(f"the Spark Connect server did not start again: {error}")
            else:
                self._say(f"the Spark Connect server is up again on {self._host}:{self._port}")

    def stop(self) -> None:
        if self._process is not None:
            stop_process_group(self._process, timeout=STOP_TIMEOUT_SECONDS)

    def _say(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)


def _stop_with_parent() -> None:
    """In the child before it runs the server: SIGTERM it when its parent dies (Linux), so a
    killed `sessionize dev` leaves no server holding the port."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


def _wait_until_answering(
    process: subprocess.Popen[bytes], host: str, port: int, log_path: Path | None
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not answers(host, port, timeout=0.5):
        if process.poll() is not None:
            raise SparkServerError(
                f"the Spark Connect server exited with {process.returncode}:\n{_tail(log_path)}"
            )
        if time.monotonic() > deadline:
            raise SparkServerError(
                f"the Spark Connect server did not answer at {host}:{port} within "
                f"{START_TIMEOUT_SECONDS:.0f} s:\n{_tail(log_path)}"
            )
        time.sleep(0.25)


def stop_process_group(process: subprocess.Popen[bytes], *, timeout: float) -> None:
    """SIGTERM the process group `process` leads (started with `start_new_session`), and
    SIGKILL it if it has not ended within `timeout` seconds."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def _tail(path: Path | None, lines: int = 30) -> str:
    if path is None or not path.exists():
        return "(no output)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
