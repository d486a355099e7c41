"""Which (user, session date) pairs a change of `events` touched (`pipeline/touched.py`)."""

from __future__ import annotations

from sessionize_assets.lake.tables import EVENTS
from sessionize_assets.partitions import session_dates_for
from sessionize_assets.pipeline.manifests import sessions_progress
from sessionize_assets.pipeline.touched import touched_pairs
from sessionize_tests.harness import day


def test_a_date_left_behind_does_not_make_a_run_read_what_the_others_absorbed(pipeline):
    """The changes are read from the oldest version a run's dates absorbed. A file whose event
    date decides only session dates that absorbed its commit is not read: with one date left
    at an old version (the day after a rebuild's range), the files every other date absorbed
    since then (the rebuild's rewrite of the history) touch nothing and are not read. A file
    that decides the lagging date is."""
    pipeline.land(
        day(0), [("a", "user-a", "2026-01-10 09:00"), ("b", "user-b", "2026-01-10 10:00")]
    )
    pipeline.process(day(0))
    before = pipeline.store.version(EVENTS)
    pipeline.land(day(2), [("far", "user-far", "2026-01-02 09:00")])  # late, far back
    pipeline.process(day(2))
    now = pipeline.store.version(EVENTS)
    assert now is not None and before is not None and now > before
    settings = pipeline.settings
    far_dates = session_dates_for([day(-8)], settings)
    progress = sessions_progress(pipeline.store, partitions=far_dates)
    assert {progress[d].events_version for d in far_dates if d in progress} == {now}
    # Every session date the late event decides absorbed it; one date far from it lags.
    lagging = day(0)
    absorbed = {d: now for d in far_dates} | {lagging: before}
    found = touched_pairs(pipeline.store, absorbed, now, settings)
    assert found.listed == {}
    assert found.changed is None or not (found.changed.added or found.changed.removed)

    # The same late file, with one of the dates it decides left behind: read, and its pair found.
    behind = far_dates[-1]
    found = touched_pairs(pipeline.store, absorbed | {behind: before}, now, settings)
    assert found.listed == {behind: ["user-far"]}
    assert found.changed is not None and set(found.changed.added) == {"user-far"}
