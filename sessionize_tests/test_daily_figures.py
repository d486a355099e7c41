"""SPEC §9 through Dagster: `arrivals` and `daily_sessions` after each step of a replay in
three steps, the last an empty batch that moves R on and turns dates complete with no event of
their own; and what the UI shows of them."""

from __future__ import annotations

import shutil
from datetime import date, timedelta

import pytest
from dagster import AssetKey, DagsterInstance, instance_for_test

from sessionize_assets.assets.reports import ArrivalsMetadata, DailySessionsMetadata
from sessionize_assets.cli import main
from sessionize_assets.generator import ZoneSpec, generate_landing_zone
from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_assets.lake.tables import ARRIVALS, DAILY_SESSIONS
from sessionize_assets.pipeline.daily import current_grace_period
from sessionize_assets.replay.command import replay
from sessionize_assets.transforms.completeness import COMPLETE, PROVISIONAL
from sessionize_assets.transforms.daily import ALL_CHANNELS
from sessionize_tests.conftest import make_settings
from sessionize_tests.full_recompute import differences
from sessionize_tests.table_rows import table_rows

pytestmark = pytest.mark.slow

START = date(2026, 1, 1)
DAYS = 8


def test_three_steps_of_a_replay_keep_the_summaries_exact_and_an_empty_batch_completes_dates(
    spark, tmp_path, monkeypatch, capsys
):
    # H = 2, W = 3: from the sixth batch on the reference dates hold events, so the grace
    # period is learned, and dates turn complete as R moves on.
    settings = make_settings(
        tmp_path,
        start_date=START,
        lateness_horizon_days=2,
        lateness_window_days=3,
    )
    staged = tmp_path / "zone"
    generate_landing_zone(
        ZoneSpec(out=staged, start=START, users=120, seed=5, late_share=0.1), days=DAYS
    )
    store = EmbeddedDeltaStore(spark=spark, lake=settings.lake_dir)
    with instance_for_test() as instance:
        # The first four days land at once (a backlog), the next four batch by batch.
        for first, last, at_once in ((0, 4, True), (4, DAYS, False)):
            for day in range(first, last):
                folder = f"received_date={START + timedelta(days=day)}"
                shutil.move(staged / folder, settings.landing_dir / folder)
            outcome = replay(
                settings=settings, instance=instance, echo=lambda _: None, at_once=at_once
            )
            assert outcome.ok
            assert differences(settings, spark, start=START) == []
            _assert_the_ui_shows_the_tables(instance, store)
        before = _statuses(store)
        arrivals = sorted(table_rows(store, ARRIVALS))

        # The next day's folder lands empty: no event changes, R moves on a day.
        (settings.landing_dir / f"received_date={START + timedelta(days=DAYS)}").mkdir()
        outcome = replay(settings=settings, instance=instance, echo=lambda _: None)
        assert outcome.ok and outcome.batches[0].accepted == 0
        assert differences(settings, spark, start=START) == []
        assert sorted(table_rows(store, ARRIVALS)) == arrivals
        after = _statuses(store)
        completed = [d for d in after if (before[d][0], after[d][0]) == (PROVISIONAL, COMPLETE)]
        assert completed, (before, after)
        assert all(after[d][1] >= before[d][1] for d in after)
        _assert_the_ui_shows_the_tables(instance, store)

    # `sessionize daily` (what `make demo` ends with) prints the last days as the table holds them.
    for name, value in {
        "SESSIONIZE_LAKE_DIR": settings.lake_dir,
        "SESSIONIZE_START_DATE": START,
        "SESSIONIZE_LATENESS_HORIZON_DAYS": 2,
        "SESSIONIZE_LATENESS_WINDOW_DAYS": 3,
    }.items():
        monkeypatch.setenv(name, str(value))
    capsys.readouterr()
    assert main(["daily", "--days", "3"]) == 0
    printed = capsys.readouterr().out.splitlines()
    grace = current_grace_period(store, settings)
    assert grace is not None
    assert printed[0].startswith(
        f"daily_sessions, the last 3 days (R = {START + timedelta(days=DAYS)}, grace period "
        f"{grace.days} days"
    )
    last = sorted(after)[-3:]
    assert [line.split()[0] for line in printed[2:]] == [str(day) for day in last]
    assert [line.split()[4] for line in printed[2:]] == [after[day][0] for day in last]


def _statuses(store: EmbeddedDeltaStore) -> dict[date, tuple[str, float]]:
    return {
        row.session_date: (row.status, row.expected_completeness)
        for row in table_rows(store, DAILY_SESSIONS)
        if row.channel == ALL_CHANNELS
    }


def _assert_the_ui_shows_the_tables(instance: DagsterInstance, store: EmbeddedDeltaStore) -> None:
    """Each date's latest `daily_sessions` materialization holds its `(all)` row as the table
    does, and `arrivals`' latest its totals and the grace period."""
    latest: dict[str, DailySessionsMetadata] = {}
    records = instance.fetch_materializations(AssetKey(DAILY_SESSIONS.name), limit=10_000)
    for record in reversed(records.records):  # oldest first: the latest stays
        event = record.asset_materialization
        assert event is not None and event.partition is not None
        latest[event.partition] = DailySessionsMetadata.from_metadata(event.metadata)
    table = {
        row.session_date.isoformat(): row
        for row in table_rows(store, DAILY_SESSIONS)
        if row.channel == ALL_CHANNELS
    }
    # A date of a sessions run's range that holds no session is shown with none.
    assert set(latest) >= set(table)
    assert all(
        latest[day].row_count == latest[day].sessions == 0 for day in set(latest) - set(table)
    )
    for day, row in table.items():
        shown = latest[day]
        assert (shown.sessions, shown.users, shown.status, shown.expected_completeness) == (
            row.sessions,
            row.users,
            row.status,
            row.expected_completeness,
        ), day
    (arrivals,) = instance.fetch_materializations(AssetKey(ARRIVALS.name), limit=1).records
    assert arrivals.asset_materialization is not None
    shown_arrivals = ArrivalsMetadata.from_metadata(arrivals.asset_materialization.metadata)
    assert shown_arrivals.events == sum(row.events for row in table_rows(store, ARRIVALS))
    statuses = {row.status for row in table.values()}
    assert statuses <= {COMPLETE, PROVISIONAL}
