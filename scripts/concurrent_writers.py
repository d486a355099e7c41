"""The CLI and the daemon writing one lake at once, on an instance with or without the pool.

As a user meets it: `dagster dev` runs on a generated zone, the landing sensor ingests the
first batch folders, and `sessionize rebuild` starts in another process while the last ones
land. With `--instance bare` the Dagster home has no pool and no run retries (an instance of
the user's own); with `--instance project` it is the project's `dagster.yaml`. When the daemon
is idle again the script compares every table with the plain-Python full recompute and lists
the runs by job and status, the failed ones with their error, and what the rebuild said.

    PYTHONPATH=. .venv/bin/python scripts/concurrent_writers.py --instance bare
    PYTHONPATH=. .venv/bin/python scripts/concurrent_writers.py --instance project
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import date, timedelta
from pathlib import Path

from sessionize_assets.generator import ZoneSpec, generate_landing_zone
from sessionize_assets.lake.delta_rs.log_files import read_small_table, table_path
from sessionize_assets.lake.store import TableSpec
from sessionize_assets.lake.tables import (
    EVENTS,
    REJECTED_EVENTS,
    SESSIONS,
    USER_LIFECYCLE_SNAPSHOT,
)
from sessionize_assets.settings import Settings
from sessionize_tests.conftest import TEST_SPARK_CONF, make_settings, settings_environment
from sessionize_tests.dev_server import DagsterDev, DevServerError
from sessionize_tests.lifecycle_reference import lifecycle_reference
from sessionize_tests.reference import reference_sessions, reference_validate
from sessionize_tests.test_serve import deliver

START = date(2024, 3, 1)
PROJECT_YAML = Path(__file__).resolve().parents[1] / "dagster.yaml"


def rows(lake: Path, spec: TableSpec) -> list[dict]:
    """A table's rows, read as the sensors read the lake (delta-rs log, Arrow files)."""
    return read_small_table(table_path(lake, spec), spec).to_pylist()


def tables(settings: Settings, latest: date) -> dict[str, tuple[object, object]]:
    """Per table: (what the lake holds, what the full recompute gives)."""
    ref = reference_validate(settings.landing_dir, START)
    ref_sessions = reference_sessions(
        ref.winners, gap=settings.session_gap, max_length=settings.max_session_length
    )
    _, snapshot = lifecycle_reference(
        session_days=[(s.user_id, s.session_start.date()) for s in ref_sessions],
        start=START,
        end=latest,
    )
    lake = settings.lake_dir

    def naive(ts):
        return ts.replace(tzinfo=None)

    return {
        "events": (
            sorted((r["event_id"], naive(r["event_ts"])) for r in rows(lake, EVENTS)),
            sorted((k, naive(a.ts)) for k, a in ref.winners.items()),
        ),
        "rejected_events": (
            Counter(r["reason"] for r in rows(lake, REJECTED_EVENTS)),
            ref.rejections,
        ),
        "sessions": (
            sorted(
                (r["user_id"], naive(r["session_start"]), naive(r["session_end"]))
                for r in rows(lake, SESSIONS)
            ),
            sorted((s.user_id, naive(s.session_start), naive(s.session_end)) for s in ref_sessions),
        ),
        "user_lifecycle_snapshot": (
            sorted(
                (r["snapshot_date"], r["state"], r["users"], r["entered"], r["exited"])
                for r in rows(lake, USER_LIFECYCLE_SNAPSHOT)
            ),
            snapshot,
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instance", choices=["bare", "project"], required=True)
    parser.add_argument("--days", type=int, default=5)
    parser.add_argument("--users", type=int, default=60)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix=f"concurrent-{args.instance}-"))
    settings = make_settings(
        root, start_date=START, spark_conf={**TEST_SPARK_CONF, "spark.ui.enabled": "false"}
    )
    generated = root / "generated"
    generate_landing_zone(
        ZoneSpec(out=generated, start=START, users=args.users, seed=11, late_share=0.3),
        days=args.days,
    )
    home = root / "dagster_home"
    home.mkdir()
    if args.instance == "project":
        shutil.copy(PROJECT_YAML, home / "dagster.yaml")
    else:  # the user's own: no pool, no run retries
        (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = settings_environment(settings)
    days = [START + timedelta(days=d) for d in range(args.days)]
    first, rest = days[: args.days - 2], days[args.days - 2 :]
    began = time.monotonic()
    with DagsterDev(workdir=root, dagster_home=home, env=env) as server:
        for day in first:
            deliver(generated, settings, day)

        def some_batches_ingested() -> bool:
            done = [r for r in server.runs() if r["jobName"] == "ingest_batch_job"]
            return any(r["status"] == "SUCCESS" for r in done)

        server.wait_for(some_batches_ingested, timeout=args.timeout, what="the first ingest")
        rebuild = subprocess.Popen(
            [str(Path(sys.executable).with_name("sessionize")), "rebuild"],
            env={**os.environ, **env, "DAGSTER_HOME": str(home)},
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for day in rest:
            time.sleep(5)
            deliver(generated, settings, day)
        said, _ = rebuild.communicate(timeout=args.timeout)

        def settled() -> bool:
            if not server.idle():
                return False
            return all(held == expected for held, expected in tables(settings, days[-1]).values())

        try:
            server.wait_for(settled, timeout=args.timeout, what="the tables to settle", every=5)
            outcome = "the tables equal the full recompute"
        except DevServerError:
            outcome = "the tables DIFFER from the full recompute"
        runs = server.runs()
    print(f"instance: {args.instance}; {args.days} days x {args.users} users; {root}")
    print(f"sessionize rebuild exited {rebuild.returncode}; it said:")
    print("".join(f"    {line}\n" for line in said.splitlines()), end="")
    by_job = Counter((r["jobName"], r["status"]) for r in runs)
    for (job, status), count in sorted(by_job.items()):
        print(f"  {job:24} {status:10} {count}")
    for run in runs:
        if run["status"] != "SUCCESS":
            print(f"  not a success: {run['runId']} {run['jobName']} {run['status']}")
    for name, (held, expected) in tables(settings, days[-1]).items():
        print(f"  {name}: {'equal' if held == expected else 'DIFFERENT'}")
    print(f"{outcome}, after {time.monotonic() - began:.0f} s")
    return 0 if outcome.startswith("the tables equal") else 1


if __name__ == "__main__":
    sys.exit(main())
