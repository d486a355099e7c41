"""End to end through the deployment (`make serve`): Dagster's webserver, daemon and code
server on Postgres, with the Spark Connect server, under supervisord.

As an operator does it: `sessionize serve` starts the deployment with an empty landing zone;
with its daemon stopped (`supervisorctl stop daemon`), `sessionize replay` processes the
first two batches into the deployment's instance and hands its sensor cursors over; the
daemon started again must launch nothing. A third batch folder is dropped into the landing
zone: from there only the daemon acts (landing sensor -> ingest, late-data sensor -> events,
stale-sessions sensor -> sessions with automation as the backstop, lifecycle sensor ->
snapshot), its runs launched by the code server on the Spark server, and the Delta tables
must end up equal to the plain-Python full recompute. The same folder re-delivered as it was
launches nothing. Then a partition backfill launched through GraphQL must complete as one range
run per asset and leave the tables unchanged. After each step the UI shows no partition
unsynced: it is shown stale only when it is. Every program listens on loopback alone (the Spark
server's UI too). `make ui`'s `sessionize dev` is what the soak runs (`test_soak.py`).
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import time
import urllib.request
from collections import Counter
from datetime import date, timedelta
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance
from deltalake import DeltaTable

from sessionize_assets.assets.reports import STEP_FIGURES
from sessionize_assets.checks.freshness import FRESHNESS_SENSOR
from sessionize_assets.generator import ZoneSpec, generate_landing_zone
from sessionize_assets.resources.spark import SERVER_TAG_MARK
from sessionize_assets.settings import Settings
from sessionize_tests.conftest import PROJECT, make_settings, run_sessionize, settings_environment
from sessionize_tests.dev_server import ServedDeployment, free_port, land_folder
from sessionize_tests.lifecycle_reference import lifecycle_reference
from sessionize_tests.reference import reference_sessions, reference_validate

# Minutes of end-to-end runs: started first (conftest.py).
pytestmark = pytest.mark.slow

START = date(2026, 1, 1)
DAYS = 3  # the last one is dropped into the landing zone while the UI runs
BATCH_TIMEOUT = 420.0
SENSOR_INTERVAL = timedelta(seconds=5)
SENSORS = (
    "landing_sensor",
    "late_data_sensor",
    "stale_sessions_sensor",
    "lifecycle_sensor",
    "summaries_sensor",
    "sessions_automation",
)
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
def deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    settings = make_settings(
        root,
        start_date=START,
        # The daemon's own loop is 5 s: each step of a batch waits for one tick, not 15-30 s.
        sensor_interval=SENSOR_INTERVAL,
        spark_server_master="local[2]",
        spark_server_port=free_port(),
        spark_server_ui_port=free_port(),
    )
    generated = root / "generated"
    generate_landing_zone(
        ZoneSpec(out=generated, start=START, users=40, seed=5, late_share=0.3), days=DAYS
    )
    env = settings_environment(settings)
    with ServedDeployment(workdir=root, env=env) as server:
        # A history loaded into a running deployment: its daemon stopped, the batches so far
        # through `sessionize replay` on its instance, which hands the cursors over.
        assert "daemon: stopped" in server.supervisorctl("stop", "daemon")
        for offset in range(DAYS - 1):
            deliver(generated, settings, START + timedelta(days=offset))
        replayed = run_sessionize(
            "replay", env=env | server.environment, cwd=root, timeout=BATCH_TIMEOUT
        )
        assert "daemon: started" in server.supervisorctl("start", "daemon")
        yield server, settings, generated, replayed


def deliver(generated: Path, settings: Settings, day: date) -> None:
    """The generated batch of `day` lands in the landing zone (`land_folder`)."""
    land_folder(generated / f"received_date={day.isoformat()}", settings.landing_dir)


def _server_jobs_by_step(settings: Settings) -> Counter:
    """The Spark Connect server's jobs by the step that tagged them (`counting_jobs` tags a
    step's operations `<label>-<uuid>`, which the server names `..._Tag_<label>-<uuid>`)."""
    base = f"http://127.0.0.1:{settings.spark_server_ui_port}/api/v1/applications"
    with urllib.request.urlopen(base, timeout=30) as response:
        (app,) = json.load(response)
    with urllib.request.urlopen(f"{base}/{app['id']}/jobs", timeout=30) as response:
        jobs = json.load(response)
    return Counter(
        tag.rsplit(SERVER_TAG_MARK, 1)[1].rsplit("-", 1)[0]
        for job in jobs
        for tag in job["jobTags"]
        if SERVER_TAG_MARK in tag
    )


def _reported_jobs(instance: DagsterInstance, asset: str, run_ids: set[str]) -> int:
    """The Spark jobs the runs `run_ids` reported for `asset`'s step (its `StepFigures`)."""
    (figures,) = [step for step in STEP_FIGURES if step.table.name == asset]
    records = instance.fetch_materializations(AssetKey(asset), limit=1000).records
    return sum(
        found.spark_jobs or 0
        for record in records
        if record.run_id in run_ids and record.asset_materialization is not None
        for found in [figures.in_metadata(record.asset_materialization.metadata)]
        if found is not None
    )


def _new_runs(server: ServedDeployment, before: set[str]) -> list[dict]:
    """The pipeline's runs since `before`: not the freshness check's, which its sensor runs
    after each deadline (and at its first tick) and which write nothing."""
    return [
        r
        for r in server.runs()
        if r["runId"] not in before
        and {"key": "dagster/sensor_name", "value": FRESHNESS_SENSOR} not in r["tags"]
    ]


def _finished_ticks(server: ServedDeployment, sensor: str) -> list[dict]:
    """`sensor`'s newest finished ticks, newest first: one still evaluating (STARTED) has no
    outcome yet, and on a loaded machine the newest tick often is."""
    return [t for t in server.sensor_ticks(sensor, limit=5) if t["status"] != "STARTED"]


def _launched_by_the_daemon(run: dict) -> bool:
    tags = {t["key"] for t in run["tags"]}
    return bool(
        tags & {"dagster/sensor_name", "dagster/backfill", "dagster/from_automation_condition"}
    )


def test_the_ui_launches_nothing_after_replay(deployment):
    server, _, _, replay_output = deployment
    # The landing and late-data sensors compare with the lake: only the lifecycle's has a cursor.
    assert "lifecycle_sensor: cursor stored for the daemon" in replay_output, replay_output
    assert "late_data_sensor: cursor" not in replay_output
    replayed = {r["runId"] for r in server.runs()}
    assert len(replayed) >= 2 * 3, "the replay's runs are in the instance the UI shows"

    def ticked_twice() -> bool:
        return all(len(server.sensor_ticks(name)) >= 2 for name in SENSORS)

    server.wait_for(ticked_twice, timeout=240, what="two ticks of every sensor", every=5)
    assert _new_runs(server, replayed) == [], server.log_tail()
    assert server.backfills() == []
    # The newest tick may still be evaluating (no outcome yet): read the newest finished one.
    latest = _finished_ticks(server, "landing_sensor")[0]
    assert latest["skipReason"] == f"{DAYS - 1} batch folders, none new or changed"
    # The replay left every partition exact, and the UI says so.
    assert server.unsynced() == {}


def test_a_dropped_folder_reaches_the_snapshot_with_no_click(deployment):
    server, settings, generated, _ = deployment
    day = START + timedelta(days=DAYS - 1)
    before = {r["runId"] for r in server.runs()}
    deliver(generated, settings, day)
    expected = _expected(settings, day)

    def settled() -> bool:
        # The summaries run last, once the sessions are up to date: then nothing is unsynced.
        return server.idle() and _actual(settings) == expected and server.unsynced() == {}

    server.wait_for(
        settled, timeout=BATCH_TIMEOUT, what=f"batch {day} to reach the snapshot", every=3
    )
    runs = _new_runs(server, before)
    failed = [r for r in runs if r["status"] != "SUCCESS"]
    assert failed == [], f"runs did not succeed: {failed}\n{server.log_tail()}"
    assert all(_launched_by_the_daemon(r) for r in runs), runs
    assert {r["jobName"] for r in runs} >= {
        "ingest_batch_job",
        "events_job",
        "lifecycle_job",
        "summaries_job",
    }
    # raw -> events -> sessions -> snapshot, summaries: one run per step, not one per partition.
    # Sessions automation may ask again for dates a sessions run has just done (Dagster can see
    # the run's materializations land between two reads of one tick), and the lifecycle and
    # summaries then follow that run too: each of those jobs runs at most twice.
    by_job = Counter(r["jobName"] for r in runs)
    assert by_job["ingest_batch_job"] == by_job["events_job"] == 1, by_job
    assert max(by_job.values()) <= 2, by_job
    # The batch carried events for earlier days (late), so their sessions were corrected.
    late = [r for r in _rows(settings.lake_dir / "events") if r["received_date"] == day]
    assert any(r["event_date"] < day for r in late), "the batch should carry late events"
    # Those days' sessions were materialized again: the snapshot days that follow from them
    # were reported again after them, so the UI shows no partition of any asset unsynced.
    assert server.unsynced() == {}
    # The runs' Spark is the deployment's Spark server, and each run's count of its jobs
    # (from the server's status API) is what its steps report. A daily batch is ingested,
    # settled, sessionized and checked on the driver: the server ran no job for it.
    served = _server_jobs_by_step(settings)
    assert served == Counter(), served
    with server.instance() as instance:
        for asset, step in (
            ("raw_events", "ingest"),
            ("events", "events"),
            ("sessions", "sessions"),
        ):
            reported = _reported_jobs(instance, asset, {r["runId"] for r in runs})
            assert reported == served[step], (asset, reported, served)


def test_an_identical_redelivery_launches_nothing(deployment):
    server, settings, generated, _ = deployment
    day = START + timedelta(days=DAYS - 1)
    before = {r["runId"] for r in server.runs()}
    expected = _actual(settings)
    delivered = time.time()
    deliver(generated, settings, day)  # the same bytes, new files and file times

    def ticks_since() -> list[dict]:
        return [t for t in _finished_ticks(server, "landing_sensor") if t["timestamp"] > delivered]

    server.wait_for(
        lambda: len(ticks_since()) >= 2, timeout=120, what="two landing ticks after it", every=3
    )
    assert _new_runs(server, before) == []
    reasons = {(t["status"], t["skipReason"]) for t in ticks_since()}
    assert reasons == {("SKIPPED", f"{DAYS} batch folders, none new or changed")}
    assert _actual(settings) == expected


def test_partition_backfill_from_graphql_runs_one_range_per_asset(deployment):
    server, settings, _, _ = deployment
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
    assert server.unsynced() == {}


def _listening_addresses(port: int) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The local addresses the kernel has a TCP socket listening at on `port` (/proc/net)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.split(":")
            if state != "0A" or int(port_hex, 16) != port:  # 0A: LISTEN
                continue
            # Each 32-bit word in the host's (little-endian) byte order.
            raw = b"".join(
                bytes.fromhex(address[i : i + 8])[::-1] for i in range(0, len(address), 8)
            )
            ip = ipaddress.ip_address(raw)
            found.add(ip.ipv4_mapped or ip if isinstance(ip, ipaddress.IPv6Address) else ip)
    return found


def test_every_program_listens_on_loopback_alone(deployment):
    """Postgres, the webserver, the code server, the Spark Connect server and its Spark UI:
    none of them has authentication of its own to put on a network."""
    server, settings, _, _ = deployment
    loopback = {ipaddress.ip_address("127.0.0.1")}
    for port in (
        server.postgres_port,
        server.port,
        server.code_server_port,
        settings.spark_server_port,
        settings.spark_server_ui_port,
    ):
        assert _listening_addresses(port) == loopback, port
    # The storage is the deployment's Postgres, and its password is nowhere in the repository.
    assert server.postgres_url.startswith("postgresql+psycopg2://sessionize:")
    password = server.postgres_url.split(":")[2].split("@")[0]
    # `-e`: a generated password may begin with "-", which git would read as an option.
    tracked = subprocess.run(
        ["git", "grep", "-l", "-F", "-e", password], cwd=PROJECT, capture_output=True, check=False
    )
    assert tracked.returncode == 1, tracked.stdout
