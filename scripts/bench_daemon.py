"""Daemon-path benchmark: the runs the UI launches against the same batches in one process.

Users drive sessionize from the Dagster UI, where every run is a process of its own. This
script generates a landing zone (6 days x 500 users by default, about 2,000 lines a day) and
processes it twice, one after the other, each in a Dagster home of its own:

1. `sessionize replay`: every batch in one process, with its own local Spark session;
2. `sessionize dev` (what `make ui` runs): `dagster dev` with the project's `dagster.yaml`,
   its runs on the Spark Connect server it starts. The batch folders are dropped into the
   landing zone one by one; the sensors and automation launch every run. Each batch is
   followed until nothing is queued or running and its snapshot run has ended.

With `--classic-daemon`, a third pass runs plain `dagster dev`, each run starting its own
JVM (the daemon path before the server).

It prints, from the runs' records in each Dagster home: the median run wall (RUN_START to
its end) per job over the batches after the first, and their ratio; and the median batch, in
one process and under the daemon from the folder's arrival to the end of its last run,
against the bound 2 x the replay's batch + the sensor intervals on its path (the landing
sensor, the late-data sensor, automation and the lifecycle sensor: one tick each at most).
Everything comes from one run and is printed; nothing is asserted.

    make bench-daemon
    make bench-daemon BENCH_DAEMON_ARGS="--users 250 --days 4 --classic-daemon"
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import date, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_printing import table
from dagster import DagsterInstance, RunsFilter

from sessionize_assets.generator import ZoneSpec, generate_landing_zone
from sessionize_tests.dev_server import DagsterDev, free_port, land_folder

START = date(2026, 1, 1)
PROJECT = Path(__file__).resolve().parents[1]
# A batch's steps by the job that runs them: automation launches sessions as an asset job.
STEPS = {
    "ingest_batch_job": "ingest",
    "events_job": "events",
    "sessions_job": "sessions",
    "__ASSET_JOB": "sessions",
    "lifecycle_job": "snapshot",
    "summaries_job": "summaries",
}
# Sensor ticks a batch waits for on its way to the snapshot (landing, late data, automation,
# lifecycle).
TICKS_ON_THE_PATH = 4
BATCH_TIMEOUT = 900.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--days", type=int, default=6)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument(
        "--sensor-interval", type=int, default=5, help="seconds (the daemon's loop is 5 s)"
    )
    parser.add_argument(
        "--classic-daemon", action="store_true", help="also dagster dev with no server"
    )
    parser.add_argument("--workdir", type=Path, help="keep the zone, lakes and homes here")
    args = parser.parse_args()
    root = args.workdir or Path(tempfile.mkdtemp(prefix="bench-daemon-"))
    root.mkdir(parents=True, exist_ok=True)
    zone = root / "zone"
    if not zone.exists():
        generate_landing_zone(
            ZoneSpec(out=zone, start=START, users=args.users, seed=args.seed), days=args.days
        )
    batches = sorted(p.name for p in zone.iterdir() if p.is_dir())
    lines = sum(_lines(zone / b) for b in batches)
    print(f"zone: {len(batches)} batches, {lines:,} lines ({lines // len(batches):,} a batch)")

    replayed = _replay(root / "replay", zone)
    passes = {"one process (sessionize replay)": replayed}
    passes["dagster dev, runs on the server"] = _daemon(
        root / "served", zone, batches, interval=args.sensor_interval, program="sessionize"
    )
    if args.classic_daemon:
        passes["dagster dev, a JVM per run"] = _daemon(
            root / "classic", zone, batches, interval=args.sensor_interval, program="dagster"
        )
    _report(passes, interval=args.sensor_interval)
    print(f"\nworkdir: {root}")


def _lines(folder: Path) -> int:
    total = 0
    for path in folder.iterdir():
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as handle:
            total += sum(1 for _ in handle)
    return total


def _environment(workdir: Path, *, interval: int) -> dict[str, str]:
    return {
        "SESSIONIZE_LANDING_DIR": str(workdir / "landing"),
        "SESSIONIZE_LAKE_DIR": str(workdir / "lake"),
        "SESSIONIZE_START_DATE": START.isoformat(),
        "SESSIONIZE_SENSOR_INTERVAL_SECONDS": str(interval),
        "SESSIONIZE_MAINTENANCE_CRON": "off",
        "SESSIONIZE_JVM_CLASS_ARCHIVE": str(PROJECT / "jars" / "spark-driver.jsa"),
        "SESSIONIZE_SPARK_SERVER_PORT": str(free_port()),
        "SESSIONIZE_SPARK_SERVER_UI_PORT": str(free_port()),
    }


def _home(workdir: Path) -> Path:
    home = workdir / "dagster_home"
    home.mkdir(parents=True)
    shutil.copy(PROJECT / "dagster.yaml", home / "dagster.yaml")
    return home


def _replay(workdir: Path, zone: Path) -> dict:
    """Every batch through `sessionize replay`, as it lands, in one process."""
    print("replay in one process ...", flush=True)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    home = _home(workdir)
    env = _environment(workdir, interval=15) | {"DAGSTER_HOME": str(home)}
    shutil.copytree(zone, workdir / "landing")
    done = subprocess.run(
        [str(Path(sys.executable).with_name("sessionize")), "replay"],
        env={**os.environ, **env},
        cwd=workdir,
        capture_output=True,
        text=True,
        check=True,
    )
    walls = [
        float(line.split(" ok in ")[1].split("s,")[0])
        for line in done.stdout.splitlines()
        if " ok in " in line
    ]
    return {"walls": _run_walls(home), "batches": walls}


def _daemon(workdir: Path, zone: Path, batches: list[str], *, interval: int, program: str) -> dict:
    """The batch folders dropped one by one under `<program> dev`; each followed to its end."""
    print(f"{program} dev, folders dropped one by one ...", flush=True)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    home = _home(workdir)
    (workdir / "landing").mkdir()
    env = _environment(workdir, interval=interval)
    latencies = []
    phases: list[dict[str, float]] = []
    with DagsterDev(workdir=workdir, dagster_home=home, env=env, program=program) as server:
        for name in batches:
            before = {r["runId"] for r in server.runs()}
            arrived = time.time()
            land_folder(zone / name, workdir / "landing")

            def settled(before: set[str] = before) -> bool:
                runs = [r for r in server.runs() if r["runId"] not in before]
                snapshot = any(
                    r["jobName"] == "lifecycle_job" and r["status"] == "SUCCESS" for r in runs
                )
                return snapshot and server.idle()

            server.wait_for(settled, timeout=BATCH_TIMEOUT, what=f"batch {name}", every=1)
            # Anything the sensors launch at their next tick belongs to this batch too.
            time.sleep(2 * interval)
            server.wait_for(server.idle, timeout=BATCH_TIMEOUT, what=f"batch {name} to end")
            runs = sorted(
                (r for r in _records(home) if r.dagster_run.run_id not in before),
                key=lambda r: r.create_timestamp,
            )
            ended = max(r.end_time or 0.0 for r in runs)
            latencies.append(ended - arrived)
            parts = _path(runs, arrived)
            phases.append(parts)
            print(
                f"  {name}: {ended - arrived:.1f} s to its snapshot ("
                + ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
                + ")",
                flush=True,
            )
        failed = [r for r in server.runs() if r["status"] != "SUCCESS"]
    if failed:
        print(f"  runs that did not succeed: {failed}")
    return {"walls": _run_walls(home), "batches": latencies, "phases": phases}


def _path(runs: list, arrived: float) -> dict[str, float]:
    """Where a batch's time went, from the folder's arrival to its last run's end: waiting for
    the next run to be made (a sensor's tick; automation's backfill), for it to start (the
    queue, a process importing the code), and in the runs (RUN_START to their end)."""
    parts = {"until made": 0.0, "made to started": 0.0, "in runs": 0.0}
    previous = arrived
    for run in runs:
        made = run.create_timestamp.timestamp()
        parts["until made"] += max(0.0, made - previous)
        parts["made to started"] += (run.start_time or made) - made
        parts["in runs"] += (run.end_time or made) - (run.start_time or made)
        previous = run.end_time or made
    return parts


def _records(home: Path) -> list:
    with DagsterInstance.from_config(str(home)) as instance:
        return list(instance.get_run_records(filters=RunsFilter()))


def _run_walls(home: Path) -> dict[str, list[float]]:
    """Each step's run walls (RUN_START to the run's end), in the order the runs were made."""
    walls: dict[str, list[float]] = defaultdict(list)
    for record in sorted(_records(home), key=lambda r: r.create_timestamp):
        step = STEPS.get(record.dagster_run.job_name, record.dagster_run.job_name)
        if record.start_time and record.end_time:
            walls[step].append(record.end_time - record.start_time)
    return walls


def _median_after_first(values: list[float]) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)


def _report(passes: dict[str, dict], *, interval: int) -> None:
    names = list(passes)
    base = passes[names[0]]
    rows = []
    for step in dict.fromkeys(STEPS.values()):
        cells = [step]
        reference = _median_after_first(base["walls"].get(step, [0.0]))
        for name in names:
            walls = passes[name]["walls"].get(step, [])
            if not walls:
                cells.append("-")
                continue
            median = _median_after_first(walls)
            ratio = f" ({median / reference:.2f}x)" if name != names[0] and reference else ""
            cells.append(f"{median:.2f}{ratio}")
        rows.append(cells)
    print("\nmedian run wall per step's job, seconds (runs after each job's first):")
    print(table(["step", *names], rows))
    replay_batch = _median_after_first(base["batches"])
    bound = 2 * replay_batch + TICKS_ON_THE_PATH * interval
    print("\nmedian batch after the first, seconds:")
    rows = [["one process (sessionize replay), a batch's runs", f"{replay_batch:.1f}"]]
    for name in names[1:]:
        latency = _median_after_first(passes[name]["batches"])
        rows.append([f"{name}: the folder's arrival to its last run's end", f"{latency:.1f}"])
    rows.append(
        [
            f"bound: 2 x the replay's batch + {TICKS_ON_THE_PATH} sensor intervals of {interval} s",
            f"{bound:.1f}",
        ]
    )
    print(table(["", "seconds"], rows))
    for name in names[1:]:
        phases = passes[name]["phases"][1:] or passes[name]["phases"]
        medians = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
        print(
            f"{name}, a batch's median seconds: "
            + ", ".join(f"{k} {v:.1f}" for k, v in medians.items())
        )
    counts = {name: sum(len(v) for v in p["walls"].values()) for name, p in passes.items()}
    print(f"\nruns: {counts}; sensor interval {timedelta(seconds=interval)}")


if __name__ == "__main__":
    main()
