"""The Spark session a run uses: local by default, a cluster or Spark Connect by one setting.

The resource is dagster-pyspark's `LazyPySparkResource`, so the session starts the first time a
step asks for it: a sensor, or a step that needs no Spark, starts no JVM. `spark_config` builds
its configuration from sessionize's settings; `SparkResource.session` adds the guarantees the
pipeline's correctness depends on.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from urllib.parse import urlparse

from dagster import InitResourceContext
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

APP_NAME = "sessionize"
# Correctness depends on these: event dates are UTC dates, and Delta readers expect
# microsecond Parquet timestamps (Spark's default INT96 is not what they read).
REQUIRED_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}
# The driver JVM's options: the time zone, the allocation retries (`JVM_OPTIONS`), and the
# class archive (`class_archive_options`).
DRIVER_OPTIONS = "spark.driver.extraJavaOptions"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
# The executors' JVM options (the same, less the archive).
EXECUTOR_OPTIONS = "spark.executor.extraJavaOptions"
# Whether PySpark records the Python call site of each column function (`DEFAULT_CONF`).
PYTHON_CALL_SITES = "spark.python.sql.dataFrameDebugging.enabled"
# Every Spark JVM's options. Event dates are UTC dates. Java 17's G1 fails an allocation with
# "Java heap space" after waiting twice for threads in JNI critical regions (Parquet's native
# compression codecs) to leave them, however much of the heap a collection would free
# (JDK-8192647, "Retried waiting for GCLocker too often"): the bench's full size died so with
# the default 1 GB driver holding about 520 MB live, in a task deserialising its 1.9 MB
# binary. Waiting up to 100 times turns that into a collection (the same range then passed;
# docs/benchmarks.md, "The full size"). Java 22 and later pin regions instead and no longer
# read the option: ignored there, not a failed start.
JVM_OPTIONS = (
    "-Duser.timezone=UTC -XX:+IgnoreUnrecognizedVMOptions"
    " -XX:+UnlockDiagnosticVMOptions -XX:GCLockerRetryAllocationCount=100"
)
# A window partition's rows held in a plain buffer before Spark moves it to a spillable one.
WINDOW_ROWS_IN_MEMORY = 131_072
DEFAULT_CONF = {
    DRIVER_OPTIONS: JVM_OPTIONS,
    EXECUTOR_OPTIONS: JVM_OPTIONS,
    # Daily partitions are small; 200 shuffle partitions would mostly schedule empty tasks.
    # In local mode: one per core (`local_cores`).
    SHUFFLE_PARTITIONS: "8",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
    # PySpark 4 tags every column function it calls with the Python call site, for the
    # "DataFrame query context" of an error: four round trips into the JVM and a walk of the
    # Python stack per call. `F.col("a") + F.lit(1)` took 27 round trips and 4.5 ms with it,
    # 7 and 2.5 ms without; the steps build their plans from thousands of such calls, run
    # after run. An error still names the failing expression and Spark's own context, and
    # the step's own message says which partitions it was on (docs/spark.md).
    PYTHON_CALL_SITES: "false",
    # Spark compiles each query's generated code, and keeps the classes by their source text;
    # its default of 100 holds less than one sessions run's ~150, so a run recompiled the
    # same code (about 10 ms a class) and a process running batch after batch recompiled
    # all of it. Compiled classes are small (metaspace, not heap).
    "spark.sql.codegen.cache.maxEntries": "1000",
    # The sessions' chains are a window over each user's events (every one of a user's dates
    # in a rebuild). Past this many rows a window partition moves from a plain buffer to a
    # spillable sorter, whose creation can fail outright when its task's sorts hold the
    # memory (`UNABLE_TO_ACQUIRE_MEMORY`): Spark's 4,096 failed a 30-day range at the bench's
    # full size, where the busiest users (bots) have about 4,400 events a month and 27,000 in
    # 181 days, with the default 1 GB driver. 131,072 rows of events are about 50 MB: a
    # partition that large still spills.
    "spark.sql.windowExec.buffer.in.memory.threshold": str(WINDOW_ROWS_IN_MEMORY),
    # Spark's catalog makes its warehouse folder, `./spark-warehouse` by default, in whatever
    # directory a process started in (Delta Spark's catalog on every session, Spark Connect's
    # server). sessionize's tables are paths, so it stays empty: in the system temp.
    "spark.sql.warehouse.dir": str(Path(tempfile.gettempdir()) / "sessionize-spark-warehouse"),
}
# Local mode only, where every job is scheduling overhead on the same few cores:
# - Reads name their files (from the Delta log), and Spark lists more than 32 paths with a
#   distributed job, one task per path: a few hundred tasks (seconds) to stat a few hundred
#   local files. On one machine the driver lists them itself.
# - Adaptive execution runs each shuffle stage of a query as a job of its own, to re-plan the
#   rest from its size: a daily batch went from about 55 Spark jobs to about 118 with it, for no
#   time saved (8 shuffle partitions leave it nothing to coalesce, and the joins that matter are
#   broadcast by hint). On a cluster Spark's default (on) stays, where skewed and mis-estimated
#   joins are worth the re-planning.
# - Delta Spark rebuilds a table's state from its log in 50 tasks (its default), a few times per
#   write: 2 took a rewrite of a small table from 3.8 s to 2.7 s (the delta-spark backend).
# - Per core (`spark_config`): the shuffle partitions (`local_cores`), and the tasks Delta
#   Spark's VACUUM lists a table's files with (Spark's parallel listing, 10,000 by default):
#   a store test that vacuums a table of three files took 51 s with 10,000 tasks, 14-16 s
#   with 2.
LOCAL_CONF = {
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
    "spark.sql.adaptive.enabled": "false",
    "spark.databricks.delta.snapshotPartitions": "2",
}


def local_cores(master: str) -> int:
    """The cores a local master runs tasks on: `local` 1, `local[N]` (or `local[N,F]`) N,
    `local[*]` the machine's.

    In local mode they are also its shuffle partitions: a shuffle stage of more partitions
    than cores runs them in waves, each task a fixed 5-20 ms of scheduling on a daily batch's
    few thousand rows. Eight partitions on 2 cores took a batch's Spark jobs from 4.5 s to
    7.4 s (`make bench-small`). A rebuild's large shuffles spill to disk rather than fail.
    """
    inside = master.partition("[")[2].rstrip("]").split(",")[0].strip()
    if not inside:
        return 1
    if inside == "*":
        return os.cpu_count() or 1
    return max(1, int(inside))


# Delta Lake's SQL and catalog support, with its jars on the classpath (`delta_jars`).
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
# What `make jars` fetches from Maven Central: the Delta release built for the installed Spark.
DELTA_JAR_PREFIXES = ("delta-spark_", "delta-storage-")


def delta_jars(folder: Path) -> list[Path]:
    """The Delta Lake jars in `folder` (`make jars` puts them in `jars/delta`).

    Raises `FileNotFoundError`, saying how to get them, when one is missing: a session started
    without them fails later, on its first Delta operation, with a class-not-found error.
    """
    found = _jars(folder, DELTA_JAR_PREFIXES, "the Delta Lake jars")
    return [j for j in found if j.name.startswith(DELTA_JAR_PREFIXES)]


# What `make jars` fetches into `jars/s3a`: Hadoop's S3 connector for the Hadoop of the
# installed Spark, and the AWS SDK modules it calls (not the SDK's 560 MB bundle).
S3A_JAR_PREFIXES = ("hadoop-aws-", "s3-", "sts-")


def s3a_jars(folder: Path) -> list[Path]:
    """Every jar in `folder` (`make jars` puts the S3 connector's in `jars/s3a`); raises
    `FileNotFoundError`, saying how to get them, when the connector is missing."""
    return _jars(folder, S3A_JAR_PREFIXES, "Hadoop's S3 connector")


def _jars(folder: Path, prefixes: tuple[str, ...], what: str) -> list[Path]:
    """The jars in `folder`, which must hold one named with each of `prefixes`."""
    found = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    missing = [p for p in prefixes if not any(j.name.startswith(p) for j in found)]
    if missing:
        raise FileNotFoundError(
            f"{what}: {', '.join(p.rstrip('_-') for p in missing)} missing from {folder}; "
            "`make jars` fetches them there with Maven"
        )
    return found


def s3a_conf(*, endpoint: str | None) -> dict[str, str]:
    """Spark's settings for a lake on S3: `s3://` is Hadoop's S3A connector too, and a custom
    `endpoint` (an S3-compatible store) is addressed by path. Credentials are not settings:
    the connector reads `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (or an instance role)
    itself, as delta-rs does, and a session's settings are shown in the UI."""
    conf = {"spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
    if endpoint:
        conf |= {
            "spark.hadoop.fs.s3a.endpoint": endpoint,
            "spark.hadoop.fs.s3a.path.style.access": "true",
        }
    return conf


def spark_config(
    *,
    master: str = "local[*]",
    conf: Mapping[str, str] | None = None,
    ui_enabled: bool = True,
    jars: Sequence[Path] = (),
    class_archive: Path | None = None,
) -> dict[str, str]:
    """The configuration a sessionize session starts with, for `SparkResource(spark_config=...)`.

    `master` is local[*], spark://host:7077, yarn, k8s://... or sc://host:15002 for Spark
    Connect (whose server has its own configuration: only the address is sent). Then come
    `DEFAULT_CONF`, `LOCAL_CONF` in local mode, `jars` on the classpath with `DELTA_CONF`, and
    last `conf`, which overrides any of them but `REQUIRED_CONF` (`SparkResource.session`
    refuses a session without those).

    `class_archive`, when the file exists, is added to the driver's JVM options, whatever
    `conf` sets them to (`class_archive_options`).
    """
    extra = dict(conf or {})
    if master.startswith("sc://"):
        return {"spark.remote": master}
    config = {
        "spark.master": master,
        "spark.app.name": APP_NAME,
        **REQUIRED_CONF,
        **DEFAULT_CONF,
        "spark.ui.enabled": str(ui_enabled).lower(),
    }
    if master.startswith("local"):
        cores = str(local_cores(master))
        config |= LOCAL_CONF | {
            SHUFFLE_PARTITIONS: cores,
            "spark.sql.sources.parallelPartitionDiscovery.parallelism": cores,
        }
    if jars:
        listed = [str(j.absolute()) for j in jars]
        config |= DELTA_CONF | {
            "spark.jars": ",".join(filter(None, [*listed, extra.pop("spark.jars", "")]))
        }
    config |= extra
    if class_archive is not None and class_archive.is_file():
        options = config.get(DRIVER_OPTIONS, "")
        config[DRIVER_OPTIONS] = f"{options} {class_archive_options(class_archive)}".strip()
    return config


def class_archive_options(archive: Path) -> str:
    """The JVM options that map the classes of `archive` (a CDS archive, `make jvm-archive`).

    A new driver JVM loads and verifies about 24,000 classes from the jars, 13 s of CPU in a
    one-batch replay: every run under `dagster dev` starts one. Mapped from the archive,
    those it holds are ready at once (7 s in that replay). `-Xshare:auto`: an archive of
    another JDK or class path is ignored with a warning, and the classes are loaded as without.
    """
    return f"-XX:SharedArchiveFile={archive.absolute()} -Xshare:auto"


# Spark Connect's port when an `sc://` address names none.
CONNECT_DEFAULT_PORT = 15002


class SparkServerUnavailable(RuntimeError):
    """No Spark Connect server answers at the address a run was given."""


def connect_address(remote: str) -> tuple[str, int]:
    """The host and port of an `sc://host[:port][/;param=value...]` address."""
    parsed = urlparse(remote)
    if parsed.scheme != "sc" or not parsed.hostname:
        raise ValueError(f"expected sc://host:port, got {remote!r}")
    return parsed.hostname, parsed.port or CONNECT_DEFAULT_PORT


def answers(host: str, port: int, *, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at `host:port`."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def is_connect(spark: SparkSession) -> bool:
    """Whether `spark` is a Spark Connect client (no JVM in this process) rather than a classic
    session. By its class's module: importing Connect's would load gRPC in every process."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


class SparkResource(LazyPySparkResource):
    """dagster-pyspark's lazily started session, with sessionize's required settings.

    Build it with `SparkResource(spark_config=spark_config(...))`. Its one field,
    `spark_config`, is what the Dagster UI shows and a run's config may change.
    """

    def session(self) -> SparkSession:
        """The process's session (started on first use), in UTC with microsecond timestamps.

        Raises `ValueError` when `spark_config` sets a `REQUIRED_CONF` key to another value,
        and `SparkServerUnavailable` when it names a Spark Connect server that does not answer
        (Connect's client would retry for minutes, then fail with a gRPC error).
        """
        clash = {
            k: v
            for k, v in self.spark_config.items()
            if k in REQUIRED_CONF and v != REQUIRED_CONF[k]
        }
        if clash:
            raise ValueError(f"sessionize needs {REQUIRED_CONF}; spark_config overrides {clash}")
        remote = self.spark_config.get("spark.remote")
        started = self._spark_session is not None
        if remote and not started and not answers(*connect_address(str(remote))):
            raise SparkServerUnavailable(
                f"no Spark Connect server answers at {remote} (SESSIONIZE_SPARK_MASTER): "
                "start one with `sessionize spark-server` (`make ui` and `sessionize dev` start "
                "one), or set SESSIONIZE_SPARK_MASTER=local[*] for a session of the run's own"
            )
        if str(self.spark_config.get("spark.master", "")).startswith("local"):
            # Local Python workers must import this package: use the driver's interpreter
            # (PySpark reads the variable, not spark.pyspark.python, when it starts them).
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        spark: SparkSession = self.spark_session
        # getOrCreate may hand back an existing session: enforce the runtime settings anyway.
        for key, value in REQUIRED_CONF.items():
            spark.conf.set(key, value)
        _set_hadoop_conf(spark, self.spark_config)
        return spark

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        """Release a Spark Connect session of the run's own at the run's end: the server would
        keep it until an hour's idle timeout. A session the address names (`;session_id=`,
        `spark_server.shared_session_address`) is shared by the runs and stays; a local
        session is the process's, and the next run in it (a replay's) uses it again."""
        started = self._spark_session
        remote = str(self.spark_config.get("spark.remote", ""))
        if started is not None and is_connect(started) and ";session_id=" not in remote:
            started.stop()


def _set_hadoop_conf(spark: SparkSession, config: Mapping[str, object]) -> None:
    """Hand `spark.hadoop.*` settings to a running session's Hadoop configuration (a session
    of the process started before, as a test's or a notebook's): Spark copies them there only
    when the session starts, and the file systems (S3's connector) read them from there. A
    Spark Connect server has its own."""
    hadoop = {k.removeprefix(_HADOOP): str(v) for k, v in config.items() if k.startswith(_HADOOP)}
    if not hadoop or "spark.remote" in config:
        return
    configuration = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in hadoop.items():
        configuration.set(key, value)


_HADOOP = "spark.hadoop."


# A large run's shuffles hold about this many rows a partition. In local mode a shuffle has
# one partition per core (LOCAL_CONF), right for a daily batch's few hundred thousand rows,
# but a range of months then sorts millions of wide rows a task: the bench's full size, with
# the default 1 GB driver, failed a 180-date sessions run at `4bf1600` merging the spills of
# its 5 M events a task (heap space, in Spark's spill readers).
SHUFFLE_PARTITION_ROWS = 250_000


@contextmanager
def shuffle_partitions_for(spark: SparkSession, *, rows: int) -> Iterator[int]:
    """Within the block, Spark's shuffles have enough partitions for `rows` (about
    SHUFFLE_PARTITION_ROWS each), never fewer than the session's setting, which is restored
    after. Yields the partitions used. Spark reads the setting when it plans an action, so
    the block must hold the actions (and first uses of persisted frames) it is for."""
    current = int(spark.conf.get(SHUFFLE_PARTITIONS) or 0)
    wanted = max(current, -(-rows // SHUFFLE_PARTITION_ROWS))
    if wanted == current:
        yield current
        return
    spark.conf.set(SHUFFLE_PARTITIONS, str(wanted))
    try:
        yield wanted
    finally:
        spark.conf.set(SHUFFLE_PARTITIONS, str(current))


@contextmanager
def counting_jobs(spark: SparkSession, label: str) -> Iterator[Callable[[], int | None]]:
    """Tag the Spark jobs this thread starts inside the block with a job group of their own,
    and yield a function that counts them (what a run reports as `spark_jobs`).

    A job is every action: on small data each costs a fixed scheduling overhead, so their
    number is the first figure of a run's cost. The thread's previous job group is restored on
    exit.

    On Spark Connect the client has no SparkContext: the block's operations carry a tag of
    their own instead (the server tags their jobs with it), and the count is that of the
    server's jobs with the tag, from its Spark UI's status API (`tagged_jobs`).
    """
    if is_connect(spark):
        tag = f"{label}-{uuid.uuid4().hex}"
        spark.addTag(tag)
        try:
            yield lambda: tagged_jobs(spark, tag)
        finally:
            spark.removeTag(tag)
        return
    context = spark.sparkContext
    keys = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
    previous = {key: context.getLocalProperty(key) for key in keys}
    group = f"{label}-{uuid.uuid4().hex}"
    context.setJobGroup(group, label)
    try:
        yield lambda: len(context.statusTracker().getJobIdsForGroup(group))
    finally:
        for key, value in previous.items():
            # None (a property that was not set) unsets it; pyspark types the value as str.
            context.setLocalProperty(key, value)  # type: ignore[arg-type]


@contextmanager
def counting_jobs_on_demand(
    start: Callable[[], SparkSession], label: str
) -> Iterator[tuple[Callable[[], SparkSession], Callable[[], int | None]]]:
    """`counting_jobs` for a block that may need no Spark at all: yields a function that gives
    the session, started by `start` on its first call and counted from then on, and the count
    (0 when the block never asked for the session).

    On Spark Connect a run's first use of the session costs a few tenths of a second (the
    client's modules, its first calls); a run that does its work with Arrow skips it."""
    with ExitStack() as block:
        started: list[tuple[SparkSession, Callable[[], int | None]]] = []

        def session() -> SparkSession:
            if not started:
                spark = start()
                started.append((spark, block.enter_context(counting_jobs(spark, label))))
            return started[0][0]

        yield session, lambda: started[0][1]() if started else 0


# How long a run waits for the server's status API before it reports no job count.
STATUS_API_TIMEOUT_SECONDS = 10.0
# What precedes a client's tag in the tags a Connect server gives its jobs
# (`SparkConnect_SessionTag_User_<user>_Session_<id>_Tag_<tag>`).
SERVER_TAG_MARK = "_Tag_"


def tagged_jobs(spark: SparkSession, tag: str) -> int | None:
    """The jobs a Spark Connect server ran for operations tagged `tag` (`SparkSession.addTag`),
    from its Spark UI's REST status API (`/api/v1/applications/<id>/jobs`), which lists a job's
    tags: the server names a client's tag `..._Tag_<tag>`.

    None when the server has no UI (`spark.ui.enabled=false`) or it does not answer: a count
    is a report, never a reason to fail a run. Jobs the UI no longer retains
    (`spark.ui.retainedJobs`, 1,000) are not counted.
    """
    try:
        conf = spark.conf
        if conf.get("spark.ui.enabled", "true") == "false":
            return None
        url = (
            f"http://{conf.get('spark.driver.host')}:{conf.get('spark.ui.port', '4040')}"
            f"/api/v1/applications/{conf.get('spark.app.id')}/jobs"
        )
        with urllib.request.urlopen(url, timeout=STATUS_API_TIMEOUT_SECONDS) as response:
            jobs = json.load(response)
    except (OSError, ValueError):
        return None
    suffix = f"{SERVER_TAG_MARK}{tag}"
    return sum(any(t.endswith(suffix) for t in job.get("jobTags", ())) for job in jobs)
