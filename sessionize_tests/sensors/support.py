"""What the sensors' tests share: a batch folder, a runless report, one tick of a sensor."""

from __future__ import annotations

import json

from dagster import AssetMaterialization, SensorDefinition, build_sensor_context

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
