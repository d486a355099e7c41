"""Small-batch benchmark: what a daily batch of a few thousand lines costs, against a bare
PySpark script that recomputes the whole history, and where the batch's time goes.

It generates a landing zone (8 days x 250 users by default, about 1,000 lines a day with late
events spread over earlier days), replays it batch by batch exactly as `sessionize replay`
does (production Spark settings, in one process), and reports:

- the median batch after the first (the first pays the JVM's warm-up);
- a bare PySpark full recompute of the whole zone in the same, warm session: it reads every
  JSON line (gzip too), keeps the valid ones, one copy per messageId (the earliest received),
  sessionizes with window functions and writes Parquet by session date (median of 3);
- the erasure of one signed-in person (SPEC §8: `sessionize forget`, their stitched devices
  with them) on the lake the replay left, against the median batch: seconds, runs and Spark
  jobs;
- their ratio, and the batch's time by phase (median over the batches after the first):
  Spark jobs (from Spark's event log), the driver's other calls into Spark's JVM (plan
  analysis, py4j round trips), delta-rs (log loads and commits), Dagster storing its events,
  Dagster creating its runs, and what is left (Dagster's run and step machinery, Python).
  Parsing the batch's lines in Python happens on the driver (in what is left), or inside
  ingest's Spark job for a batch of more text than `driver_write_bytes`; it is measured on
  its own, on the driver.

With `--storage sqlite,postgres` the zone is replayed twice in the same process, with Dagster's
storage in SQLite files (`make ui`) and then on a Postgres cluster of the bench's own (as
`sessionize serve` runs), each into a lake of its own; the columns sit side by side. The second
replay runs in a warmer JVM: run it in both orders to see how much that is.

Everything comes from one run and is printed; nothing is asserted.

    make bench-small                      # the default zone
    make bench-small BENCH_SMALL_ARGS="--users 500 --days 10"
    make bench-small BENCH_SMALL_ARGS="--backend delta-spark"
    make bench-small BENCH_SMALL_ARGS="--storage sqlite,postgres"
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sqlalchemy
from bench_floors import bare_recompute
from bench_printing import quiet, table
from dagster import DagsterInstance
from pyspark.sql import SparkSession

from sessionize_assets.deployment.postgres import LocalPostgres
from sessionize_assets.deployment.serve import with_driver
from sessionize_assets.generator import ZoneSpec, generate_landing_zone
from sessionize_assets.replay.command import replay
from sessionize_assets.settings import LAKE_BACKENDS, Settings
from sessionize_assets.transforms.validation import parse_line
from sessionize_tests.dev_server import free_port

START = date(2026, 1, 1)
PHASES = (
    "spark jobs",
    "other JVM calls",
    "delta-rs",
    "Dagster events",
    "Dagster run creation",
    "rest (Dagster, Python)",
)
COUNTS = ("Spark jobs", "py4j round trips", "Dagster events stored", "runs made")
# Dagster's storage: its own SQLite files (`make ui`) or Postgres (`sessionize serve`).
STORAGES = ("sqlite", "postgres")


class Meter:
    """Time and calls spent in the functions it wraps, by phase; read at batch boundaries.

    Only the calls of the thread that made the meter (the replay's) count: py4j's finalizer
    thread releases the driver's dead JVM objects on a connection of its own, about 3,000
    calls a batch that overlap the batch's time instead of adding to it.
    """

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._inside = False
        self._thread = threading.get_ident()

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            # A call made from inside another wrapped call, or on another thread.
            if self._inside or threading.get_ident() != self._thread:
                return original(*args, **kwargs)
            self._inside = True
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                # A Counter of seconds: floats, where typeshed's counts are ints.
                self.seconds[phase] += time.perf_counter() - started  # type: ignore[assignment]
                self.calls[phase] += 1
                self._inside = False

        setattr(owner, name, timed)

    def snapshot(self) -> tuple[Counter[str], Counter[str]]:
        return Counter(self.seconds), Counter(self.calls)


def install_meter() -> Meter:
    """Wrap py4j's round trip, delta-rs's table and transaction calls, Dagster's event store
    and its run creation: each call is timed once (not again inside another wrapped call)."""
    import deltalake
    import py4j.clientserver

    meter = Meter()
    meter.wrap(py4j.clientserver.ClientServerConnection, "send_command", "jvm")
    for name, member in vars(deltalake.DeltaTable).items():
        if callable(member) and not name.startswith("__"):
            meter.wrap(deltalake.DeltaTable, name, "delta-rs")
    meter.wrap(deltalake.DeltaTable, "__init__", "delta-rs")
    meter.wrap(DagsterInstance, "handle_new_event", "Dagster events")
    # A run of `execute_in_process` is made by the first; the second is the general one.
    meter.wrap(DagsterInstance, "create_run_for_job", "Dagster run creation")
    meter.wrap(DagsterInstance, "create_run", "Dagster run creation")
    return meter


def spark_job_seconds(event_log: Path, windows: list[tuple[float, float]]) -> list[list[float]]:
    """Per time window (epoch seconds), the durations of the Spark jobs submitted in it."""
    starts: dict[int, float] = {}
    jobs: list[tuple[float, float]] = []
    for file in sorted(event_log.rglob("*")):
        if not file.is_file() or file.name.startswith("."):
            continue
        for line in file.read_text(errors="replace").splitlines():
            event = json.loads(line)
            kind = event.get("Event")
            if kind == "SparkListenerJobStart":
                starts[event["Job ID"]] = event["Submission Time"] / 1000
            elif kind == "SparkListenerJobEnd" and event["Job ID"] in starts:
                begun = starts[event["Job ID"]]
                jobs.append((begun, event["Completion Time"] / 1000 - begun))
    return [[d for s, d in jobs if first <= s < last] for first, last in windows]


def parse_seconds(landing: Path, day: date, settings: Settings) -> float:
    """Parsing one batch's lines with ingest's own Python function, on the driver."""
    import gzip

    folder = landing / f"received_date={day.isoformat()}"
    lines: list[str] = []
    for file in sorted(folder.iterdir()):
        data = file.read_bytes()
        if file.suffix == ".gz":
            data = gzip.decompress(data)
        lines.extend(data.decode("utf-8", errors="replace").splitlines())
    started = time.perf_counter()
    for line in lines:
        parse_line(line, start_date=settings.start_date, future_tolerance=settings.future_tolerance)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=250)
    parser.add_argument("--days", type=int, default=8)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--workdir", type=Path, help="keep the zone, lake and logs here")
    parser.add_argument("--landing", type=Path, help="replay this zone instead of generating one")
    parser.add_argument(
        "--backend", default="embedded", choices=LAKE_BACKENDS, help="the lake's backend"
    )
    parser.add_argument(
        "--storage",
        default="sqlite",
        help="Dagster's storage: sqlite, postgres (a local cluster of the bench's own), or both "
        "comma-separated: the zone replayed once on each, in that order, in one process",
    )
    parser.add_argument(
        "--conf", action="append", default=[], help="a Spark setting KEY=VALUE (repeatable)"
    )
    args = parser.parse_args()
    storages = [name.strip() for name in args.storage.split(",") if name.strip()]
    if not storages or not set(storages) <= set(STORAGES) or len(set(storages)) < len(storages):
        parser.error(f"--storage: one or more of {', '.join(STORAGES)}, each once")
    quiet()
    root = args.workdir or Path(tempfile.mkdtemp(prefix="sessionize-bench-small-"))
    if args.workdir is None:
        # Searchable by others: Postgres runs as its own account when the bench runs as root
        # (with --workdir, LocalPostgres names a folder on the way that is not).
        root.chmod(0o755)
    for name in ("spark-events", *STORAGES):
        shutil.rmtree(root / name, ignore_errors=True)
    try:
        landing = args.landing or root / "landing"
        if args.landing is None and not landing.exists():
            generate_landing_zone(
                ZoneSpec(out=landing, start=START, users=args.users, seed=args.seed), days=args.days
            )
        conf = dict(item.split("=", 1) for item in args.conf)
        small_batch_figures(root, landing, storages=storages, spark_conf=conf, backend=args.backend)
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)


@contextmanager
def dagster_instance(folder: Path, *, storage: str) -> Iterator[DagsterInstance]:
    """A new Dagster instance in `folder`: its own SQLite files, or a new Postgres cluster of
    the bench's own (as `sessionize serve` makes one), served until the instance is done."""
    home = folder / "dagster_home"
    home.mkdir(parents=True)
    overrides: dict[str, Any] = {"telemetry": {"enabled": False}}
    if storage == "sqlite":
        yield DagsterInstance.local_temp(tempdir=str(home), overrides=overrides)
        return
    cluster = LocalPostgres(folder / "postgres", port=free_port())
    url = with_driver(cluster.ensure().url)
    with (folder / "postgres.log").open("w") as log:
        server = subprocess.Popen(
            cluster.server_command(), user=cluster.account, stdout=log, stderr=log
        )
        try:
            _wait_for_postgres(url, server)
            overrides["storage"] = {"postgres": {"postgres_url": url}}
            with DagsterInstance.local_temp(tempdir=str(home), overrides=overrides) as instance:
                yield instance
        finally:
            server.terminate()
            server.wait(timeout=60)


def _wait_for_postgres(url: str, server: subprocess.Popen[bytes]) -> None:
    """Until the new cluster takes connections (it listens before it has started)."""
    engine = sqlalchemy.create_engine(url)
    deadline = time.monotonic() + 60
    while True:
        try:
            with engine.connect():
                return
        except sqlalchemy.exc.OperationalError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        finally:
            engine.dispose()


@dataclass(frozen=True, kw_only=True)
class ReplayFigures:
    """One replay's figures: medians over the batches after the first."""

    batch: float
    phases: dict[str, float]
    counts: dict[str, float]  # Spark jobs, py4j round trips, Dagster events stored, runs made
    lines: float
    erasure: dict[str, Any]


def small_batch_figures(
    root: Path,
    landing: Path,
    *,
    storages: list[str],
    spark_conf: dict[str, str] | None = None,
    backend: str = "embedded",
) -> dict[str, float]:
    """Replay `landing` into a new lake and Dagster instance under `root` on each of
    `storages`, then the bare recompute; print the figures side by side and return the
    headline ones (the first storage's)."""
    event_log = root / "spark-events"
    event_log.mkdir(parents=True)
    # One Spark session for every replay: the same settings, one event log.
    spark_settings = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": event_log.absolute().as_uri(),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
        **(spark_conf or {}),
    }
    meter = install_meter()
    figures: dict[str, ReplayFigures] = {}
    settings: Settings | None = None
    for storage in storages:
        print(f"Dagster on {storage}:", flush=True)
        settings = Settings(
            landing_dir=landing,
            lake_dir=root / storage / "lake",
            lake_backend=backend,
            start_date=START,
            maintenance_cron=None,
            spark_conf=spark_settings,
        )
        with dagster_instance(root / storage, storage=storage) as instance:
            figures[storage] = replay_figures(settings, instance, meter=meter, event_log=event_log)
    assert settings is not None
    from sessionize_assets.definitions import build_resources

    spark = build_resources(settings, spark_ui=False)["spark"].session()
    bare = statistics.median(
        bare_recompute(spark, landing, settings, root / f"bare-{i}") for i in range(3)
    )
    first = figures[storages[0]]
    days = _received_days(landing)[1:]
    parse = statistics.median(parse_seconds(landing, day, settings) for day in days)
    print()
    print(f"machine: {os.cpu_count()} cores; zone {landing}: {len(days) + 1} batches")
    header = ["figure", *(f"Dagster on {name}" for name in storages)]
    print(
        table(
            header,
            [
                ["median batch after the first (s)", *(f"{f.batch:.2f}" for f in figures.values())],
                [
                    "bare PySpark full recompute of the zone, warm (s)",
                    *[f"{bare:.2f}"] * len(storages),
                ],
                ["batch / full recompute", *(f"{f.batch / bare:.2f}x" for f in figures.values())],
            ],
        )
    )
    print()
    print("the batch by phase, median over the batches after the first (seconds)")
    rows = [
        [name, *(f"{f.phases[name]:.2f}" for f in figures.values())]
        for name in (*PHASES, "of which compiling generated code")
    ]
    rows += [[f"({name})", *(f"{f.counts[name]:.0f}" for f in figures.values())] for name in COUNTS]
    rows.append(
        [
            f"parsing the batch's {first.lines:.0f} lines in Python (ingest's, on the driver)",
            *[f"{parse:.2f}"] * len(storages),
        ]
    )
    print(table(["phase", *header[1:]], rows))
    print()
    print(
        table(
            ["the erasure of one person", *header[1:]],
            [
                [
                    "keys given + anonymousIds stitched to them",
                    *(f.erasure["keys"] for f in figures.values()),
                ],
                ["seconds", *(f"{f.erasure['seconds']:.2f}" for f in figures.values())],
                [
                    "erasure / median batch",
                    *(f"{f.erasure['seconds'] / f.batch:.2f}x" for f in figures.values()),
                ],
                [
                    "Spark jobs (the batch's median)",
                    *(
                        f"{f.erasure['jobs']} ({f.counts['Spark jobs']:.0f})"
                        for f in figures.values()
                    ),
                ],
                ["runs", *(str(f.erasure["runs"]) for f in figures.values())],
            ],
        )
    )
    print(f"what `sessionize forget` said ({storages[0]}):")
    for line in first.erasure["said"]:
        print(f"  {line}")
    return {"batch": first.batch, "bare": bare, "erasure": first.erasure["seconds"]}


def _received_days(landing: Path) -> list[date]:
    return sorted(
        date.fromisoformat(folder.name.removeprefix("received_date="))
        for folder in landing.glob("received_date=*")
    )


def replay_figures(
    settings: Settings, instance: DagsterInstance, *, meter: Meter, event_log: Path
) -> ReplayFigures:
    """Replay the zone into `instance`, batch by batch as `sessionize replay` does, then erase
    one person: each batch's time by phase, from `meter` and Spark's event log."""
    marks: list[tuple[float, Counter[str], Counter[str]]] = []

    def compile_seconds() -> float:
        """Spark's time compiling generated code so far (the JVM's, executors' too in local
        mode): a query whose literals differ compiles anew."""
        try:
            spark = SparkSession.getActiveSession()
            if spark is None or spark._jvm is None:
                return 0.0
            codegen = spark._jvm.org.apache.spark.sql.catalyst.expressions.codegen
            return codegen.CodeGenerator.compileTime() / 1e9
        except Exception:  # no session yet
            return 0.0

    def mark() -> None:
        seconds, calls = meter.snapshot()
        seconds["compile"] = compile_seconds()  # type: ignore[assignment]  # (floats, as above)
        marks.append((time.time(), seconds, calls))

    def echo(line: str) -> None:
        if line.startswith("["):  # a batch's line: "[i/n] day (...): ok in ..."
            mark()
            print(line[:120], flush=True)

    mark()
    summary = replay(settings=settings, instance=instance, echo=echo)
    if not summary.ok:
        raise SystemExit(f"the replay failed: see {settings.lake_dir.parent}")
    from sessionize_assets.definitions import build_resources

    spark = build_resources(settings, spark_ui=False)["spark"].session()
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()  # flush the event log
    windows = [(marks[i][0], marks[i + 1][0]) for i in range(len(marks) - 1)]
    jobs = spark_job_seconds(event_log, windows)
    phases: list[dict[str, float]] = []
    counts: list[dict[str, float]] = []
    for i, batch in enumerate(summary.batches[1:], start=1):
        seconds = marks[i + 1][1] - marks[i][1]
        calls = marks[i + 1][2] - marks[i][2]
        job_time = sum(jobs[i])
        phase = {
            "spark jobs": job_time,
            "other JVM calls": seconds["jvm"] - job_time,
            "delta-rs": seconds["delta-rs"],
            "Dagster events": seconds["Dagster events"],
            "Dagster run creation": seconds["Dagster run creation"],
        }
        phase["rest (Dagster, Python)"] = batch.seconds - sum(phase.values())
        phase["of which compiling generated code"] = seconds["compile"]
        phases.append(phase)
        counts.append(
            {
                "Spark jobs": len(jobs[i]),
                "py4j round trips": calls["jvm"],
                "Dagster events stored": calls["Dagster events"],
                "runs made": calls["Dagster run creation"],
            }
        )
    erasure = erasure_figures(settings, instance, event_log, mark=mark, marks=marks)
    rest = summary.batches[1:]
    return ReplayFigures(
        batch=statistics.median(b.seconds for b in rest),
        phases={name: statistics.median(p[name] for p in phases) for name in phases[0]},
        counts={name: statistics.median(c[name] for c in counts) for name in COUNTS},
        lines=statistics.median(b.lines for b in rest),
        erasure=erasure,
    )


def erasure_figures(
    settings: Settings,
    instance: DagsterInstance,
    event_log: Path,
    *,
    mark: Any,
    marks: list[tuple[float, Counter[str], Counter[str]]],
) -> dict[str, Any]:
    """`sessionize forget` of the signed-in user with the most stitched devices: its seconds,
    Spark jobs (from the event log) and runs."""
    from sessionize_assets.definitions import build_resources
    from sessionize_assets.forget import forget
    from sessionize_assets.lake.tables import USER_IDENTITIES
    from sessionize_assets.resources.lake import STORES

    spark = build_resources(settings, spark_ui=False)["spark"].session()
    store = STORES[settings.lake_backend](spark=spark, lake=settings.lake)
    devices = Counter(store.read_arrow(USER_IDENTITIES).column("user_id").to_pylist())
    person = max(sorted(devices), key=lambda user: devices[user])
    runs_before = len(instance.get_run_records())
    mark()
    started = time.monotonic()
    said: list[str] = []
    if not forget(settings=settings, instance=instance, keys=[person], echo=said.append):
        raise SystemExit("the erasure failed: " + "\n".join(said))
    seconds = time.monotonic() - started
    mark()
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    (jobs,) = spark_job_seconds(event_log, [(marks[-2][0], marks[-1][0])])
    return {
        "keys": f"1 + {devices[person]}",
        "seconds": seconds,
        "jobs": len(jobs),
        "runs": len(instance.get_run_records()) - runs_before,
        "said": said,
    }


if __name__ == "__main__":
    main()
