"""The lifecycle sensor reads every new materialization since its cursor, not only the latest."""

from __future__ import annotations

from uuid import uuid4

from dagster import (
    DagsterRun,
    DagsterRunStatus,
    instance_for_test,
)

from sessionize_assets.definitions import (
    LIFECYCLE_JOB,
    SESSIONS_JOB,
    build_definitions,
)
from sessionize_assets.partitions import RANGE_END, RANGE_START
from sessionize_tests.sensors.support import batch_reported, report, sessions_reported, tick


def test_lifecycle_sensor_asks_for_the_days_not_computed_and_from_the_sessions_reported_again(
    settings,
):
    defs = build_definitions(settings, spark_ui=False)
    sensor = defs.resolve_sensor_def("lifecycle_sensor")
    with instance_for_test() as instance:
        assert tick(sensor, defs, instance).skip_reason
        for day in ("2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"):
            report(instance, "user_lifecycle_snapshot", day)
        batch_reported(instance, "2026-01-05", touched_event_dates=["2026-01-05"])
        # A range run over the 1st..6th: sessions changed on the 2nd (late) and the 6th (ahead
        # of every batch: no snapshot yet); the other dates are reported unchanged.
        for day in range(1, 7):
            sessions_reported(instance, f"2026-01-0{day}", changed=day in (2, 6))
        # A sessions run still going may not have reported every date it changed: wait for it.
        going = instance.add_run(
            DagsterRun(
                job_name=SESSIONS_JOB, run_id=str(uuid4()), status=DagsterRunStatus.NOT_STARTED
            )
        )
        waiting = tick(sensor, defs, instance)
        assert "a sessions run is going" in waiting.skip_message
        instance.delete_run(going.run_id)

        # The run corrects the 2nd on; it reports every day from the 1st, the earliest sessions
        # date reported since the snapshot's days were (the 6th is past the latest batch).
        result = tick(sensor, defs, instance)
        assert [(r.tags[RANGE_START], r.tags[RANGE_END]) for r in result.run_requests] == [
            ("2026-01-01", "2026-01-05")
        ]
        cursor = result.cursor
        again = tick(sensor, defs, instance, cursor=cursor)
        assert again.run_requests == [] and again.skip_reason

        # A batch that touched no event date starts no sessions run: the sensor extends itself.
        batch_reported(instance, "2026-01-06", touched_event_dates=[])
        result = tick(sensor, defs, instance, cursor=cursor)
        assert [(r.tags[RANGE_START], r.tags[RANGE_END]) for r in result.run_requests] == [
            ("2026-01-05", "2026-01-06")
        ]
        cursor = result.cursor

        # Every day computed: the 3rd's sessions reported again, changed or not, ask for the
        # 3rd through the latest day, so that none of them is left unsynced in the UI.
        for day in ("2026-01-05", "2026-01-06"):
            report(instance, "user_lifecycle_snapshot", day)
        for changed in (True, False):
            sessions_reported(instance, "2026-01-03", changed=changed)
            result = tick(sensor, defs, instance, cursor=cursor)
            assert [(r.tags[RANGE_START], r.tags[RANGE_END]) for r in result.run_requests] == [
                ("2026-01-03", "2026-01-06")
            ]
            cursor = result.cursor
            for day in ("2026-01-03", "2026-01-04", "2026-01-05", "2026-01-06"):
                report(instance, "user_lifecycle_snapshot", day)


def test_lifecycle_sensor_starts_the_next_range_where_a_failed_run_started(settings, spark):
    defs = build_definitions(settings, spark_ui=False)
    sensor = defs.resolve_sensor_def("lifecycle_sensor")
    with instance_for_test() as instance:
        batch_reported(instance, "2026-01-05", touched_event_dates=["2026-01-05"])
        for day in ("2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"):
            report(instance, "user_lifecycle_snapshot", day)
        first = tick(sensor, defs, instance)
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

        sessions_reported(instance, "2026-01-05", changed=True)
        result = tick(sensor, defs, instance, cursor=first.cursor)
        assert [(r.tags[RANGE_START], r.tags[RANGE_END]) for r in result.run_requests] == [
            ("2026-01-03", "2026-01-05")
        ]
