"""`sessionize replay` through the real Definitions on a generated landing zone.

The acceptance test of the sessions issue: ten days, 300 users, 5% late events, processed
batch by batch through Dagster runs, leave every table equal to the full recompute.
"""

from __future__ import annotations

import gzip
from collections import Counter
from datetime import date, timedelta

import pytest
from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterRunStatus,
    RunsFilter,
    instance_for_test,
)
from deltalake import DeltaTable

from sessionize_assets.assets.reports import CHANNEL_KEYS, SnapshotDayMetadata
from sessionize_assets.definitions import LIFECYCLE_JOB
from sessionize_assets.generator import ZoneSpec, append_day, generate_landing_zone
from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_assets.lake.tables import EVENTS, SESSION_CHANGES
from sessionize_assets.partitions import PARTITION_TAG, RANGE_END, RANGE_START, days_between
from sessionize_assets.replay.command import replay
from sessionize_tests.conftest import make_settings
from sessionize_tests.full_recompute import (
    assert_tables_equal_the_full_recompute as assert_full_recompute,
)
from sessionize_tests.reference import reference_validate

# Minutes of end-to-end runs: started first (conftest.py).
pytestmark = pytest.mark.slow

START = date(2026, 1, 1)


@pytest.fixture(scope="module")
def replayed(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("replay")
    settings = make_settings(root, start_date=START)
    report = generate_landing_zone(
        ZoneSpec(out=settings.landing_dir, start=START, users=300, seed=11, late_share=0.05),
        days=10,
    )
    lines: list[str] = []
    with instance_for_test() as instance:
        summary = replay(settings=settings, instance=instance, echo=lines.append)
        runs = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.SUCCESS]))
        # The lifecycle's checks, evaluated inside each lifecycle run.
        lifecycle_checks = [
            (entry.dagster_event.event_specific_data.asset_check_key.name, entry.run_id)
            + (entry.dagster_event.event_specific_data.passed,)
            for run in runs
            if run.job_name == LIFECYCLE_JOB
            for entry in instance.all_logs(
                run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION
            )
        ]
        yield settings, report, summary, lines, len(runs), lifecycle_checks, instance


def test_replay_reports_progress_and_bounded_runs(replayed):
    _, report, summary, lines, successful_runs, _, _ = replayed
    assert summary.ok and len(summary.batches) == 10
    assert max(batch.runs for batch in summary.batches) <= 5
    # Every batch extends the snapshot to its own day, late ones correct earlier days too.
    assert all(batch.lifecycle_days >= 1 for batch in summary.batches)
    assert any(batch.lifecycle_days > 1 for batch in summary.batches)
    assert successful_runs == sum(batch.runs for batch in summary.batches)
    assert lines[0].startswith("10 new or changed batches in ")
    assert any(line.startswith("[10/10]") for line in lines)
    # Each batch's progress line says how many Spark jobs its runs started: the first
    # batch's sessions are built whole by Spark; every later one, a daily batch, is ingested,
    # settled, sessionized and checked on the driver, with none.
    assert summary.batches[0].spark_jobs > 0
    assert [batch.spark_jobs for batch in summary.batches[1:]] == [0] * 9
    last = next(line for line in lines if line.startswith("[10/10]"))
    assert f"spark jobs={summary.batches[-1].spark_jobs}," in last
    assert sum(batch.lines for batch in summary.batches) == report.lines
    # The closing lines reconcile the lake with the zone: every line is in one place.
    ingested = next(line for line in lines if line.startswith("  lines ingested"))
    assert ingested.startswith(f"  lines ingested      {report.lines:,} = ")
    assert not any("NOT RECONCILED" in line for line in lines)
    # Then the sessions by channel, most first, and the engaged share (SPEC §3b).
    at = next(i for i, line in enumerate(lines) if line.startswith("  sessions by channel ("))
    first = lines[at + 1].split()
    assert first[0] in {"Direct", "Organic", "Referral"} and "engaged" in lines[at + 1]
    # Late batches recompute the (user, day) pairs they touch: some users, never all 300.
    later = summary.batches[3:]
    assert all(0 < b.users_recomputed < 300 for b in later)
    assert all(b.pairs_recomputed >= b.users_recomputed for b in later)


def test_tables_equal_the_full_recompute(replayed, spark):
    settings, report, *_ = replayed
    ref = reference_validate(settings.landing_dir, START)
    assert len(ref.winners) == report.valid_events
    assert sum(ref.rejections.values()) + len(ref.winners) == report.lines
    assert_tables_equal_the_full_recompute(settings, spark)


def assert_tables_equal_the_full_recompute(settings, spark) -> None:
    assert_full_recompute(settings, spark, start=START)


# A user's first load: two months of history landed at once, late events spread over it.
BACKLOG_DAYS = 59


def test_an_at_once_replay_leaves_the_full_recompute_and_true_metadata(spark, tmp_path):
    """Two months of batches replayed at once (one ingest range run for the 59 days, as the
    landing sensor asks for a backlog, then one run per step over every date) end equal to
    the full recompute, in one batch of runs, and every partition reports its own content.
    Spark's writer writes every change (the other replays' small changes are written from
    the driver with Arrow). The same backlog over Spark Connect: `test_spark_connect.py`."""
    settings = make_settings(tmp_path, start_date=START, driver_write_bytes=0)
    report = generate_landing_zone(
        ZoneSpec(
            out=settings.landing_dir,
            start=START,
            users=50,
            seed=11,
            late_share=0.1,
            late_shape="uniform",
        ),
        days=BACKLOG_DAYS,
    )
    last = START + timedelta(days=BACKLOG_DAYS - 1)
    lines: list[str] = []
    with instance_for_test() as instance:
        summary = replay(settings=settings, instance=instance, echo=lines.append, at_once=True)
        assert summary.ok and len(summary.batches) == 1
        (outcome,) = summary.batches
        assert outcome.received == (START, last) and outcome.runs <= 5
        assert outcome.lines == report.lines and outcome.late_events > 0
        assert any(
            line.startswith(f"[1/1] {START}..{last} ({BACKLOG_DAYS} new): ok") for line in lines
        )
        assert any(
            line.startswith(f"batches: {BACKLOG_DAYS} processed, 0 skipped, 0 failed")
            for line in lines
        )
        _assert_partitions_report_their_rows(
            instance, settings.lake_dir, "sessions", "session_date"
        )
    assert_tables_equal_the_full_recompute(settings, spark)


def _latest_metadata(instance, asset: str) -> dict[str, dict]:
    """Each partition's latest materialization metadata, as the UI shows it."""
    latest: dict[str, dict] = {}
    for record in instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset)), limit=10_000, ascending=True
    ).records:
        materialization = record.asset_materialization
        latest[materialization.partition] = {
            k: v.value for k, v in materialization.metadata.items()
        }
    return latest


def _assert_partitions_report_their_rows(instance, lake, asset: str, column: str) -> None:
    """Each partition's latest `dagster/row_count` is its rows in the Delta table, and every
    partition with rows was reported."""
    reported = _latest_metadata(instance, asset)
    table = _rows_by_partition(lake / asset, column)
    assert reported, asset
    assert set(table) <= set(reported), f"{asset}: a partition with rows was never reported"
    assert {k: m["dagster/row_count"] for k, m in reported.items()} == {
        k: table.get(k, 0) for k in reported
    }, asset


def _rows_by_partition(path, column: str) -> Counter:
    return Counter(str(r[column]) for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist())


def test_each_partition_reports_its_own_content(replayed):
    """What the UI shows per partition is the partition's content in the Delta table."""
    settings, *_, instance = replayed
    lake = settings.lake_dir
    for asset, column in (
        ("raw_events", "received_date"),
        ("events", "event_date"),
        ("sessions", "session_date"),
        ("session_quarantine", "session_date"),
        ("session_changes", "session_date"),
    ):
        _assert_partitions_report_their_rows(instance, lake, asset, column)
    # Run-wide figures sit on one partition per run, never on all of a range's partitions.
    sessions = _latest_metadata(instance, "sessions")
    assert any("run_pairs_recomputed" not in m for m in sessions.values())
    # Sessions by channel and the engaged share, as the partition holds them.
    rows = DeltaTable(str(lake / "sessions")).to_pyarrow_table().to_pylist()
    by_day: dict[str, list[dict]] = {}
    for row in rows:
        by_day.setdefault(str(row["session_date"]), []).append(row)
    for day, metadata in sessions.items():
        held = by_day.get(day, [])
        channels = Counter(r["channel"] for r in held)
        assert {k: metadata[k] for k in CHANNEL_KEYS.values()} == {
            key: channels[name] for name, key in CHANNEL_KEYS.items()
        }, day
        engaged = sum(r["is_engaged"] for r in held) / len(held) if held else 0.0
        assert metadata["engaged_share"] == pytest.approx(engaged, abs=1e-4), day
    assert any(m["sessions_organic_search"] for m in sessions.values())
    snapshot = DeltaTable(str(lake / "user_lifecycle_snapshot")).to_pyarrow_table().to_pylist()
    users = {(str(r["snapshot_date"]), r["state"]): r["users"] for r in snapshot}
    for day, metadata in _latest_metadata(instance, "user_lifecycle_snapshot").items():
        for state in ("new", "active", "inactive", "dormant", "churned"):
            assert metadata[f"users_{state}"] == users[(day, state)], (day, state)


def test_asset_checks_pass_after_replay(replayed):
    from dagster import AssetCheckKey

    from sessionize_assets.definitions import CHECKS_JOB, build_definitions

    settings = replayed[0]
    job = build_definitions(settings, spark_ui=False).resolve_job_def(CHECKS_JOB)
    with instance_for_test() as instance:
        result = job.execute_in_process(instance=instance)
    evaluations = {e.asset_check_key: e for e in result.get_asset_check_evaluations()}
    assert len(evaluations) == 5
    failed = [str(k) for k, e in evaluations.items() if not e.passed]
    assert failed == []
    assert AssetCheckKey(AssetKey("events"), "unique_event_ids") in evaluations


def test_lifecycle_checks_run_and_pass_in_every_lifecycle_run(replayed):
    _, _, summary, _, _, lifecycle_checks, _ = replayed
    runs = {run_id for _, run_id, _ in lifecycle_checks}
    assert len(runs) >= len(summary.batches)
    for run_id in runs:
        assert {(name, passed) for name, r, passed in lifecycle_checks if r == run_id} == {
            ("snapshot_balances", True),
            ("snapshot_matches_intervals", True),
        }


def test_lifecycle_runs_report_the_days_asked_and_each_day_they_rewrote(replayed):
    """A run is asked for the days not computed yet and the days from the earliest sessions date
    materialized again (so that the UI shows none unsynced): it reports those, and any other
    day it rewrote, flagged `rewritten`; nothing else."""
    *_, instance = replayed
    reported_again = 0
    computed: date | None = None
    records = instance.get_run_records(RunsFilter(job_name=LIFECYCLE_JOB))
    for run in [r.dagster_run for r in sorted(records, key=lambda r: r.create_timestamp)]:
        # One day is a single-partition run, more a range run.
        one = run.tags.get(PARTITION_TAG)
        first = date.fromisoformat(one or run.tags[RANGE_START])
        last = date.fromisoformat(one or run.tags[RANGE_END])
        asked = {str(day) for day in days_between(first, last)}
        reported = {
            entry.asset_materialization.partition: SnapshotDayMetadata.from_metadata(
                entry.asset_materialization.metadata
            ).rewritten
            for entry in instance.all_logs(
                run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION
            )
            if entry.asset_materialization.asset_key == AssetKey("user_lifecycle_snapshot")
        }
        assert asked <= set(reported), run.run_id
        assert all(reported[day] for day in set(reported) - asked), run.run_id
        reported_again += computed is not None and first <= computed
        computed = max(last, computed or last)
    # Late sessions made later runs report days an earlier run had computed.
    assert reported_again > 0


def test_rebuild_from_raw_changes_nothing(replayed, spark):
    """`sessionize rebuild` over the replayed lake: every day recomputed, nothing corrected.
    It starts while another writer (the daemon's run, say) holds the lake: it waits for it,
    and says so."""
    from sessionize_assets.rebuild import rebuild
    from sessionize_tests.lake.test_writer_lock import hold_in_another_process, let_go

    settings = replayed[0]
    store = EmbeddedDeltaStore(spark=spark, lake=settings.lake_dir)
    logged = store.read(SESSION_CHANGES).count()
    lines: list[str] = []
    # The other writer holds the lock until the rebuild says it waits for it (at most a
    # minute), however slow the machine is to get there.
    other = hold_in_another_process(
        settings.lake_dir, holder="run 1234 of sessions_job (sessions)", seconds=60
    )

    def echo(line: str) -> None:
        if line.startswith("waiting for the lake") and not any(
            earlier.startswith("waiting for the lake") for earlier in lines
        ):
            let_go(other)
        lines.append(line)

    with instance_for_test() as instance:
        assert rebuild(settings=settings, instance=instance, echo=echo)
    other.wait()
    waits = [line for line in lines if line.startswith("waiting for the lake")]
    assert waits and "run 1234 of sessions_job (sessions) (pid" in waits[0]
    days = (max(date.fromisoformat(d) for d in store.row_counts(EVENTS)) - START).days + 1
    assert f"recomputed {days} event days and {days} session days" in lines
    assert "events changed on 0 days" in lines
    assert "sessions changed on 0 days" in lines
    assert store.read(SESSION_CHANGES).count() == logged
    assert_tables_equal_the_full_recompute(settings, spark)


def test_a_sessions_only_rebuild_after_a_new_gap_leaves_events_alone(replayed, spark):
    """`sessionize rebuild --sessions-only`: a new gap recomputes every session day from
    `events` as they are, and the tables equal the full recompute with that gap; `events` is
    not written. Back to the old gap, it changes them back."""
    from sessionize_assets.rebuild import rebuild

    settings = replayed[0]
    store = EmbeddedDeltaStore(spark=spark, lake=settings.lake_dir)
    events_version = store.version(EVENTS)
    days = (max(date.fromisoformat(d) for d in store.row_counts(EVENTS)) - START).days + 1
    wider = settings.with_overrides(session_gap=settings.session_gap * 3)
    for gap_settings, changes in ((wider, True), (settings, True), (settings, False)):
        lines: list[str] = []
        with instance_for_test() as instance:
            assert rebuild(
                settings=gap_settings, instance=instance, sessions_only=True, echo=lines.append
            )
        assert f"recomputed 0 event days and {days} session days" in lines
        assert ("sessions changed on 0 days" not in lines) == changes
        assert store.version(EVENTS) == events_version
        assert_tables_equal_the_full_recompute(gap_settings, spark)


def test_a_second_replay_does_nothing_and_a_redelivery_counts_by_content(replayed, spark):
    settings = replayed[0]
    with instance_for_test() as instance:
        lines: list[str] = []
        again = replay(settings=settings, instance=instance, echo=lines.append)
        assert again.ok and again.batches == []
        assert lines[0].startswith("0 new or changed batches in ")
        assert "10 unchanged since they were ingested" in lines[0]
        # A rebuild (the test before) recomputes its event days, so the session day after the
        # last of them, whose window holds it, is behind: replay catches it up, with one run,
        # and one summaries run reports the daily figures it shows this new instance.
        assert again.caught_up is None or again.caught_up.runs <= 2
        runs = instance.get_runs_count()
        # Day 4 re-delivered with the same bytes (new file times): still nothing to do.
        folder = settings.landing_dir / "received_date=2026-01-04"
        files = sorted(folder.iterdir())
        for path in files:
            path.write_bytes(path.read_bytes())
        assert replay(settings=settings, instance=instance, echo=lines.append).batches == []
        assert instance.get_runs_count() == runs
        # Day 4 re-delivered without one of its files: that batch alone, then tables exact.
        files[0].unlink()
        lines.clear()
        changed = replay(settings=settings, instance=instance, echo=lines.append)
        assert changed.ok and [b.received for b in changed.batches] == [(date(2026, 1, 4),) * 2]
        assert any(line.startswith("[1/1] 2026-01-04 (changed): ok") for line in lines)
    assert_tables_equal_the_full_recompute(settings, spark)


def test_a_corrupt_batch_fails_alone_and_replay_goes_on(replayed, spark):
    """Two more days land, the first with a truncated .jsonl.gz, next to a folder that is not a
    received day: replay reports both, ingests the good batch, and the bad one once fixed."""
    settings = replayed[0]
    for _ in range(2):
        append_day(
            ZoneSpec(out=settings.landing_dir, start=START, users=300, seed=11, late_share=0.05)
        )
    (settings.landing_dir / "received_date=2024-13-45").mkdir()
    bad_day, good_day = date(2026, 1, 11), date(2026, 1, 12)
    bad = settings.landing_dir / f"received_date={bad_day}" / "zz-truncated.jsonl.gz"
    packed = gzip.compress(b'{"messageId": "x"}\n' * 5000)
    bad.write_bytes(packed[: len(packed) // 2])
    with instance_for_test() as instance:
        lines: list[str] = []
        summary = replay(settings=settings, instance=instance, echo=lines.append)
        assert not summary.ok
        assert [(b.received, b.succeeded) for b in summary.batches] == [
            ((bad_day, bad_day), False),
            ((good_day, good_day), True),
        ]
        assert summary.batches[0].runs == 1  # ingest only: nothing of it was committed
        assert (
            "received_date=2024-13-45: not a batch folder (received_date=YYYY-MM-DD), ignored"
            in lines
        )
        assert f"  FAILED {bad_day} in ingest_batch_job: cannot read batch file {bad}" in "\n".join(
            lines
        )
        bad.unlink()
        fixed = replay(settings=settings, instance=instance, echo=lines.append)
        assert fixed.ok and [b.received for b in fixed.batches] == [(bad_day, bad_day)]
    assert_tables_equal_the_full_recompute(settings, spark)
