"""Benchmark: what one late batch costs incrementally, against rebuilding events and sessions.

Generates a landing zone, processes all batches but the last incrementally, then times the
last batch incrementally and, side by side in the same process, a full rebuild of `events`
and `sessions` from the same raw tables. Prints the figures; asserts nothing.

    .venv/bin/python scripts/bench_late_batch.py --days 14 --users 300
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

from sessionize_assets.generate import generate_landing_zone
from sessionize_assets.incremental import batch_event_dates
from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_assets.lake.tables import BATCH_EVENT_DATES, RAW_EVENTS, SESSIONS
from sessionize_assets.partitions import session_dates_for
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.resources.spark import SparkResource
from sessionize_assets.settings import Settings
from sessionize_assets.updates import ingest_batch_lines, update_events, update_sessions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=14)
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--start", type=date.fromisoformat, default=date(2026, 1, 1))
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="sessionize-bench-"))
    try:
        run(root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(root: Path, args: argparse.Namespace) -> None:
    settings = Settings(landing_dir=root / "landing", lake_dir=root / "lake", start_date=args.start)
    report = generate_landing_zone(
        out=settings.landing_dir, start=args.start, days=args.days, users=args.users, seed=args.seed
    )
    print(f"landing zone: {report.lines} lines, {report.late_events} late, {args.days} batches")
    spark = SparkResource(master="local[*]", ui_enabled=False).session()
    spark.sparkContext.setLogLevel("ERROR")
    store = EmbeddedDeltaStore(spark=spark, lake_dir=settings.lake_dir)
    landing = LandingZoneResource(landing_dir=str(settings.landing_dir))
    batches = [args.start + timedelta(days=i) for i in range(args.days)]

    def process(received: date) -> tuple[float, float, float, object]:
        t0 = time.perf_counter()
        ingested = ingest_batch_lines(
            store,
            landing.read_lines(spark, received),
            received=received,
            settings=settings,
            run_id=f"bench-{received}",
        )
        t1 = time.perf_counter()
        events = update_events(
            store, spark, event_dates=ingested.touched_event_dates, run_id=f"bench-{received}"
        )
        t2 = time.perf_counter()
        sessions = update_sessions(
            store,
            spark,
            session_dates=session_dates_for(events.updated, settings),
            settings=settings,
            run_id=f"bench-{received}",
        )
        return t1 - t0, t2 - t1, time.perf_counter() - t2, sessions

    for received in batches[:-1]:
        process(received)
    ingest_s, events_s, sessions_s, sessions = process(batches[-1])
    late_dates = batch_event_dates(store, batches[-1])
    print(
        f"last batch {batches[-1]}: touched {len(late_dates)} event dates; "
        f"users recomputed {sessions.users_recomputed} of {sessions.users_total} in "  # type: ignore[attr-defined]
        f"{len(sessions.updated)} session dates"  # type: ignore[attr-defined]
    )
    print(
        f"incremental: ingest {ingest_s:.1f}s + events {events_s:.1f}s + sessions "
        f"{sessions_s:.1f}s = {ingest_s + events_s + sessions_s:.1f}s"
    )

    # The full rebuild: same raw tables and index, empty events/sessions and manifests.
    rebuild = EmbeddedDeltaStore(spark=spark, lake_dir=root / "rebuild")
    for spec in (RAW_EVENTS, BATCH_EVENT_DATES):
        shutil.copytree(settings.lake_dir / spec.name, root / "rebuild" / spec.name)
    all_dates = sorted({d for b in batches for d in batch_event_dates(rebuild, b)})
    t0 = time.perf_counter()
    update_events(rebuild, spark, event_dates=all_dates, run_id="rebuild")
    t1 = time.perf_counter()
    update_sessions(
        rebuild,
        spark,
        session_dates=session_dates_for(all_dates, settings),
        settings=settings,
        run_id="rebuild",
    )
    t2 = time.perf_counter()
    full = t2 - t0
    print(f"full rebuild: events {t1 - t0:.1f}s + sessions {t2 - t1:.1f}s = {full:.1f}s")
    incremental = events_s + sessions_s
    print(f"ratio full / incremental (events + sessions): {full / incremental:.1f}x")
    same = (
        rebuild.read(SESSIONS)
        .drop("session_number")
        .exceptAll(store.read(SESSIONS).drop("session_number"))
        .count()
    )
    print(f"rebuild and incremental sessions differ in {same} rows")


if __name__ == "__main__":
    main()
