"""Scale benchmark: what one daily batch costs against a full recompute, as history grows.

For each lateness shape (`recent`: mostly 1-3 days late with a tail to months; `uniform`: late
events spread evenly over the whole history) it generates a landing zone one batch at a time
and grows a lake through the project's own Dagster jobs. At each history length it ingests the
stretch of history as one range run, brings events, sessions and the snapshot up to date, and
then processes the next daily batch end to end exactly as `sessionize replay` does (ingest ->
late-data sensor -> events -> automation -> sessions -> lifecycle sensor -> snapshot), timing
every step and reading what each step read and wrote from its materialization metadata. At the
longest history it times a full recompute through `rebuild_job`, a sessions-only rebuild
(`sessions_job` with `full_refresh`, what a new gap or cap needs), and two bare PySpark
window-function sessionizations: from the accepted events (the sessions floor) and from
`raw_events`, one copy per message id (the raw floor, the script a user would write).

Each storage backend (`--backends`: embedded, delta-spark) grows a lake of its own from the
same zones, one after the other, in one process and one Spark session (with the Delta jars
when a backend needs them), so their figures stand side by side: the tables' first column is
`backend:shape`. Everything is measured on the same data. It prints tables and asserts nothing.

    make bench                          # 25,000 users, 180 days, 5% late (about 20 M events)
    make bench BENCH_ARGS="--mid"       # 3,000 users, 60 days: the full size's shape, 1/25
    make bench BENCH_ARGS="--quick"     # 1,200 users, 40 days: a few minutes per backend

Spark runs with a fresh install's settings (local mode, Spark's default driver memory) unless
`--driver-memory` says otherwise: what a user gets is what is measured.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from bench_floors import bare_sessionization, raw_sessionization
from bench_printing import quiet
from bench_scale_report import SNAPSHOT, STEPS, SUMMARIES, BatchFigures, report
from dagster import DagsterInstance, RunsFilter
from pyspark.sql import SparkSession

from sessionize_assets.definitions import (
    EVENTS_JOB,
    INGEST_JOB,
    LIFECYCLE_JOB,
    REBUILD_CONFIG,
    REBUILD_JOB,
    SESSIONS_JOB,
    SESSIONS_REBUILD_CONFIG,
    SUMMARIES_JOB,
    build_definitions,
    resource_of,
)
from sessionize_assets.generator import ZoneSpec, generate_landing_zone
from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import (
    BATCH_EVENT_DATES,
    EVENTS,
    SESSIONS,
    USER_LIFECYCLE_SNAPSHOT,
    USER_LIFECYCLE_STATE,
)
from sessionize_assets.partitions import RANGE_END, RANGE_START
from sessionize_assets.replay.driver import QUIET, REPLAY_BATCH_TAG, BatchDriver
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.spark import DELTA_CONF, SparkResource, delta_jars
from sessionize_assets.settings import LAKE_BACKENDS, Settings

START = date(2026, 1, 1)
DELTA_JARS_DIR = Path(__file__).resolve().parents[1] / "jars" / "delta"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=25_000)
    parser.add_argument("--histories", default="30,90,180", help="history lengths in days")
    parser.add_argument("--shapes", default="recent,uniform")
    parser.add_argument("--backends", default=",".join(LAKE_BACKENDS), help="storage backends")
    parser.add_argument("--late-share", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="1,200 users, 10/20/40 days")
    parser.add_argument("--mid", action="store_true", help="3,000 users, 20/60 days")
    parser.add_argument("--workdir", type=Path, help="keep the zones and lakes here")
    parser.add_argument(
        "--driver-memory",
        help="spark.driver.memory (local mode: all of Spark); default: a fresh install's",
    )
    args = parser.parse_args()
    if args.quick:
        args.users, args.histories = 1_200, "10,20,40"
    elif args.mid:
        args.users, args.histories = 3_000, "20,60"
    histories = sorted(int(h) for h in args.histories.split(","))
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    quiet()
    root = args.workdir or Path(tempfile.mkdtemp(prefix="sessionize-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        figures, recompute = [], {}
        for backend in backends:
            for shape in shapes:
                batches, full = run_shape(
                    root, shape=shape, backend=backend, backends=backends, args=args
                )
                figures += batches
                recompute[f"{backend}:{shape}"] = full
            # After each shape: a long run that is cut short still leaves its figures.
            report(figures, recompute, histories=histories, users=args.users)
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)


def run_shape(
    root: Path, *, shape: str, backend: str, backends: list[str], args: argparse.Namespace
) -> tuple[list[BatchFigures], dict[str, float]]:
    histories = sorted(int(h) for h in args.histories.split(","))
    days = histories[-1] + 1
    zone_dir, zone = landing_zone(
        root / "zones",
        shape=shape,
        users=args.users,
        days=days,
        late_share=args.late_share,
        seed=args.seed,
    )
    print(f"  {zone['lines']:,} lines, {zone['valid']:,} valid events, {zone['late']:,} late")
    work = root / f"{backend}-{shape}"
    shutil.rmtree(work, ignore_errors=True)  # a fresh lake and instance on every run
    # The bench's one session (the first backend's starts it) loads the Delta jars when any
    # backend needs them, so every backend runs on the same session settings.
    memory = {"spark.driver.memory": args.driver_memory} if args.driver_memory else {}
    jars = {}
    if "delta-spark" in backends:
        jars = DELTA_CONF | {"spark.jars": ",".join(map(str, delta_jars(DELTA_JARS_DIR)))}
    settings = Settings(
        landing_dir=zone_dir,
        lake_dir=work / "lake",
        start_date=START,
        spark_conf=memory | jars,
        lake_backend=backend,
        delta_jars_dir=DELTA_JARS_DIR,
    )
    label = f"{backend}:{shape}"
    defs = build_definitions(settings, spark_ui=False)
    (work / "dagster_home").mkdir(parents=True, exist_ok=True)
    instance = DagsterInstance.local_temp(
        tempdir=str(work / "dagster_home"), overrides={"telemetry": {"enabled": False}}
    )
    spark = resource_of(defs, "spark", SparkResource).session()
    store = resource_of(defs, "lake", LakeResource).store()
    figures = []
    done = 0
    for history in histories:
        with _timed(f"[{label}] history: days {done + 1}..{history} as range runs"):
            with _timed(f"  {INGEST_JOB}"):
                _range(defs, instance, INGEST_JOB, START + timedelta(days=done), _day(history))
            last_event = _last_event_date(store)
            for job in (EVENTS_JOB, SESSIONS_JOB):
                with _timed(f"  {job}"):
                    _range(defs, instance, job, START, last_event)
            with _timed(f"  {LIFECYCLE_JOB}"):
                _range(defs, instance, LIFECYCLE_JOB, START, _day(history))
            # One summaries run brings every date up to date (its partition: the last day).
            with _timed(f"  {SUMMARIES_JOB}"):
                _range(defs, instance, SUMMARIES_JOB, _day(history), _day(history))
        driver = BatchDriver(defs=defs, instance=instance, settings=settings)
        driver.late_data.tick()  # the cursors start after the history
        driver.lifecycle_sensor.tick()
        received = _day(history + 1)
        with _timed(f"[{label}] one daily batch ({received}) end to end"):
            outcome = driver.batches(received, received)
        if not outcome.succeeded:
            raise SystemExit(f"batch {received} failed: see {work / 'dagster_home'}")
        figures.append(_batch_figures(instance, received, shape=label, history=history))
        done = history + 1
    full: dict[str, float] = {}
    with _timed(f"[{label}] full recompute through {REBUILD_JOB}"):
        run = _range(
            defs, instance, REBUILD_JOB, START, _last_event_date(store), config=REBUILD_CONFIG
        )
        full.update(_step_seconds(instance, run))
    with _timed(f"[{label}] sessions-only rebuild ({SESSIONS_JOB}, full_refresh)"):
        run = _range(
            defs,
            instance,
            SESSIONS_JOB,
            START,
            _last_event_date(store),
            config=SESSIONS_REBUILD_CONFIG,
        )
        full["sessions_rebuild"] = _step_seconds(instance, run)["rebuild"]  # the whole run
    with _timed(f"[{label}] bare PySpark floors"):
        full["floor"] = bare_sessionization(spark, store, settings, work / "floor")
        full["raw_floor"] = raw_sessionization(spark, store, settings, work / "raw_floor")
    full["events"] = float(sum(store.row_counts(EVENTS).values()))
    full["sessions"] = float(sum(store.row_counts(SESSIONS).values()))
    full["state_rows"] = float(sum(store.row_counts(USER_LIFECYCLE_STATE).values()))
    # What one row per user per day would hold: the users with a state, summed over the days.
    full["user_days"] = float(sum(store.read_arrow(USER_LIFECYCLE_SNAPSHOT)["users"].to_pylist()))
    full["peak_python_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    full["peak_jvm_mb"] = _jvm_peak_mb(spark)
    return figures, full


def landing_zone(
    zones: Path, *, shape: str, users: int, days: int, late_share: float, seed: int
) -> tuple[Path, dict[str, int]]:
    """The zone for these parameters, generated once and reused by later runs in one workdir.

    Generating 20 M events takes about 20 minutes; a marker written last says it is complete.
    """
    out = zones / f"{shape}-{users}users-{days}days-late{late_share:g}-seed{seed}"
    marker = out / "zone.json"
    if marker.exists():
        print(f"[{shape}] reusing the zone in {out}")
        return out, json.loads(marker.read_text())
    shutil.rmtree(out, ignore_errors=True)
    with _timed(f"[{shape}] generating {days} days x {users} users"):
        report = generate_landing_zone(
            ZoneSpec(
                out=out,
                start=START,
                users=users,
                seed=seed,
                late_share=late_share,
                late_shape=shape,
                gzip_share=0.0,
            ),
            days=days,
        )
    figures = {"lines": report.lines, "valid": report.valid_events, "late": report.late_events}
    marker.write_text(json.dumps(figures))
    return out, figures


def _day(n: int) -> date:
    """The n-th received day, 1-based."""
    return START + timedelta(days=n - 1)


def _range(
    defs: Any,
    instance: DagsterInstance,
    job_name: str,
    first: date,
    last: date,
    *,
    config: dict[str, Any] | None = None,
) -> str:
    job = defs.resolve_job_def(job_name)
    result = job.execute_in_process(
        instance=instance,
        run_config={**QUIET, **(config or {})},
        tags={RANGE_START: first.isoformat(), RANGE_END: last.isoformat()},
        raise_on_error=True,
    )
    return result.run_id


def _last_event_date(store: DeltaStore) -> date:
    index = store.read_arrow(BATCH_EVENT_DATES)
    return max(index.column("event_date").to_pylist())


def _batch_figures(
    instance: DagsterInstance, received: date, *, shape: str, history: int
) -> BatchFigures:
    figures = BatchFigures(shape=shape, history=history)
    runs = instance.get_runs(RunsFilter(tags={REPLAY_BATCH_TAG: received.isoformat()}))
    names = {job: name for name, job in (*STEPS, SNAPSHOT, SUMMARIES)}
    for run in runs:
        stats = instance.get_run_stats(run.run_id)
        name = names[run.job_name]
        figures.seconds[name] = figures.seconds.get(name, 0.0) + (
            (stats.end_time or 0) - (stats.start_time or 0)
        )
        for record in instance.get_records_for_run(run.run_id).records:
            event = record.event_log_entry.dagster_event
            if event is None or not event.is_step_materialization or event.asset_key is None:
                continue
            key = event.asset_key.to_user_string()
            # Each partition carries its own figures, and a range run's `run_*` figures are on
            # one partition only: summing over the materializations counts everything once.
            materialization = event.step_materialization_data.materialization
            figures.metadata.setdefault(key, []).append(dict(materialization.metadata))
    return figures


def _step_seconds(instance: DagsterInstance, run_id: str) -> dict[str, float]:
    seconds = {
        f"{step.step_key}_step": (step.end_time or 0) - (step.start_time or 0)
        for step in instance.get_run_step_stats(run_id)
    }
    stats = instance.get_run_stats(run_id)
    seconds["rebuild"] = (stats.end_time or 0) - (stats.start_time or 0)
    return seconds


def _jvm_peak_mb(spark: SparkSession) -> float:
    """VmHWM of the Spark driver JVM (in local mode it also runs the executors)."""
    proc = getattr(spark.sparkContext._gateway, "proc", None)
    if proc is None:
        return 0.0
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextmanager
def _timed(label: str) -> Iterator[None]:
    print(f"{label} ...", flush=True)
    started = time.perf_counter()
    yield
    # The peak so far, after each phase: the phase that raised it is the one that held it.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"  done in {time.perf_counter() - started:.1f}s; the Python process's peak so far: "
        f"{peak:,.0f} MB",
        flush=True,
    )


if __name__ == "__main__":
    main()
