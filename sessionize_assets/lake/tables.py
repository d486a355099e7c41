"""Every Delta table sessionize writes (SPEC §5): name, columns and partition column."""

from __future__ import annotations

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sessionize_assets.lake.store import TableSpec
from sessionize_assets.transforms.attributes import CAMPAIGN_TYPE
from sessionize_assets.transforms.lifecycle import INTERVAL_SCHEMA, SNAPSHOT_SCHEMA

# Rows per sessions file: the unit a late event's correction rewrites (see SESSIONS).
SESSIONS_FILE_ROWS = 500
# Parquet row group of `events` (sorted by user): about 10,000 rows, a narrow range of users.
EVENTS_ROW_GROUP_BYTES = 4 * 1024 * 1024
# The `event_id` bloom filter of a row group is sized for this many ids (32 KiB at 1% false
# positives), with room above the rows a row group holds.
EVENTS_BLOOM_FILTER_NDV = 20_000
# Rows per user_lifecycle_state file: the unit a late session's interval correction rewrites.
LIFECYCLE_STATE_FILE_ROWS = 1_000


def _fields(*columns: tuple[str, DataType, bool, str]) -> StructType:
    return StructType(
        [
            StructField(name, data_type, nullable, metadata={"comment": comment})
            for name, data_type, nullable, comment in columns
        ]
    )


_SOURCE_FILE = ("source_file", StringType(), False, "landing file, relative to the landing folder")
_RAW_LINE = ("raw_line", StringType(), False, "the line exactly as received")
_EVENT_FIELDS = (
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
    # What the session attributes (SPEC §3b) are taken from, parsed once at ingestion
    # (transforms/attributes.py); a session reads these of its first page event, say.
    ("page_url", StringType(), True, "properties.url, else context.page.url"),
    ("page_path", StringType(), True, "properties.path, else context.page.path"),
    ("page_referrer", StringType(), True, "properties.referrer, else context.page.referrer"),
    ("page_host", StringType(), True, "page_url's host, lower-case, without www."),
    ("referrer_host", StringType(), True, "page_referrer's host, lower-case, without www."),
    (
        "campaign",
        CAMPAIGN_TYPE,
        True,
        "context.campaign's source, medium, name, term, content (null: not a non-empty object)",
    ),
    ("url_campaign", CAMPAIGN_TYPE, True, "page_url's utm_* query parameters, form-decoded"),
    ("device_type", StringType(), True, "context.device.type, else web with a userAgent"),
    ("os_name", StringType(), True, "context.os.name"),
    _SOURCE_FILE,
)

RAW_EVENTS = TableSpec(
    name="raw_events",
    partition_by="received_date",
    sort_by=("event_date", "user_id", "event_ts"),
    description="Valid lines of each landing batch, parsed; one partition per received day.",
    schema=_fields(
        ("message_id", StringType(), False, "Segment messageId: the event id"),
        *_EVENT_FIELDS,
        _RAW_LINE,
    ),
)

REJECTED_EVENTS = TableSpec(
    name="rejected_events",
    partition_by="received_date",
    compact=True,  # every events run adds its cross-batch duplicates as small files
    description="Input lines that did not become events, with the first rule they broke.",
    schema=_fields(
        ("raw_line", StringType(), False, "the line as received (see raw_bytes)"),
        ("reason", StringType(), False, "SPEC §2 reason code"),
        ("detail", StringType(), True, "what exactly was wrong, for a human"),
        ("message_id", StringType(), True, "messageId when the line had a usable one"),
        ("received_date", DateType(), False, "the landing batch (received day)"),
        _SOURCE_FILE,
        ("origin", StringType(), False, "ingest (validation, in-batch copies) or events (dedup)"),
        ("event_date", DateType(), True, "for cross-batch duplicates: the copy's event date"),
        (
            "raw_bytes",
            BinaryType(),
            True,
            "invalid_encoding: the line's exact bytes (raw_line shows them with U+FFFD)",
        ),
    ),
)

# The id index: every valid copy of every messageId, by batch. SPEC §2's winner of an id is
# its copy in the earliest batch, on whatever date each copy's timestamp falls, so a batch's
# ids are looked up here across every date at once (pipeline/event_ids.py). A lookup reads the
# 8-byte `id_hash` column of every batch, then `event_id` only of the batches with a match.
EVENT_IDS = TableSpec(
    name="event_ids",
    partition_by="received_date",
    sort_by=("id_hash",),
    description="Every valid copy of each messageId (one per batch): where the copies of an "
    "id are, on any event date.",
    schema=_fields(
        ("id_hash", LongType(), False, "xxhash64 of event_id: what a lookup scans"),
        ("event_id", StringType(), False, "Segment messageId"),
        ("event_date", DateType(), False, "UTC date of this copy's timestamp"),
        ("received_date", DateType(), False, "the landing batch that holds this copy"),
    ),
)

BATCH_EVENT_DATES = TableSpec(
    name="batch_event_dates",
    partition_by="received_date",
    description="Which event dates each received batch holds: what late data touches.",
    schema=_fields(
        ("received_date", DateType(), False, "the landing batch"),
        ("event_date", DateType(), False, "an event date the batch holds events for"),
        ("events", LongType(), False, "accepted raw rows of the batch on that event date"),
        ("ingest_version", LongType(), False, "raw_events version that wrote the batch"),
    ),
)


LANDING_BATCHES = TableSpec(
    name="landing_batches",
    partition_by="received_date",
    description=(
        "The files each ingested batch was read from: what the landing sensor compares the "
        "landing zone with, so an unchanged folder causes no work."
    ),
    schema=_fields(
        ("received_date", DateType(), False, "the landing batch"),
        ("fingerprint", StringType(), False, "SHA-256 of the batch's file names, sizes, digests"),
        (
            "files",
            StringType(),
            False,
            "the files read, by name: JSON [{name, bytes, modified_ns, sha256}]",
        ),
        ("ingest_version", LongType(), False, "raw_events version that holds the batch"),
        ("run_id", StringType(), True, "the Dagster run that ingested it"),
        ("ingested_at", TimestampType(), False, "when"),
    ),
)


EVENTS_MANIFEST = TableSpec(
    name="events_manifest",
    partition_by="partition_date",
    description="Per events partition, the (event date, batch, version) inputs it absorbed.",
    schema=_fields(
        ("partition_date", DateType(), False, "the events partition"),
        ("event_date", DateType(), False, "an input event date"),
        ("received_date", DateType(), False, "an input batch"),
        ("ingest_version", LongType(), False, "the batch's raw_events version"),
        ("run_id", StringType(), True, "the Dagster run that absorbed it"),
        ("processed_at", TimestampType(), False, "when"),
        (
            "events_version",
            LongType(),
            True,
            "events table version that holds what the partition absorbed (null: before it "
            "was recorded); sessions dates that absorbed an older one are behind",
        ),
    ),
)

SESSIONS_MANIFEST = TableSpec(
    name="sessions_manifest",
    partition_by="partition_date",
    description=(
        "Per sessions partition, the events table version it has absorbed and the session "
        "definition it was computed with."
    ),
    schema=_fields(
        ("partition_date", DateType(), False, "the sessions partition"),
        ("events_version", LongType(), False, "events table version absorbed"),
        ("definition", StringType(), False, "gap and cap the partition was computed with"),
        ("run_id", StringType(), True, "the Dagster run that absorbed it"),
        ("processed_at", TimestampType(), False, "when"),
    ),
)

EVENTS = TableSpec(
    name="events",
    partition_by="event_date",
    sort_by=("user_id", "event_ts", "event_id"),
    # The duplicate rule looks up the ids of new copies, and sessions the events of the users
    # a change touched: both read a few rows of many dates, which these two settings prune.
    bloom_filter_columns=("event_id",),
    bloom_filter_ndv=EVENTS_BLOOM_FILTER_NDV,
    row_group_bytes=EVENTS_ROW_GROUP_BYTES,
    description="Accepted, deduplicated events by the UTC day they happened.",
    schema=_fields(
        ("event_id", StringType(), False, "Segment messageId"),
        *_EVENT_FIELDS,
    ),
)

SESSIONS = TableSpec(
    name="sessions",
    partition_by="session_date",
    sort_by=("user_id", "session_start"),
    # Late events touch a few users on many old days: small user-range files keep the
    # copy-on-write of a correction small.
    file_rows=SESSIONS_FILE_ROWS,
    description="User sessions by the UTC day they started (SPEC §3).",
    schema=_fields(
        ("session_id", StringType(), False, "deterministic: hash of user key and start"),
        ("user_id", StringType(), False, "user key"),
        ("session_date", DateType(), False, "UTC date of session_start"),
        ("session_start", TimestampType(), False, "first event's time"),
        ("session_end", TimestampType(), False, "last included event's time"),
        ("duration_seconds", DoubleType(), False, "session_end - session_start"),
        ("event_count", LongType(), False, "events included"),
        ("session_number", IntegerType(), False, "1-based rank among the user's sessions that day"),
        ("is_quarantined", BooleanType(), False, "the chain ran past the maximum length"),
        # SPEC §3b, over the included events in (event_ts, event_id) order. Nullable, as
        # columns a table gains are: a session written before them has none.
        ("page_views", LongType(), True, "included page and screen events"),
        ("conversions", LongType(), True, "included track events named a conversion"),
        ("landing_page_url", StringType(), True, "the first page event's URL"),
        ("landing_page_path", StringType(), True, "the first page event's path"),
        ("exit_page_url", StringType(), True, "the last page event's URL"),
        ("referrer", StringType(), True, "the first page event's referrer"),
        ("referrer_host", StringType(), True, "referrer's host, lower-case, without www."),
        ("utm_source", StringType(), True, "the first campaign's source, else the landing URL's"),
        ("utm_medium", StringType(), True, "the first campaign's medium, else the landing URL's"),
        ("utm_campaign", StringType(), True, "the first campaign's name, else the landing URL's"),
        ("utm_term", StringType(), True, "the first campaign's term, else the landing URL's"),
        ("utm_content", StringType(), True, "the first campaign's content, else the URL's"),
        ("channel", StringType(), True, "default channel group (README: Session attributes)"),
        ("is_engaged", BooleanType(), True, ">= 10 s, or >= 2 page views, or a conversion"),
        ("device_type", StringType(), True, "the first event's device type, else web"),
        ("os_name", StringType(), True, "the first event's operating system"),
        # SPEC §3c: user_identities' user_id for this user key, else the user key itself.
        ("stitched_user_id", StringType(), True, "the signed-in user this user key maps to"),
        # Where the session's picks came from (SESSION_PICKS): what a late event is merged
        # with, without reading the session's events (pipeline/sessions_additions.py). Null in
        # a row written before them.
        ("first_event_id", StringType(), True, "the first event's id (its time: session_start)"),
        ("landing_at", TimestampType(), True, "the first page event's time (the landing page)"),
        ("exit_at", TimestampType(), True, "the last page event's time (the exit page)"),
        ("campaign_at", TimestampType(), True, "the first event with a campaign: its time"),
    ),
)
# The columns of `sessions` that say where its attributes were picked from: not a session's
# content (the corrections log compares and logs the others), but what lets the sessions of a
# late event be updated from their old rows.
SESSION_PICKS = ("first_event_id", "landing_at", "exit_at", "campaign_at")

# Rows per user_identities file: the unit a changed mapping's copy-on-write rewrites.
IDENTITIES_FILE_ROWS = 5_000

# SPEC §3c. Partitioned by the day an id was first identified: new sign-ins land in recent
# partitions. The first and latest identified events (by event_ts, event_id) are kept so that
# new events merge into a row exactly, and a removed event is known to matter only when it
# was one of those two (pipeline/identities.py).
USER_IDENTITIES = TableSpec(
    name="user_identities",
    partition_by="identified_date",
    sort_by=("anonymous_id",),
    file_rows=IDENTITIES_FILE_ROWS,
    description="Which signed-in user each anonymous id belongs to (identity stitching).",
    schema=_fields(
        ("anonymous_id", StringType(), False, "an anonymousId seen with a userId"),
        ("user_id", StringType(), False, "userId of its latest event with one"),
        ("identified_at", TimestampType(), False, "event_ts of its first event with a userId"),
        ("identified_date", DateType(), False, "UTC date of identified_at"),
        ("first_event_id", StringType(), False, "that first event"),
        ("latest_at", TimestampType(), False, "event_ts of the latest event with a userId"),
        ("latest_event_id", StringType(), False, "that latest event"),
    ),
)

SESSION_QUARANTINE = TableSpec(
    name="session_quarantine",
    partition_by="session_date",
    sort_by=("user_id", "session_start"),
    description="Sessions whose chain of events ran past the maximum session length.",
    schema=_fields(
        ("session_id", StringType(), False, "the quarantined session"),
        ("user_id", StringType(), False, "user key"),
        ("session_date", DateType(), False, "UTC date of session_start"),
        ("session_start", TimestampType(), False, "first event's time"),
        ("capped_at", TimestampType(), False, "session_start + maximum length"),
        ("chain_end", TimestampType(), False, "last event of the chain, past the cap"),
        ("excluded_events", LongType(), False, "chain events after capped_at (in no session)"),
        ("reason", StringType(), False, "exceeds_max_session_length"),
    ),
)

SESSION_CHANGES = TableSpec(
    name="session_changes",
    partition_by="session_date",
    sort_by=("run_id", "session_id"),
    compact=True,  # every run appends small files to the days it corrected
    description="Corrections log: sessions each run removed and added.",
    schema=_fields(
        ("change", StringType(), False, "added or removed"),
        ("session_id", StringType(), False, "the session"),
        ("user_id", StringType(), False, "user key"),
        ("session_date", DateType(), False, "the session's date"),
        ("session_start", TimestampType(), False, "its start"),
        ("session_end", TimestampType(), False, "its end"),
        ("event_count", LongType(), False, "its events"),
        ("commit_version", LongType(), False, "sessions table version the change is in"),
        ("run_id", StringType(), False, "the Dagster run"),
        ("changed_at", TimestampType(), False, "when"),
    ),
)

# Partitioned by the day a stretch ended: the current stretches (valid_to = OPEN_END) are one
# small partition that each new day rewrites; a finished stretch is written once, into the day
# it ended, and rewritten only when a late session changes it.
USER_LIFECYCLE_STATE = TableSpec(
    name="user_lifecycle_state",
    partition_by="valid_to",
    sort_by=("user_id", "valid_from"),
    file_rows=LIFECYCLE_STATE_FILE_ROWS,
    description=(
        "Each user's lifecycle as intervals: one row per stretch of days in one state "
        "(valid_to = 9999-12-31 while it is current)."
    ),
    schema=INTERVAL_SCHEMA,
)

USER_LIFECYCLE_SNAPSHOT = TableSpec(
    name="user_lifecycle_snapshot",
    partition_by="snapshot_date",
    sort_by=("state",),
    description="Users per lifecycle state at the end of each day, with entries and exits.",
    schema=SNAPSHOT_SCHEMA,
)

# SPEC §9: the arrival curve, the accepted events of each event date by how many days after it
# they were received. Rewritten for the event dates whose `events` a run changed.
ARRIVALS = TableSpec(
    name="arrivals",
    partition_by="event_date",
    sort_by=("lag_days",),
    description="Accepted events by event date and lag in days (received_date - event_date).",
    schema=_fields(
        ("event_date", DateType(), False, "the event date"),
        ("lag_days", IntegerType(), False, "received_date - event_date of its events rows"),
        ("events", LongType(), False, "accepted events of that date with that lag"),
    ),
)

# SPEC §9: what analysts report from, a few rows a date, with how final the date is.
DAILY_SESSIONS = TableSpec(
    name="daily_sessions",
    partition_by="session_date",
    sort_by=("channel",),
    description=(
        "Per session date, its sessions by channel and for (all), and how final the date is "
        "(status, expected_completeness: SPEC §9)."
    ),
    schema=_fields(
        ("session_date", DateType(), False, "the sessions' date"),
        ("channel", StringType(), True, "a channel with a session that day, or (all)"),
        ("sessions", LongType(), False, "sessions, quarantined ones included"),
        ("users", LongType(), False, "distinct stitched_user_id"),
        ("engaged_sessions", LongType(), False, "sessions with is_engaged"),
        ("converting_sessions", LongType(), False, "sessions with a conversion"),
        ("page_views", LongType(), True, "their page views (null: none recorded)"),
        ("conversions", LongType(), True, "their conversions (null: none recorded)"),
        ("duration_seconds", DoubleType(), False, "their durations, summed"),
        ("quarantined_sessions", LongType(), False, "sessions with is_quarantined"),
        ("status", StringType(), False, "complete or provisional: the date's (SPEC §9)"),
        (
            "expected_completeness",
            DoubleType(),
            False,
            "F(R - date): the share of its events expected to have arrived",
        ),
    ),
)

# Per date of each summary table (arrivals, daily_sessions), which files of its source table
# (events, sessions) its rows were counted from: a date whose source files changed since (a late
# event, a relabel by stitching, an erasure) is behind, whatever run changed them.
SUMMARIES_MANIFEST = TableSpec(
    name="summaries_manifest",
    partition_by="summary",
    description="Per date of arrivals and daily_sessions, the source files it was counted from.",
    schema=_fields(
        ("summary", StringType(), False, "the summary table: arrivals or daily_sessions"),
        ("partition_date", DateType(), False, "its partition (event or session date)"),
        ("source_files", StringType(), False, "SHA-256 of the source partition's file names"),
        ("run_id", StringType(), True, "the Dagster run that counted it"),
        ("processed_at", TimestampType(), False, "when"),
    ),
)

# SPEC §8: one row per erased key, as its salted hash (transforms/erased.py), never the key.
# Read on the driver by every ingestion (an erased key's lines are rejected) and erasure.
ERASURES = TableSpec(
    name="erasures",
    partition_by="requested_date",
    description="Each erasure on request (SPEC §8): salted hashes of its keys, when, and the "
    "rows it removed per table.",
    schema=_fields(
        ("erasure_id", StringType(), False, "the run that requested it"),
        ("requested_date", DateType(), False, "UTC date of requested_at"),
        ("requested_at", TimestampType(), False, "when it was requested"),
        ("salt", StringType(), False, "the lake's salt, the same in every row"),
        ("key_hash", StringType(), False, "SHA-256 of salt + key, hex"),
        ("stitched", BooleanType(), False, "an anonymousId stitched to a key given (else given)"),
        (
            "rows_removed",
            StringType(),
            False,
            "JSON {table: rows}: the rows it removes (those that held its keys when it began; "
            "the corrections log's are kept, without the key)",
        ),
        (
            "batches",
            StringType(),
            False,
            "JSON [received days]: the batches it ingests again without its keys' lines",
        ),
        ("finished_at", TimestampType(), True, "when its last file was deleted (null: not yet)"),
    ),
)

# Every table of the lake, in the order data flows through them (what maintenance goes over).
ALL_TABLES = (
    RAW_EVENTS,
    REJECTED_EVENTS,
    EVENT_IDS,
    BATCH_EVENT_DATES,
    LANDING_BATCHES,
    EVENTS_MANIFEST,
    EVENTS,
    USER_IDENTITIES,
    SESSIONS_MANIFEST,
    SESSIONS,
    SESSION_QUARANTINE,
    SESSION_CHANGES,
    USER_LIFECYCLE_STATE,
    USER_LIFECYCLE_SNAPSHOT,
    ARRIVALS,
    SUMMARIES_MANIFEST,
    DAILY_SESSIONS,
    ERASURES,
)
