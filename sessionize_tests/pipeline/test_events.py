"""SPEC §2 across dates: one messageId, one event, whatever the copies' timestamps and the
order their batches arrive in (pipeline/events.py and the id index, pipeline/event_ids.py)."""

from __future__ import annotations

import json

import pytest

from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_assets.lake.tables import EVENT_IDS, EVENTS, EVENTS_MANIFEST, REJECTED_EVENTS
from sessionize_assets.pipeline.events import update_events
from sessionize_assets.pipeline.ingest import ingest_landed
from sessionize_assets.pipeline.landing import fingerprint
from sessionize_assets.pipeline.manifests import record_unrecorded
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_tests.driver import after_events, process_batch
from sessionize_tests.harness import Killed, KilledBeforeCommitTo, Pipeline, day

# Minutes of batches in all: started first (conftest.py).
pytestmark = pytest.mark.slow


@pytest.fixture
def pipeline(spark, settings) -> Pipeline:
    return Pipeline(spark, settings)


def _events(pipeline: Pipeline) -> dict[str, tuple]:
    return {
        r.event_id: (r.event_date, r.received_date) for r in pipeline.store.read(EVENTS).collect()
    }


def _duplicates(pipeline: Pipeline) -> list[tuple]:
    rows = pipeline.store.read(REJECTED_EVENTS).where("reason = 'duplicate'").collect()
    return sorted((r.message_id, r.event_date, r.received_date, r.origin) for r in rows)


def _newest_versions(pipeline: Pipeline) -> dict:
    """Per events partition, the newest `events` version the manifest says holds it."""
    newest: dict = {}
    for row in pipeline.store.read_arrow(EVENTS_MANIFEST).to_pylist():
        day_, version = row["partition_date"], row["events_version"]
        newest[day_] = max(newest.get(day_, -1), version)
    return newest


def _land_copies(pipeline: Pipeline) -> None:
    """x in the batch of day 0 with its timestamp on day 0, and re-stamped a day later in the
    batch of day 2 (a client that re-stamps a retry): the first batch's copy wins."""
    pipeline.land(day(0), [("x", "u", f"{day(0)} 10:00"), ("y", "u", f"{day(0)} 10:05")])
    pipeline.land(day(2), [("x", "u", f"{day(1)} 09:00"), ("z", "u", f"{day(1)} 09:10")])


def test_a_copy_on_another_date_loses_when_the_winner_came_first(pipeline):
    _land_copies(pipeline)
    pipeline.process(day(0))
    run = pipeline.process(day(2))

    assert _events(pipeline) == {
        "x": (day(0), day(0)),
        "y": (day(0), day(0)),
        "z": (day(1), day(2)),
    }
    assert _duplicates(pipeline) == [("x", day(1), day(2), "events")]
    assert (run.events.duplicates, run.events.displaced, run.events.also_changed) == (1, 0, [])
    pipeline.assert_equals_full_recompute()


def test_a_daily_batch_is_settled_on_the_driver_without_spark(pipeline):
    """The winner arriving last, as a daily batch: ingested, its copies settled (a copy on
    another date displaced and rejected) and both tables written, with Arrow alone
    (`events_on_driver`), then its sessions, summaries and snapshot. No step asks for a Spark
    session."""
    _land_copies(pipeline)
    pipeline.process(day(2))
    arrow_only = EmbeddedDeltaStore(spark=_no_spark, lake=pipeline.settings.lake_dir)
    landing = LandingZoneResource(landing_dir=str(pipeline.settings.landing_dir))
    ingested = ingest_landed(
        arrow_only,
        landing,
        _no_spark,
        fingerprints={day(0): fingerprint(day(0), landing.batch_files(day(0)))},
        settings=pipeline.settings,
        run_id="ingest",
    )

    events = update_events(
        arrow_only,
        _no_spark,
        event_dates=ingested.batches[day(0)].touched_event_dates,
        run_id="events",
    )

    assert (events.updated, events.also_changed) == ([day(0)], [day(1)])
    assert (events.contested_ids, events.displaced, events.duplicates) == (1, 1, 1)
    assert events.new_events == 2
    assert _events(pipeline) == {
        "x": (day(0), day(0)),
        "y": (day(0), day(0)),
        "z": (day(1), day(2)),
    }
    assert _duplicates(pipeline) == [("x", day(1), day(2), "events")]
    assert record_unrecorded(pipeline.store, run_id="next") == []
    after_events(
        arrow_only,
        _no_spark,
        settings=pipeline.settings,
        received=day(0),
        events=events,
        run_id="sessions",
    )
    pipeline.assert_equals_full_recompute()


def _no_spark():
    raise AssertionError("a daily batch's runs hold no Spark session")


def test_the_winner_arriving_last_displaces_the_copy_on_another_date(pipeline):
    _land_copies(pipeline)
    pipeline.process(day(2))  # the later batch first: its copy of x, on day 1, wins for now
    assert _events(pipeline)["x"] == (day(1), day(2))
    sessions_before = pipeline.sessions()
    assert ("u", f"{day(1)} 09:00:00", f"{day(1)} 09:10:00", 2, 1, False) in sessions_before

    run = pipeline.process(day(0))  # day 1 is not among the batch's dates, and still changes

    assert _events(pipeline)["x"] == (day(0), day(0))
    assert _duplicates(pipeline) == [("x", day(1), day(2), "events")]
    assert run.events.updated == [day(0)]
    assert run.events.also_changed == [day(1)]
    assert (run.events.displaced, run.events.duplicates) == (1, 1)
    # Both dates are held by the run's version in the manifest: the sessions of day 1 are
    # behind it, and the next run finds nothing left to record.
    version = run.events.events_version
    assert _newest_versions(pipeline) == {day(0): version, day(1): version}
    assert record_unrecorded(pipeline.store, run_id="next") == []
    # The sessions of both dates follow: day 1's session lost x, day 0's gained it.
    assert ("u", f"{day(1)} 09:10:00", f"{day(1)} 09:10:00", 1, 1, False) in pipeline.sessions()
    pipeline.assert_equals_full_recompute()


def test_a_redelivered_winner_batch_without_the_copy_promotes_the_other_one(pipeline):
    _land_copies(pipeline)
    pipeline.process(day(0))
    pipeline.process(day(2))
    pipeline.assert_equals_full_recompute()

    # The batch that held the winner comes again without x: day 2's copy, on day 1, wins.
    pipeline.land(day(0), [("y", "u", f"{day(0)} 10:05")], name="again.jsonl")
    run = pipeline.process(day(0))
    assert _events(pipeline)["x"] == (day(1), day(2))
    assert _duplicates(pipeline) == []
    assert run.events.promoted == 1 and run.events.also_changed == [day(1)]
    pipeline.assert_equals_full_recompute()

    # And once more with x: its copy wins again and day 2's goes back to the rejections.
    _land_copies(pipeline)
    pipeline.process(day(0))
    assert _events(pipeline)["x"] == (day(0), day(0))
    assert _duplicates(pipeline) == [("x", day(1), day(2), "events")]
    pipeline.assert_equals_full_recompute()


def test_a_redelivered_winner_batch_with_the_same_lines_changes_nothing(pipeline):
    _land_copies(pipeline)
    pipeline.process(day(2))
    pipeline.process(day(0))
    events, duplicates = _events(pipeline), _duplicates(pipeline)

    _land_copies(pipeline)  # the same lines again: a new raw version, the same outcome
    run = pipeline.process(day(0))
    assert (_events(pipeline), _duplicates(pipeline)) == (events, duplicates)
    assert run.events.also_changed == []
    pipeline.assert_equals_full_recompute()


def test_copies_on_three_dates_keep_the_earliest_batch_in_any_order(pipeline):
    batches = {
        day(1): [("m", "u", f"{day(1)} 08:00")],
        day(2): [("m", "u", f"{day(0)} 20:00")],
        day(3): [("m", "u", f"{day(3)} 07:00")],
    }
    for received in (day(3), day(2), day(1)):
        pipeline.land(received, batches[received])
        pipeline.process(received)
        pipeline.assert_equals_full_recompute()
    assert _events(pipeline) == {"m": (day(1), day(1))}
    assert _duplicates(pipeline) == [
        ("m", day(0), day(2), "events"),
        ("m", day(3), day(3), "events"),
    ]


def test_a_rebuild_keeps_the_winner_of_another_date(pipeline, spark):
    _land_copies(pipeline)
    pipeline.process(day(0))
    pipeline.process(day(2))
    # Rebuilding day 1 alone: its copy of x still loses to day 0's, which stays.
    update_events(
        pipeline.store, lambda: spark, event_dates=[day(1)], run_id="rebuild", full_refresh=True
    )
    assert _events(pipeline)["x"] == (day(0), day(0))
    assert _duplicates(pipeline) == [("x", day(1), day(2), "events")]
    pipeline.assert_equals_full_recompute()


def test_a_rebuild_of_every_date_settles_the_copies_from_raw_alone_and_writes_what_differs(
    pipeline, spark
):
    _land_copies(pipeline)
    pipeline.process(day(0))
    pipeline.process(day(2))
    # The whole history's raw rows hold every copy: the id index is not read. Here it lacks
    # day 0's copy of x, so a winner taken from it would be day 1's copy.
    store, dates = pipeline.store, [day(0), day(1)]
    kept = store.read(EVENT_IDS, partitions=[day(0)]).where("event_id != 'x'").collect()
    store.replace_partitions(
        EVENT_IDS, spark.createDataFrame(kept, EVENT_IDS.schema), partitions=[day(0)]
    )
    version = store.version(EVENTS)
    run = update_events(
        store, lambda: spark, event_dates=dates, run_id="rebuild", full_refresh=True
    )
    assert _events(pipeline) == {
        "x": (day(0), day(0)),
        "y": (day(0), day(0)),
        "z": (day(1), day(2)),
    }
    assert _duplicates(pipeline) == [("x", day(1), day(2), "events")]
    # Recomputed, and equal to what the table holds: no event is written.
    assert (run.recomputed, run.replaced) == (dates, [])
    assert (store.version(EVENTS), run.rows_written, run.files_added) == (version, 0, 0)

    # A row of day 0 altered behind the pipeline's back: the rebuild restores that date alone.
    held = store.read(EVENTS, partitions=[day(0)]).collect()
    altered = [r if r.event_id != "y" else r.asDict() | {"event_name": "tampered"} for r in held]
    store.replace_partitions(
        EVENTS, spark.createDataFrame(altered, EVENTS.schema), partitions=[day(0)]
    )
    day1_files = store.live_files(EVENTS, partitions=[day(1)])
    run = update_events(
        store, lambda: spark, event_dates=dates, run_id="restore", full_refresh=True
    )
    assert run.replaced == [day(0)]
    assert run.files_removed == 1 and run.rows_written == 2  # day 0's x and y
    assert sorted(store.read(EVENTS, partitions=[day(0)]).collect()) == sorted(held)
    assert store.live_files(EVENTS, partitions=[day(1)]) == day1_files
    # The manifest says day 0 is held by the rebuild's version (its sessions follow it) and
    # day 1 by the version that wrote it, and the next run finds nothing left to record.
    assert _newest_versions(pipeline) == {day(0): run.events_version, day(1): version}
    assert record_unrecorded(store, run_id="next") == []


def test_the_id_index_holds_one_row_per_copy(pipeline):
    _land_copies(pipeline)
    pipeline.process(day(0))
    pipeline.process(day(2))
    rows = sorted(
        (r.event_id, r.event_date, r.received_date)
        for r in pipeline.store.read(EVENT_IDS).collect()
    )
    assert rows == [
        ("x", day(0), day(0)),
        ("x", day(1), day(2)),
        ("y", day(0), day(0)),
        ("z", day(1), day(2)),
    ]


def test_a_displaced_copy_keeps_its_raw_line(pipeline):
    _land_copies(pipeline)
    pipeline.process(day(2))
    pipeline.process(day(0))
    row = pipeline.store.read(REJECTED_EVENTS).where("reason = 'duplicate'").first()
    assert json.loads(row.raw_line)["timestamp"].startswith(day(1).isoformat())


@pytest.mark.parametrize("killed_before", ["events", "events_manifest"])
def test_a_run_killed_before_its_events_or_manifest_commit_is_completed_once(
    pipeline, spark, killed_before
):
    """Killed before the manifest commit, the run's events commit is recorded from the Delta
    log by the next run (nothing added twice); killed before the events commit, the next run
    redoes it and finds its rejections made."""
    _land_copies(pipeline)
    pipeline.process(day(2))
    killed = KilledBeforeCommitTo(pipeline.store, killed_before)
    with pytest.raises(Killed):
        process_batch(killed, spark, settings=pipeline.settings, received=day(0), run_id="k")
    version = pipeline.store.version(EVENTS)

    # The retry the late-data sensor asks for: the batch's event dates.
    retry = update_events(pipeline.store, lambda: spark, event_dates=[day(0)], run_id="retry")

    if killed_before == "events_manifest":
        # Recorded from the log: the retry finds nothing new and commits nothing.
        assert retry.updated == [] and pipeline.store.version(EVENTS) == version
    else:
        assert retry.updated == [day(0)] and retry.displaced == 1 and retry.duplicates == 0
    assert _events(pipeline)["x"] == (day(0), day(0))
    assert _duplicates(pipeline) == [("x", day(1), day(2), "events")]
    manifest = pipeline.store.read_arrow(EVENTS_MANIFEST).to_pylist()
    assert {(r["partition_date"], r["received_date"]) for r in manifest} == {
        (day(0), day(0)),
        (day(1), day(2)),
    }
    pipeline.process(day(0))  # and the rest of the chain: sessions, the lifecycle
    pipeline.assert_equals_full_recompute()
