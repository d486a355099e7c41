"""What the sensors' tests share: a batch folder, runless reports (as the assets write them),
one tick of a sensor."""

from __future__ import annotations

import json

from dagster import AssetMaterialization, SensorDefinition, build_sensor_context

from sessionize_assets.assets.reports import RawBatchMetadata, SessionDateMetadata
from sessionize_assets.definitions import EVENTS_JOB, INGEST_JOB, build_definitions
from sessionize_assets.partitions import RANGE_END, RANGE_START


def land_batch(settings, received: str, timestamps: list[str]) -> None:
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


def ranges(result) -> list[tuple[str, str]]:
    return [(r.tags[RANGE_START], r.tags[RANGE_END]) for r in result.run_requests]


def report(instance, asset: str, partition: str, **metadata) -> None:
    instance.report_runless_asset_event(
        AssetMaterialization(asset_key=asset, partition=partition, metadata=metadata)
    )


def batch_reported(instance, received: str, *, touched_event_dates: list[str]) -> None:
    """A batch's `raw_events` materialization, as ingest reports it (the figures that the
    lifecycle sensor does not read are placeholders)."""
    report(
        instance,
        "raw_events",
        received,
        **RawBatchMetadata(
            row_count=1, lines=1, accepted=1, rejected=0, late_events=0,
            event_dates={day: 1 for day in touched_event_dates}, lateness={"0": 1},
            summary="", files=1, ignored_files=[], batch_fingerprint="f", batch_bytes=1,
            uri="file:///lake/raw_events", delta_version=1, index_version=1,
            touched_event_dates=touched_event_dates,
        ).to_metadata(),
    )  # fmt: skip


def sessions_reported(instance, day: str, *, changed: bool) -> None:
    """A session date's `sessions` materialization, as a sessions run reports it."""
    report(
        instance,
        "sessions",
        day,
        **SessionDateMetadata(
            row_count=1, changed=changed, updated=True, recomputed=False, delta_version=1
        ).to_metadata(),
    )


def tick(sensor: SensorDefinition, defs, instance, *, cursor: str | None = None):
    """One evaluation of `sensor` with the Definitions' resources, as the daemon makes it."""
    with build_sensor_context(
        instance=instance, resources=defs.resources, cursor=cursor
    ) as context:
        return sensor(context)


def late_data_jobs(settings):
    """The ingest and events jobs, and a tick of the late-data sensor for an instance."""
    defs = build_definitions(settings, spark_ui=False)
    sensor = defs.resolve_sensor_def("late_data_sensor")

    def ticks(instance):
        return lambda: tick(sensor, defs, instance)

    return defs.resolve_job_def(INGEST_JOB), defs.resolve_job_def(EVENTS_JOB), ticks
