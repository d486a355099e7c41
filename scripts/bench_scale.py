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
    make bench BENCH_ARGS="--quick"     # 1,200 users, 40 days: a few minutes per backend
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from datetime import date, timedelta
from pathlib import Path
from typing import Any, TypeVar

from dagster import DagsterInstance, RunsFilter
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from sessionize_assets.assets.reports import (
    STEP_FIGURES,
    AssetRecord,
    EventsRunMetadata,
    LifecycleRunMetadata,
    RawBatchMetadata,
    SessionsChangedMetadata,
    SessionsRunMetadata,
    StepFigures,
)
from sessionize_assets.batch_driver import QUIET, REPLAY_BATCH_TAG, BatchDriver
from sessionize_assets.definitions import (
    EVENTS_JOB,
    INGEST_JOB,
    LIFECYCLE_JOB,
    REBUILD_CONFIG,
    REBUILD_JOB,
    SESSIONS_JOB,
    SESSIONS_REBUILD_CONFIG,
    build_definitions,
)
from sessionize_assets.generator import generate_landing_zone
from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import (
    BATCH_EVENT_DATES,
    EVENTS,
    RAW_EVENTS,
    SESSIONS,
    USER_LIFECYCLE_SNAPSHOT,
    USER_LIFECYCLE_STATE,
)
from sessionize_assets.partitions import RANGE_END, RANGE_START
from sessionize_assets.resources.spark import DELTA_CONF, delta_jars
from sessionize_assets.settings import LAKE_BACKENDS, Settings

START = date(2026, 1, 1)
DELTA_JARS_DIR = Path(__file__).resolve().parents[1] / "jars" / "delta"
STEPS = (("ingest", INGEST_JOB), ("events", EVENTS_JOB), ("sessions", SESSIONS_JOB))
SNAPSHOT = ("snapshot", LIFECYCLE_JOB)
StepT = TypeVar("StepT", bound=StepFigures)
RecordT = TypeVar("RecordT", bound=AssetRecord)


@dataclass(kw_only=True)
class BatchFigures:
    shape: str
    history: int
    seconds: dict[str, float] = field(default_factory=dict)
    # The metadata of each materialization of the batch's runs, by asset.
    metadata: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def step(self, name: str) -> float:
        return self.seconds.get(name, 0.0)

    @property
    def pipeline(self) -> float:
        """ingest + events + sessions: what the per-batch targets are about."""
        return sum(self.step(name) for name, _ in STEPS)

    def run(self, figures: type[StepT]) -> StepT:
        """A step's figures summed over the batch's runs of it (zeros when none ran)."""
        found = [
            r for m in self.metadata.get(figures.table.name, []) if (r := figures.in_metadata(m))
        ]
        return figures(
            **{x.name: sum(getattr(r, x.name) or 0 for r in found) for x in fields(figures)}
        )

    def total(self, record: type[RecordT], figure: Callable[[RecordT], int]) -> int:
        """A partition's figure summed over the batch's materializations of `record`'s table."""
        return sum(
            figure(record.from_metadata(m)) for m in self.metadata.get(record.table.name, [])
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=25_000)
    parser.add_argument("--histories", default="30,90,180", help="history lengths in days")
    parser.add_argument("--shapes", default="recent,uniform")
    parser.add_argument("--backends", default=",".join(LAKE_BACKENDS), help="storage backends")
    parser.add_argument("--late-share", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="1,200 users, 10/20/40 days")
    parser.add_argument("--workdir", type=Path, help="keep the zones and lakes here")
    parser.add_argument(
        "--driver-memory", default="8g", help="spark.driver.memory (local mode: all of Spark)"
    )
    args = parser.parse_args()
    if args.quick:
        args.users, args.histories = 1_200, "10,20,40"
    histories = sorted(int(h) for h in args.histories.split(","))
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    _quiet()
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
    jars = {}
    if "delta-spark" in backends:
        jars = DELTA_CONF | {"spark.jars": ",".join(map(str, delta_jars(DELTA_JARS_DIR)))}
    settings = Settings(
        landing_dir=zone_dir,
        lake_dir=work / "lake",
        start_date=START,
        spark_conf={"spark.driver.memory": args.driver_memory, **jars},
        lake_backend=backend,
        delta_jars_dir=DELTA_JARS_DIR,
    )
    label = f"{backend}:{shape}"
    defs = build_definitions(settings, spark_ui=False)
    (work / "dagster_home").mkdir(parents=True, exist_ok=True)
    instance = DagsterInstance.local_temp(
        tempdir=str(work / "dagster_home"), overrides={"telemetry": {"enabled": False}}
    )
    spark = defs.resources["spark"].session()  # type: ignore[attr-defined]
    store = defs.resources["lake"].store()  # type: ignore[attr-defined]
    figures = []
    done = 0
    for history in histories:
        with _timed(f"[{label}] history: days {done + 1}..{history} as range runs"):
            _range(defs, instance, INGEST_JOB, START + timedelta(days=done), _day(history))
            last_event = _last_event_date(store)
            _range(defs, instance, EVENTS_JOB, START, last_event)
            _range(defs, instance, SESSIONS_JOB, START, last_event)
            _range(defs, instance, LIFECYCLE_JOB, START, _day(history))
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
            out=out,
            start=START,
            days=days,
            users=users,
            seed=seed,
            late_share=late_share,
            late_shape=shape,
            gzip_share=0.0,
        )
    figures = {"lines": report.lines, "valid": report.valid_events, "late": report.late_events}
    marker.write_text(json.dumps(figures))
    return out, figures


def bare_sessionization(
    spark: SparkSession, store: DeltaStore, settings: Settings, out: Path
) -> float:
    """The sessions floor: sessions from the accepted events with plain window functions, no
    increments (what a sessions-only rebuild is compared with)."""
    started = time.perf_counter()
    events = store.read(EVENTS).select("user_id", "event_id", F.unix_micros("event_ts").alias("t"))
    _write_sessions(events, settings, out)
    return time.perf_counter() - started


def raw_sessionization(
    spark: SparkSession, store: DeltaStore, settings: Settings, out: Path
) -> float:
    """The raw floor, the script a user would write: from `raw_events`, one copy per message
    id (the earliest batch, then the earliest receivedAt: SPEC §2), then sessions as in the
    sessions floor (what the full recompute is compared with)."""
    started = time.perf_counter()
    first = Window.partitionBy("message_id").orderBy("received_date", "received_at")
    events = (
        store.read(RAW_EVENTS)
        .select("message_id", "user_id", "event_ts", "received_date", "received_at")
        .withColumn("copy", F.row_number().over(first))
        .where(F.col("copy") == 1)
        .select(
            "user_id", F.col("message_id").alias("event_id"), F.unix_micros("event_ts").alias("t")
        )
    )
    _write_sessions(events, settings, out)
    return time.perf_counter() - started


def _write_sessions(events: DataFrame, settings: Settings, out: Path) -> None:
    """Sessions (SPEC §3) of `events` (user_id, event_id, t in microseconds) with plain window
    functions, written as Parquet by session date."""
    gap_us = int(settings.session_gap.total_seconds() * 1_000_000)
    cap_us = int(settings.max_session_length.total_seconds() * 1_000_000)
    order = Window.partitionBy("user_id").orderBy("t", "event_id")
    chains = events.withColumn(
        "chain",
        F.sum(((F.col("t") - F.lag("t").over(order)) > gap_us).cast("int"))
        .over(order)
        .cast("long"),
    )
    per_chain = Window.partitionBy("user_id", "chain")
    sessions = (
        chains.withColumn("start", F.min("t").over(per_chain))
        .where(F.col("t") <= F.col("start") + cap_us)
        .groupBy("user_id", "chain")
        .agg(F.min("t").alias("start"), F.max("t").alias("end"), F.count("*").alias("events"))
        .withColumn("session_date", F.to_date(F.timestamp_micros("start")))
    )
    sessions.write.mode("overwrite").partitionBy("session_date").parquet(str(out))


def report(
    figures: list[BatchFigures],
    recompute: dict[str, dict[str, float]],
    *,
    histories: list[int],
    users: int,
) -> None:
    print()
    print(f"machine: {os.cpu_count()} cores; {users:,} users; histories {histories} days")
    for shape, full in recompute.items():
        print(
            f"[{shape}] lake after {histories[-1] + 1} days: {full['events']:,.0f} events, "
            f"{full['sessions']:,.0f} sessions; user_lifecycle_state {full['state_rows']:,.0f} "
            f"interval rows, against {full['user_days']:,.0f} user-days "
            f"({full['state_rows'] / max(full['user_days'], 1):.1%})"
        )
    print()
    print("(a) full recompute and (b) floor, seconds: (b) sessions from events, (b2) from raw")
    print(
        _table(
            [
                "backend:shape",
                "rebuild events",
                "rebuild sessions",
                "(a) rebuild",
                "(b2) raw floor",
                "(a)/(b2)",
                "(a2) sessions only",
                "(b) floor",
                "(a2)/(b)",
            ],
            [
                [
                    shape,
                    f"{full.get('events_step', 0):.1f}",
                    f"{full.get('sessionize_step', 0):.1f}",
                    f"{full['rebuild']:.1f}",
                    f"{full['raw_floor']:.1f}",
                    f"{full['rebuild'] / full['raw_floor']:.2f}",
                    f"{full['sessions_rebuild']:.1f}",
                    f"{full['floor']:.1f}",
                    f"{full['sessions_rebuild'] / full['floor']:.2f}",
                ]
                for shape, full in recompute.items()
            ],
        )
    )
    print()
    print("(c) one daily batch end to end through the Dagster definitions, seconds")
    rows = []
    for f in figures:
        full = recompute[f.shape]["rebuild"]
        base = next(g for g in figures if g.shape == f.shape and g.history == histories[0])
        rows.append(
            [
                f.shape,
                str(f.history),
                *(f"{f.step(name):.1f}" for name, _ in (*STEPS, SNAPSHOT)),
                f"{f.pipeline:.1f}",
                f"{100 * f.pipeline / full:.1f}%",
                f"{f.pipeline / base.pipeline:.2f}",
                f"{f.step('snapshot') / max(f.step('events') + f.step('sessions'), 1e-9):.2f}",
            ]
        )
    print(
        _table(
            [
                "backend:shape",
                "history",
                "ingest",
                "events",
                "sessions",
                "snapshot",
                "i+e+s",
                "of (a)",
                f"vs {histories[0]}d",
                "snap/(e+s)",
            ],
            rows,
        )
    )
    print()
    print("(c2) Spark jobs the batch's runs started, per step (each action is one)")
    print(
        _table(
            [
                "backend:shape",
                "history",
                "ingest",
                "events",
                "identities",
                "sessions",
                "snapshot",
                "i+e+id+s",
            ],
            [
                [
                    f.shape,
                    str(f.history),
                    *(str(f.run(step).spark_jobs) for step in STEP_FIGURES),
                    str(sum(f.run(step).spark_jobs or 0 for step in STEP_FIGURES[:-1])),
                ]
                for f in figures
            ],
        )
    )
    print()
    print("(d) rows read and written by the batch, per table")
    rows = []
    for f in figures:
        events, sessions = f.run(EventsRunMetadata), f.run(SessionsRunMetadata)
        new_events = events.new_events
        changed = f.total(
            SessionsChangedMetadata,
            lambda m: m.sessions_inserted + m.sessions_removed + m.sessions_replaced,
        )
        written = events.rows_written + sessions.rows_written
        rows.append(
            [
                f.shape,
                str(f.history),
                f"{f.total(RawBatchMetadata, lambda m: m.accepted):,}",
                f"{events.raw_rows_read:,}",
                f"{events.contested_ids:,}",
                f"{events.dates_also_changed}",
                f"{new_events:,}",
                f"{events.rows_written:,}",
                f"{events.files_removed}",
                f"{sessions.users_looked_up:,} in {sessions.dates_searched_by_user}d",
                f"{sessions.events_rows_scanned:,}",
                f"{sessions.events_read:,}",
                f"{sessions.pairs_recomputed:,}",
                f"{changed:,}",
                f"{sessions.rows_written:,}",
                f"{sessions.files_rewritten}/{sessions.files_before}",
                f"{written / max(new_events + changed, 1):.2f}",
            ]
        )
    print(
        _table(
            [
                "backend:shape",
                "history",
                "batch events",
                "raw read",
                "contested ids",
                "other dates changed",
                "new events",
                "events written",
                "events files rewr.",
                "sessions: users looked up",
                "events rows scanned",
                "events read",
                "pairs",
                "sessions changed",
                "sessions written",
                "sessions files rewr.",
                "written/(new+changed)",
            ],
            rows,
        )
    )
    print()
    print("(f) the lifecycle step: users restated and changed, rows written against the bound")
    print("    bound = 3 x (users whose state changed + 5 x snapshot days written)")
    rows = []
    for f in figures:
        state = f.run(LifecycleRunMetadata)
        days = state.snapshot_days_written
        changed_users = state.users_changed
        logical = state.interval_rows_added + 5 * days
        physical = state.interval_rows_written + 5 * days
        bound = 3 * (changed_users + 5 * days)
        rows.append(
            [
                f.shape,
                str(f.history),
                f"{f.step('snapshot'):.1f}",
                f"{f.step('snapshot') / max(f.step('events') + f.step('sessions'), 1e-9):.2f}",
                f"{days}",
                f"{state.users_restated:,}",
                f"{changed_users:,}",
                f"{state.interval_rows_removed:,}",
                f"{state.interval_rows_added:,}",
                f"{logical:,}",
                f"{bound:,}",
                f"{logical / max(bound, 1):.2f}",
                f"{physical:,}",
                f"{state.interval_files_rewritten}",
                f"{state.interval_rows:,}",
            ]
        )
    print(
        _table(
            [
                "backend:shape",
                "history",
                "snapshot s",
                "snap/(e+s)",
                "days written",
                "users restated",
                "users changed",
                "intervals removed",
                "intervals added",
                "rows written",
                "bound",
                "written/bound",
                "rows in files written",
                "interval files rewr.",
                "interval rows",
            ],
            rows,
        )
    )
    print()
    print("(e) peak driver memory, MB")
    print(
        _table(
            ["backend:shape", "python driver", "JVM (driver + local executors)"],
            [
                [shape, f"{full['peak_python_mb']:.0f}", f"{full['peak_jvm_mb']:.0f}"]
                for shape, full in recompute.items()
            ],
        )
    )


# -- helpers ---------------------------------------------------------------------------------


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
    names = {job: name for name, job in (*STEPS, SNAPSHOT)}
    for run in runs:
        stats = instance.get_run_stats(run.run_id)
        name = names[run.job_name]
        figures.seconds[name] = figures.seconds.get(name, 0.0) + (
            (stats.end_time or 0) - (stats.start_time or 0)
        )
        for record in instance.get_records_for_run(run.run_id).records:
            event = record.event_log_entry.dagster_event
            if event is None or not event.is_step_materialization:
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
    print(f"  done in {time.perf_counter() - started:.1f}s", flush=True)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).rjust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    logging.getLogger("py4j").setLevel(logging.ERROR)
    for name in ("dagster", "sessionize_assets"):
        logging.getLogger(name).setLevel(logging.WARNING)


if __name__ == "__main__":
    main()
