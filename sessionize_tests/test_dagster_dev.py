"""End to end through the real `dagster dev`: webserver, daemon, sensors, automation, backfills.

Two batches land one after the other, the second with late events for the first day. Each is
materialized through GraphQL exactly as the UI's Materialize button does; from there only the
daemon acts (late-data sensor -> events, automation -> sessions, lifecycle sensor -> snapshot).
The Delta tables must end up equal to the plain-Python full recompute. Then a partition
backfill launched through GraphQL must complete as one range run per asset and leave the
tables unchanged.
"""

from __future__ import annotations

import shutil
from collections import Counter
from datetime import date, timedelta
from pathlib import Path

import pytest
from deltalake import DeltaTable

from sessionize_assets.dev_server import DagsterDev
from sessionize_assets.generator import generate_landing_zone
from sessionize_assets.settings import Settings
from sessionize_tests.conftest import TEST_SPARK_CONF, make_settings
from sessionize_tests.lifecycle_reference import lifecycle_reference
from sessionize_tests.reference import reference_sessions, reference_validate

START = date(2026, 1, 1)
DAYS = 2
BATCH_TIMEOUT = 420.0
SESSION_ASSETS = ["sessions", "session_quarantine", "session_changes"]
LIFECYCLE_ASSETS = ["user_lifecycle_state", "user_lifecycle_snapshot"]


def _rows(path: Path) -> list[dict]:
    if not (path / "_delta_log").is_dir():
        return []
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist()


def _naive(ts):
    return ts.replace(tzinfo=None)


def _expected(settings: Settings, latest: date) -> tuple[dict, Counter, list[tuple], list[tuple]]:
    ref = reference_validate(settings.landing_dir, START)
    events = {k: (a.user_key, _naive(a.ts)) for k, a in ref.winners.items()}
    ref_sessions = reference_sessions(
        ref.winners, gap=settings.session_gap, max_length=settings.max_session_length
    )
    sessions = sorted(
        (s.user_id, _naive(s.session_start), _naive(s.session_end), s.event_count, s.is_quarantined)
        for s in ref_sessions
    )
    _, snapshot = lifecycle_reference(
        session_days=[(s.user_id, s.session_start.date()) for s in ref_sessions],
        start=START,
        end=latest,
    )
    return events, ref.rejections, sessions, snapshot


def _actual(settings: Settings) -> tuple[dict, Counter, list[tuple], list[tuple]]:
    lake = settings.lake_dir
    events = {r["event_id"]: (r["user_id"], _naive(r["event_ts"])) for r in _rows(lake / "events")}
    rejected = Counter(r["reason"] for r in _rows(lake / "rejected_events"))
    sessions = sorted(
        (
            r["user_id"],
            _naive(r["session_start"]),
            _naive(r["session_end"]),
            r["event_count"],
            r["is_quarantined"],
        )
        for r in _rows(lake / "sessions")
    )
    snapshot = sorted(
        (r["snapshot_date"], r["state"], r["users"], r["entered"], r["exited"])
        for r in _rows(lake / "user_lifecycle_snapshot")
    )
    return events, rejected, sessions, snapshot


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    root = tmp_path_factory.mktemp("dagster_dev")
    settings = make_settings(
        root, start_date=START, spark_conf={**TEST_SPARK_CONF, "spark.ui.enabled": "false"}
    )
    generate_landing_zone(
        out=root / "generated", start=START, days=DAYS, users=40, seed=5, late_share=0.3
    )
    env = {
        "SESSIONIZE_LANDING_DIR": str(settings.landing_dir),
        "SESSIONIZE_LAKE_DIR": str(settings.lake_dir),
        "SESSIONIZE_START_DATE": START.isoformat(),
        "SESSIONIZE_SPARK_MASTER": settings.spark_master,
        "SESSIONIZE_SPARK_CONF": ";".join(f"{k}={v}" for k, v in settings.spark_conf.items()),
    }
    with DagsterDev(workdir=root, dagster_home=root / "dagster_home", env=env) as server:
        yield server, settings, root / "generated"


def _land_and_process(server: DagsterDev, settings: Settings, generated: Path, day: date) -> int:
    """Land one batch, press Materialize on raw_events, wait for the daemon; return the runs."""
    name = f"received_date={day.isoformat()}"
    shutil.copytree(generated / name, settings.landing_dir / name)
    expected = _expected(settings, day)
    before = {r["runId"] for r in server.runs()}
    server.materialize(assets=["raw_events", "rejected_events"], partition=day.isoformat())

    def settled() -> bool:
        return server.idle() and _actual(settings) == expected

    server.wait_for(
        settled, timeout=BATCH_TIMEOUT, what=f"batch {day} to reach the snapshot", every=3
    )
    runs = [r for r in server.runs() if r["runId"] not in before]
    failed = [r for r in runs if r["status"] != "SUCCESS"]
    assert failed == [], f"runs did not succeed: {failed}\n{server.log_tail()}"
    return len(runs)


def test_late_batch_reaches_sessions_through_sensor_and_automation(dev):
    server, settings, generated = dev
    first = _land_and_process(server, settings, generated, START)
    second = _land_and_process(server, settings, generated, START + timedelta(days=1))
    # The second batch carried events for the first day (late), so sessions of day 1 changed.
    late = [r for r in _rows(settings.lake_dir / "events") if r["event_date"] < r["received_date"]]
    assert late, "the second batch should carry late events"
    # raw -> events -> sessions -> snapshot: a handful of runs per batch, not one per partition.
    assert first <= 5 and second <= 5, (first, second)


def test_partition_backfill_from_graphql_runs_one_range_per_asset(dev):
    server, settings, _ = dev
    expected = _actual(settings)
    assert expected[2] and expected[3], "the previous test leaves sessions and a snapshot"
    partitions = [(START + timedelta(days=d)).isoformat() for d in range(DAYS)]
    backfill_id = server.launch_backfill(
        assets=SESSION_ASSETS + LIFECYCLE_ASSETS, partitions=partitions
    )

    def finished() -> str | None:
        status = server.backfill_status(backfill_id)
        return status if status not in {"REQUESTED", "CANCELING", "COMPLETING"} else None

    status = server.wait_for(finished, timeout=BATCH_TIMEOUT, what=f"backfill {backfill_id}")
    assert status in {"COMPLETED", "COMPLETED_SUCCESS"}, f"{status}\n{server.log_tail()}"
    runs = [
        r for r in server.runs() if {"key": "dagster/backfill", "value": backfill_id} in r["tags"]
    ]
    # BackfillPolicy.single_run: one range run for sessions, then one for the lifecycle.
    assert [r["status"] for r in runs] == ["SUCCESS", "SUCCESS"]
    server.wait_for(server.idle, timeout=BATCH_TIMEOUT, what="automation after the backfill")
    assert _actual(settings) == expected
