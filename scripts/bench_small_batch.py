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
  and what is left (Dagster's run and step machinery, Python). Parsing the batch's lines in
  Python happens inside ingest's Spark job; it is measured on its own, on the driver.

Everything comes from one run and is printed; nothing is asserted.

    make bench-small                      # the default zone
    make bench-small BENCH_SMALL_ARGS="--users 500 --days 10"
    make bench-small BENCH_SMALL_ARGS="--backend delta-spark"
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_floors import bare_recompute
from bench_printing import quiet, table
from dagster import DagsterInstance
from pyspark.sql import SparkSession

from sessionize_assets.generator import ZoneSpec, generate_landing_zone
from sessionize_assets.replay.command import replay
from sessionize_assets.replay.driver import BatchOutcome
from sessionize_assets.settings import LAKE_BACKENDS, Settings
from sessionize_assets.transforms.validation import parse_line

START = date(2026, 1, 1)
PHASES = ("spark jobs", "other JVM calls", "delta-rs", "Dagster events", "rest (Dagster, Python)")


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
    """Wrap py4j's round trip, delta-rs's table and transaction calls, and Dagster's event
    store: each call is timed once (not again inside another wrapped call)."""
    import deltalake
    import py4j.clientserver

    meter = Meter()
    meter.wrap(py4j.clientserver.ClientServerConnection, "send_command", "jvm")
    for name, member in vars(deltalake.DeltaTable).items():
        if callable(member) and not name.startswith("__"):
            meter.wrap(deltalake.DeltaTable, name, "delta-rs")
    meter.wrap(deltalake.DeltaTable, "__init__", "delta-rs")
    meter.wrap(DagsterInstance, "handle_new_event", "Dagster events")
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
        "--conf", action="append", default=[], help="a Spark setting KEY=VALUE (repeatable)"
    )
    args = parser.parse_args()
    quiet()
    root = args.workdir or Path(tempfile.mkdtemp(prefix="sessionize-bench-small-"))
    shutil.rmtree(root / "lake", ignore_errors=True)
    shutil.rmtree(root / "dagster_home", ignore_errors=True)
    shutil.rmtree(root / "spark-events", ignore_errors=True)
    try:
        landing = args.landing or root / "landing"
        if args.landing is None and not landing.exists():
            generate_landing_zone(
                ZoneSpec(out=landing, start=START, users=args.users, seed=args.seed), days=args.days
            )
        conf = dict(item.split("=", 1) for item in args.conf)
        small_batch_figures(root, landing, spark_conf=conf, backend=args.backend)
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)


def small_batch_figures(
    root: Path,
    landing: Path,
    *,
    spark_conf: dict[str, str] | None = None,
    backend: str = "embedded",
) -> dict[str, float]:
    """Replay `landing` into a new lake under `root`, then the bare recompute; print the
    figures and return the headline ones."""
    event_log = root / "spark-events"
    event_log.mkdir(parents=True)
    settings = Settings(
        landing_dir=landing,
        lake_dir=root / "lake",
        lake_backend=backend,
        start_date=START,
        maintenance_cron=None,
        spark_conf={
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": event_log.absolute().as_uri(),
            "spark.eventLog.compress": "false",
            "spark.eventLog.rolling.enabled": "false",
            **(spark_conf or {}),
        },
    )
    (root / "dagster_home").mkdir(parents=True)
    instance = DagsterInstance.local_temp(
        tempdir=str(root / "dagster_home"), overrides={"telemetry": {"enabled": False}}
    )
    meter = install_meter()
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
        raise SystemExit(f"the replay failed: see {root / 'dagster_home'}")
    from sessionize_assets.definitions import build_resources

    spark = build_resources(settings, spark_ui=False)["spark"].session()
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()  # flush the event log
    bare = [bare_recompute(spark, landing, settings, root / f"bare-{i}") for i in range(3)]
    batches = summary.batches
    windows = [(marks[i][0], marks[i + 1][0]) for i in range(len(marks) - 1)]
    jobs = spark_job_seconds(event_log, windows)
    rows: list[tuple[BatchOutcome, dict[str, float], int, int, int]] = []
    for i, batch in enumerate(batches[1:], start=1):
        seconds = marks[i + 1][1] - marks[i][1]
        job_time = sum(jobs[i])
        phase = {
            "spark jobs": job_time,
            "other JVM calls": seconds["jvm"] - job_time,
            "delta-rs": seconds["delta-rs"],
            "Dagster events": seconds["Dagster events"],
        }
        phase["rest (Dagster, Python)"] = batch.seconds - sum(phase.values())
        calls = marks[i + 1][2] - marks[i][2]
        phase["of which compiling generated code"] = seconds["compile"]
        rows.append((batch, phase, len(jobs[i]), calls["jvm"], calls["Dagster events"]))
    median_batch = statistics.median(b.seconds for b, *_ in rows)
    median_bare = statistics.median(bare)
    days = [b.received[0] for b, *_ in rows if b.received]
    parse = statistics.median(parse_seconds(landing, day, settings) for day in days)
    lines = statistics.median(b.lines for b, *_ in rows)
    print()
    print(f"machine: {os.cpu_count()} cores; zone {landing}: {len(batches)} batches")
    print(
        table(
            ["figure", "seconds"],
            [
                ["median batch after the first", f"{median_batch:.2f}"],
                ["bare PySpark full recompute of the zone (warm)", f"{median_bare:.2f}"],
                ["batch / full recompute", f"{median_batch / median_bare:.2f}x"],
            ],
        )
    )
    print()
    print("the batch by phase, median over the batches after the first (seconds)")
    phases = [
        [name, f"{statistics.median(p[name] for _, p, *_ in rows):.2f}"]
        for name in (*PHASES, "of which compiling generated code")
    ]
    counts = [[r[2] for r in rows], [r[3] for r in rows], [r[4] for r in rows]]
    phases += [
        ["(Spark jobs; py4j round trips; Dagster events stored)", ""],
        ["", " / ".join(f"{statistics.median(count):.0f}" for count in counts)],
        [f"parsing the batch's {lines:.0f} lines in Python (inside ingest's job)", f"{parse:.2f}"],
    ]
    print(table(["phase", "seconds"], phases))
    erasure = erasure_figures(settings, instance, event_log, mark=mark, marks=marks)
    print()
    print(
        table(
            ["the erasure of one person, against the median batch", "value"],
            [
                ["keys given + anonymousIds stitched to them", erasure["keys"]],
                ["seconds", f"{erasure['seconds']:.2f}"],
                ["erasure / median batch", f"{erasure['seconds'] / median_batch:.2f}x"],
                [
                    "Spark jobs (the batch's median)",
                    f"{erasure['jobs']} ({statistics.median(counts[0]):.0f})",
                ],
                ["runs", erasure["runs"]],
            ],
        )
    )
    print("what `sessionize forget` said:")
    for line in erasure["said"]:
        print(f"  {line}")
    return {"batch": median_batch, "bare": median_bare, "erasure": erasure["seconds"]}


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
