"""Every Delta table sessionize writes (SPEC §5): name, columns and partition column."""

from __future__ import annotations

from pyspark.sql.types import (
    DateType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sessionize_assets.lake.store import TableSpec


def _fields(*columns: tuple[str, object, bool, str]) -> StructType:
    return StructType(
        [
            StructField(name, data_type, nullable, metadata={"comment": comment})  # type: ignore[arg-type]
            for name, data_type, nullable, comment in columns
        ]
    )


RAW_EVENTS = TableSpec(
    name="raw_events",
    partition_by="received_date",
    sort_by=("user_id", "event_ts"),
    description="Valid lines of each landing batch, parsed; one partition per received day.",
    schema=_fields(
        ("message_id", StringType(), False, "Segment messageId: the event id"),
        ("user_id", StringType(), False, "user key: userId if non-empty, else anonymousId"),
        ("segment_user_id", StringType(), True, "userId as sent (null when absent or empty)"),
        ("anonymous_id", StringType(), True, "anonymousId as sent"),
        ("event_ts", TimestampType(), False, "event time on the device, UTC"),
        ("event_date", DateType(), False, "UTC date of event_ts"),
        ("received_at", TimestampType(), False, "receivedAt, UTC"),
        ("received_date", DateType(), False, "the landing batch (received day)"),
        ("event_type", StringType(), True, "Segment type: track, page, screen, identify..."),
        ("event_name", StringType(), True, "Segment event name (track calls)"),
        ("properties", StringType(), True, "properties as a JSON string"),
        ("context", StringType(), True, "context as a JSON string"),
        ("extra", StringType(), True, "every other field of the message, as a JSON object"),
        ("source_file", StringType(), False, "landing file, relative to the landing folder"),
    ),
)

REJECTED_EVENTS = TableSpec(
    name="rejected_events",
    partition_by="received_date",
    description="Input lines that did not become events, with the first rule they broke.",
    schema=_fields(
        ("raw_line", StringType(), False, "the line exactly as received"),
        ("reason", StringType(), False, "SPEC §2 reason code"),
        ("detail", StringType(), True, "what exactly was wrong, for a human"),
        ("message_id", StringType(), True, "messageId when the line had a usable one"),
        ("received_date", DateType(), False, "the landing batch (received day)"),
        ("source_file", StringType(), False, "landing file, relative to the landing folder"),
    ),
)
