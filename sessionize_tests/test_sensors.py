"""The sensors read every new materialization since their cursor, not only the latest."""

from __future__ import annotations

import json
import time
from datetime import date, timedelta
from uuid import uuid4

import pytest
from dagster import (
    AssetMaterialization,
    DagsterRun,
    DagsterRunStatus,
    SensorResult,
    SkipReason,
    build_sensor_context,
    instance_for_test,
)

from sessionize_assets.definitions import (
    EVENTS_JOB,
    INGEST_JOB,
    LIFECYCLE_JOB,
    SESSIONS_JOB,
    build_definitions,
)
from sessionize_assets.partitions import RANGE_END, RANGE_START, contiguous_ranges, lifecycle_range


def _batch(settings, received: str, timestamps: list[str]) -> None:
    folder = settings.landing_dir / f"received_date={received}"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps(
            {
                "messageId": f"{received}-{i}",
                "userId": "u",
                "timestamp": ts,
                "receivedAt": f"{received}T12:00:00Z",
            }
        )
        for i, ts in enumerate(timestamps)
    ]
    (folder / "part.jsonl").write_text("\n".join(lines) + "\n")


def _ranges(result) -> list[tuple[str, str]]:
    return [(r.tags[RANGE_START], r.tags[RANGE_END]) for r in result.run_requests]


def _late_data(settings):
    """The ingest and events jobs, and a tick of the late-data sensor for an instance."""
    defs = build_definitions(settings, spark_ui=False)
    sensor = defs.resolve_sensor_def("late_data_sensor")

    def ticks(instance):
        return lambda: sensor(build_sensor_context(instance=instance, definitions=defs))

    return defs.resolve_job_def(INGEST_JOB), defs.resolve_job_def(EVENTS_JOB), ticks


def test_late_data_sensor_asks_for_every_event_date_behind_its_batches(settings):
    settings = settings.with_overrides(max_partitions_per_run=10)
    _batch(settings, "2026-01-20", ["2026-01-20T08:00:00Z", "2026-01-19T08:00:00Z"])
    _batch(settings, "2026-01-21", ["2026-01-21T08:00:00Z", "2026-01-02T08:00:00Z"])
    ingest, events, ticks = _late_data(settings)
    with instance_for_test() as instance:
        tick = ticks(instance)

        assert isinstance(tick(), SkipReason)
        for key in ("2026-01-20", "2026-01-21"):
            assert ingest.execute_in_process(partition_key=key, instance=instance).success
        result = tick()

        assert isinstance(result, SensorResult)
        # 2026-01-02 is 17 days before the others: two ranges of at most 10 days.
        assert _ranges(result) == [("2026-01-02", "2026-01-02"), ("2026-01-19", "2026-01-21")]
        assert [r.run_key for r in tick().run_requests] == [r.run_key for r in result.run_requests]
        for request in result.run_requests:
            assert events.execute_in_process(instance=instance, tags=request.tags).success
        assert tick().skip_message == "every event date has absorbed the batches that hold it"


def test_a_failed_events_run_is_asked_for_again_after_a_backoff(settings):
    """Its dates stay behind in the lake's bookkeeping, whatever the run's metadata says."""
    settings = settings.with_overrides(retry_backoff=timedelta(seconds=2))
    _batch(settings, "2026-01-20", ["2026-01-20T08:00:00Z", "2026-01-19T08:00:00Z"])
    ingest, events, ticks = _late_data(settings)
    with instance_for_test() as instance:
        tick = ticks(instance)

        assert ingest.execute_in_process(partition_key="2026-01-20", instance=instance).success
        (request,) = tick().run_requests
        # The batch's raw file is unreadable while the run reads it: the run fails.
        (raw_file,) = (settings.lake_dir / "raw_events").glob("received_date=*/*.parquet")
        good = raw_file.read_bytes()
        raw_file.write_bytes(b"not parquet")
        failed = events.execute_in_process(
            instance=instance, tags=request.tags, raise_on_error=False
        )
        assert not failed.success

        waiting = tick()  # within the backoff: not yet
        assert waiting.skip_message.startswith("2026-01-19..2026-01-20: 1 events_job run(s)")
        time.sleep(2.5)
        (retry,) = tick().run_requests
        assert _ranges(tick()) == [("2026-01-19", "2026-01-20")]
        assert retry.run_key != request.run_key  # a new attempt at the same state
        raw_file.write_bytes(good)
        assert events.execute_in_process(instance=instance, tags=retry.tags).success
        assert isinstance(tick(), SkipReason)


def test_the_stale_sessions_sensor_asks_for_automations_dates_and_heals_a_failed_run(settings):
    """Once an events run has ended the sensor asks for every session date around its range
    (what automation asks for a tick later) as one range run. Automation counts a failed run
    as handled; the lake's manifests and the instance still say its dates are behind, and the
    sensor asks for them again, after a backoff once its own attempt has failed."""
    settings = settings.with_overrides(retry_backoff=timedelta(seconds=2))
    _batch(settings, "2026-01-20", ["2026-01-20T08:00:00Z", "2026-01-20T08:10:00Z"])
    ingest, events, ticks = _late_data(settings)
    defs = build_definitions(settings, spark_ui=False)
    sessions = defs.resolve_job_def(SESSIONS_JOB)
    sensor = defs.resolve_sensor_def("stale_sessions_sensor")
    with instance_for_test() as instance:

        def stale():
            return sensor(build_sensor_context(instance=instance, definitions=defs))

        assert ingest.execute_in_process(partition_key="2026-01-20", instance=instance).success
        (request,) = ticks(instance)().run_requests
        assert events.execute_in_process(instance=instance, tags=request.tags).success
        (events_file,) = (settings.lake_dir / "events").glob("event_date=*/*.parquet")
        good = events_file.read_bytes()
        events_file.write_bytes(b"not parquet")
        (first,) = stale().run_requests
        window = ("2026-01-18", "2026-01-21")  # around the events run's 2026-01-19..20
        assert (first.tags[RANGE_START], first.tags[RANGE_END]) == window
        failed = sessions.execute_in_process(
            instance=instance, tags=first.tags, raise_on_error=False
        )
        assert not failed.success

        waiting = stale()  # its own attempt failed: within the backoff, not yet
        assert "retrying after" in waiting.skip_message
        time.sleep(2.5)
        (heal,) = stale().run_requests
        assert (heal.tags[RANGE_START], heal.tags[RANGE_END]) == window
        assert heal.run_key != first.run_key
        events_file.write_bytes(good)
        assert sessions.execute_in_process(instance=instance, tags=heal.tags).success
        assert stale().skip_message == (
            "every session date has absorbed the events its window holds"
        )


@pytest.mark.parametrize(
    ("days", "max_days", "expected"),
    [
        ([], 5, []),
        ([1, 2, 3], 5, [(1, 3)]),
        ([1, 3, 9], 5, [(1, 3), (9, 9)]),
        ([1, 2, 3, 4, 5, 6], 3, [(1, 3), (4, 6)]),
        ([5, 1, 5], 1, [(1, 1), (5, 5)]),
    ],
)
def test_contiguous_ranges(days, max_days, expected):
    as_dates = [date(2026, 1, d) for d in days]
    got = contiguous_ranges(as_dates, max_days=max_days)
    assert [(a.day, b.day) for a, b in got] == [(a, b) for a, b in expected]


def test_contiguous_ranges_without_bridging_gaps_break_at_a_missing_day():
    as_dates = [date(2026, 1, d) for d in (1, 2, 3, 5, 6, 7, 8)]
    got = contiguous_ranges(as_dates, max_days=3, bridge_gaps=False)
    assert [(a.day, b.day) for a, b in got] == [(1, 3), (5, 7), (8, 8)]


def _report(instance, asset: str, partition: str, **metadata) -> None:
    instance.report_runless_asset_event(
        AssetMaterialization(asset_key=asset, partition=partition, metadata=metadata)
    )


def test_lifecycle_sensor_asks_for_the_days_not_computed_and_from_the_sessions_reported_again(
    settings,
):
    defs = build_definitions(settings, spark_ui=False)
    sensor = defs.resolve_sensor_def("lifecycle_sensor")
    with instance_for_test() as instance:
        assert sensor(build_sensor_context(instance=instance, definitions=defs)).skip_reason
        for day in ("2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"):
            _report(instance, "user_lifecycle_snapshot", day)
        _report(instance, "raw_events", "2026-01-05", touched_event_dates=["2026-01-05"])
        # A range run over the 1st..6th: sessions changed on the 2nd (late) and the 6th (ahead
        # of every batch: no snapshot yet); the other dates are reported unchanged.
        for day in range(1, 7):
            _report(instance, "sessions", f"2026-01-0{day}", changed=day in (2, 6))
        # A sessions run still going may not have reported every date it changed: wait for it.
        going = instance.add_run(
            DagsterRun(
                job_name=SESSIONS_JOB, run_id=str(uuid4()), status=DagsterRunStatus.NOT_STARTED
            )
        )
        waiting = sensor(build_sensor_context(instance=instance, definitions=defs))
        assert "a sessions run is going" in waiting.skip_message
        instance.delete_run(going.run_id)

        # The run corrects the 2nd on; it reports every day from the 1st, the earliest sessions
        # date reported since the snapshot's days were (the 6th is past the latest batch).
        result = sensor(build_sensor_context(instance=instance, definitions=defs))
        assert [(r.tags[RANGE_START], r.tags[RANGE_END]) for r in result.run_requests] == [
            ("2026-01-01", "2026-01-05")
        ]
        cursor = result.cursor
        again = sensor(build_sensor_context(instance=instance, definitions=defs, cursor=cursor))
        assert again.run_requests == [] and again.skip_reason

        # A batch that touched no event date starts no sessions run: the sensor extends itself.
        _report(instance, "raw_events", "2026-01-06", touched_event_dates=[])
        result = sensor(build_sensor_context(instance=instance, definitions=defs, cursor=cursor))
        assert [(r.tags[RANGE_START], r.tags[RANGE_END]) for r in result.run_requests] == [
            ("2026-01-05", "2026-01-06")
        ]
        cursor = result.cursor

        # Every day computed: the 3rd's sessions reported again, changed or not, ask for the
        # 3rd through the latest day, so that none of them is left unsynced in the UI.
        for day in ("2026-01-05", "2026-01-06"):
            _report(instance, "user_lifecycle_snapshot", day)
        for changed in (True, False):
            _report(instance, "sessions", "2026-01-03", changed=changed)
            result = sensor(
                build_sensor_context(instance=instance, definitions=defs, cursor=cursor)
            )
            assert [(r.tags[RANGE_START], r.tags[RANGE_END]) for r in result.run_requests] == [
                ("2026-01-03", "2026-01-06")
            ]
            cursor = result.cursor
            for day in ("2026-01-03", "2026-01-04", "2026-01-05", "2026-01-06"):
                _report(instance, "user_lifecycle_snapshot", day)


def test_the_lifecycle_catches_up_with_a_batch_the_lake_ingested_but_dagster_never_saw(
    settings, store
):
    """An ingest run killed after its last commit (the landing record) has ingested its batch
    for good: the landing sensor will not ask for it again, though Dagster never recorded the
    materialization. The lifecycle's latest day is the lake's."""
    from sessionize_assets.pipeline.landing import fingerprint, record_ingested
    from sessionize_assets.resources.landing import LandingZoneResource
    from sessionize_assets.sensors import lifecycle_catch_up

    landing = LandingZoneResource(landing_dir=str(settings.landing_dir))
    batches = []
    for received in ("2026-01-01", "2026-01-02", "2026-01-03"):
        _batch(settings, received, [f"{received}T10:00:00Z"])
        day = date.fromisoformat(received)
        batches.append(fingerprint(day, landing.batch_files(day)))
    record_ingested(store, batches, ingest_version=0, run_id="killed")
    with instance_for_test() as instance:
        for received in ("2026-01-01", "2026-01-02"):
            _report(instance, "raw_events", received)
            _report(instance, "user_lifecycle_snapshot", received)
        assert lifecycle_catch_up(settings, instance) == (date(2026, 1, 3), date(2026, 1, 3))


@pytest.mark.parametrize(
    ("reported", "through", "latest", "failed_from", "expected"),
    [
        ([], None, None, None, None),  # nothing ingested yet
        ([], None, 3, None, (1, 3)),  # first run: from the start date
        ([], 3, 3, None, None),  # up to date
        ([], 3, 5, None, (4, 5)),  # new days only
        ([9], 5, 5, None, None),  # a change past the latest batch waits for that batch
        # Sessions from the 2nd materialized again: the run corrects what changed and reports
        # every day from the 2nd, so that none is left unsynced.
        ([2, 9], 5, 5, None, (2, 5)),
        ([4], 3, 5, None, (4, 5)),  # ... with the days not computed yet
        ([2], 3, 5, None, (2, 5)),
        ([], 5, 5, 3, (3, 5)),  # a failed run's days are reported again
        ([2], 3, 5, 1, (1, 5)),
    ],
)
def test_lifecycle_range(reported, through, latest, failed_from, expected):
    def day(n):
        return None if n is None else date(2026, 1, n)

    got = lifecycle_range(
        sessions_reported=[day(n) for n in reported],
        through=day(through),
        latest=day(latest),
        start=day(1),
        failed_from=day(failed_from),
    )
    assert got == (None if expected is None else (day(expected[0]), day(expected[1])))


def test_lifecycle_sensor_starts_the_next_range_where_a_failed_run_started(settings, spark):
    defs = build_definitions(settings, spark_ui=False)
    sensor = defs.resolve_sensor_def("lifecycle_sensor")
    with instance_for_test() as instance:
        _report(instance, "raw_events", "2026-01-05", touched_event_dates=["2026-01-05"])
        for day in ("2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"):
            _report(instance, "user_lifecycle_snapshot", day)
        first = sensor(build_sensor_context(instance=instance, definitions=defs))
        assert not first.run_requests  # a batch with events waits for its sessions run
        # A run over 3..5 fails: the sessions table it reads is corrupt.
        log = settings.lake_dir / "sessions" / "_delta_log"
        log.mkdir(parents=True)
        (log / "00000000000000000000.json").write_text("not a delta log\n")
        failed = defs.resolve_job_def(LIFECYCLE_JOB).execute_in_process(
            instance=instance,
            raise_on_error=False,
            tags={RANGE_START: "2026-01-03", RANGE_END: "2026-01-05"},
        )
        assert not failed.success

        _report(instance, "sessions", "2026-01-05", changed=True)
        result = sensor(
            build_sensor_context(instance=instance, definitions=defs, cursor=first.cursor)
        )
        assert [(r.tags[RANGE_START], r.tags[RANGE_END]) for r in result.run_requests] == [
            ("2026-01-03", "2026-01-05")
        ]


def test_landing_sensor_asks_for_new_and_changed_folders_only(settings):
    _batch(settings, "2026-01-02", ["2026-01-02T08:00:00Z"])
    _batch(settings, "2026-01-03", ["2026-01-03T08:00:00Z", "2026-01-01T08:00:00Z"])
    _batch(settings, "2026-01-05", ["2026-01-05T08:00:00Z"])
    defs = build_definitions(settings, spark_ui=False)
    sensor = defs.resolve_sensor_def("landing_sensor")
    job = defs.resolve_job_def(INGEST_JOB)

    def tick(cursor=None):
        return sensor(build_sensor_context(instance=instance, definitions=defs, cursor=cursor))

    with instance_for_test() as instance:
        first = tick()
        # Contiguous folders are one range run: the 2nd and 3rd, then the 5th.
        assert [(r.tags[RANGE_START], r.tags[RANGE_END]) for r in first.run_requests] == [
            ("2026-01-02", "2026-01-03"),
            ("2026-01-05", "2026-01-05"),
        ]
        assert tick().run_requests[0].run_key == first.run_requests[0].run_key
        for request in first.run_requests:
            assert job.execute_in_process(instance=instance, tags=request.tags).success
        done = tick(first.cursor)
        assert done.skip_reason.skip_message == "3 batch folders, none new or changed"
        assert done.cursor == "{}"  # every file is vouched for by the lake's record

        # Re-delivered as it was (files written again): nothing to do, and no file read twice.
        _batch(settings, "2026-01-03", ["2026-01-03T08:00:00Z", "2026-01-01T08:00:00Z"])
        same = tick(done.cursor)
        assert same.run_requests == [] and same.skip_reason
        assert list(json.loads(same.cursor)) == [
            str(settings.landing_dir.absolute() / "received_date=2026-01-03" / "part.jsonl")
        ]
        # Re-delivered with other content: that batch again, under a new run key.
        _batch(settings, "2026-01-03", ["2026-01-03T09:00:00Z"])
        changed = tick(same.cursor)
        assert [(r.tags[RANGE_START], r.tags[RANGE_END]) for r in changed.run_requests] == [
            ("2026-01-03", "2026-01-03")
        ]
        assert changed.run_requests[0].run_key not in {r.run_key for r in first.run_requests}
