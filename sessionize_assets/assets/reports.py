"""What each asset reports on its materializations: one typed record per table and partition,
and one per asset step for its run's figures (`run_*`, on one partition of the run).

The assets write their metadata through these records, and `replay`, `rebuild` and the
benchmarks read it back through them (`replay/results.py`), so a key is written once, here. Each
record names its table (`table`): its asset key is the table's name.
"""

from __future__ import annotations

import re
from typing import ClassVar

from sessionize_assets.lake.store import TableSpec
from sessionize_assets.lake.tables import (
    ARRIVALS,
    DAILY_SESSIONS,
    EVENTS,
    RAW_EVENTS,
    REJECTED_EVENTS,
    SESSION_CHANGES,
    SESSIONS,
    USER_IDENTITIES,
    USER_LIFECYCLE_SNAPSHOT,
    USER_LIFECYCLE_STATE,
)
from sessionize_assets.transforms.channels import CHANNELS
from sessionize_assets.transforms.lifecycle_states import STATES
from sessionize_assets.typed_metadata import (
    ROW_COUNT_KEY,
    RUN_PREFIX,
    URI_KEY,
    MetadataRecord,
    Shown,
    entry,
    metadata_record,
)

# A partition's sessions by channel (SPEC §3b) as numeric entries, one per channel, so the
# Plots tab draws each over time.
CHANNEL_KEYS = {name: "sessions_" + re.sub(r"\W+", "_", name.lower()) for name in CHANNELS}
STATE_KEYS: dict[str, str] = {state: f"users_{state}" for state in STATES}


class AssetRecord(MetadataRecord):
    """A record of one table's materializations."""

    table: ClassVar[TableSpec]


class StepFigures(AssetRecord):
    """A step's figures over its whole run, on one materialization of the run only (the
    latest partition it reports): `run_<name>` entries, ending with the Spark jobs the step
    started."""

    prefix: ClassVar[str] = RUN_PREFIX
    # None on Spark Connect when the server's status API does not answer.
    spark_jobs: int | None


# -- ingest: a batch's `raw_events` and `rejected_events` partitions -------------------------


@metadata_record
class RawBatchMetadata(AssetRecord):
    """A batch's `raw_events` partition: its lines as ingested, and its files."""

    table: ClassVar[TableSpec] = RAW_EVENTS
    row_count: int = entry(key=ROW_COUNT_KEY)
    lines: int
    accepted: int
    rejected: int
    late_events: int
    event_dates: dict[str, int] = entry(shown=Shown.JSON)  # accepted events by event date
    lateness: dict[str, int] = entry(shown=Shown.JSON)  # accepted events by days late
    summary: str = entry(shown=Shown.MARKDOWN)
    files: int
    ignored_files: list[str] = entry(shown=Shown.JSON)
    batch_fingerprint: str
    batch_bytes: int
    uri: str = entry(key=URI_KEY, shown=Shown.PATH)
    delta_version: int
    index_version: int
    # What the late-data sensor requests: dates the batch holds now or held before.
    touched_event_dates: list[str] = entry(shown=Shown.JSON)


@metadata_record
class IngestRunMetadata(StepFigures):
    table: ClassVar[TableSpec] = RAW_EVENTS
    spark_jobs: int | None


@metadata_record
class RejectedBatchMetadata(AssetRecord):
    """A batch's `rejected_events` partition."""

    table: ClassVar[TableSpec] = REJECTED_EVENTS
    # The partition also holds this batch's cross-batch duplicates (from events).
    row_count: int = entry(key=ROW_COUNT_KEY)
    rejected_at_ingestion: int
    rejected_by_reason: dict[str, int] = entry(shown=Shown.JSON)
    uri: str = entry(key=URI_KEY, shown=Shown.PATH)
    delta_version: int
    summary: str = entry(shown=Shown.MARKDOWN)


# -- events: an event date -----------------------------------------------------------------


@metadata_record
class EventDateMetadata(AssetRecord):
    """An `events` partition as the table holds it after the run, and what the run did to it."""

    table: ClassVar[TableSpec] = EVENTS
    row_count: int = entry(key=ROW_COUNT_KEY)
    uri: str = entry(key=URI_KEY, shown=Shown.PATH)
    updated: bool  # the run absorbed new batch inputs of it
    recomputed: bool  # from raw, every batch (`full_refresh`)
    # Recomputed, and its rows differed from what the table held, so written again (a date
    # recomputed to the rows it holds is left as it is).
    replaced: bool
    copies_moved: bool  # a copy of one of its ids moved to or from another date
    events_added: int | None = entry(default=None)  # on the dates the run was asked for
    batches: int  # batches that hold events of it
    batches_absorbed: int
    delta_version: int
    summary: str = entry(shown=Shown.MARKDOWN)


@metadata_record
class EventsRunMetadata(StepFigures):
    table: ClassVar[TableSpec] = EVENTS
    dates_requested: int
    dates_updated: int
    batches_read: int
    raw_rows_read: int
    dates_also_changed: int
    contested_ids: int
    new_events: int
    displaced: int
    promoted: int
    duplicates_found: int
    rows_written: int
    files_added: int
    files_removed: int
    spark_jobs: int | None


# -- identities -----------------------------------------------------------------------------


@metadata_record
class IdentitiesMetadata(AssetRecord):
    """What a run did to `user_identities`, and what the table holds now."""

    table: ClassVar[TableSpec] = USER_IDENTITIES
    row_count: int = entry(key=ROW_COUNT_KEY)
    uri: str = entry(key=URI_KEY, shown=Shown.PATH)
    ids_newly_mapped: int
    ids_remapped: int
    ids_unmapped: int
    ids_recomputed: int
    identifying_events_read: int
    rebuilt: bool
    events_version_absorbed: int
    delta_version: int


@metadata_record
class IdentitiesRunMetadata(StepFigures):
    """On the identities step's own materialization (not on one a sessions run logs)."""

    table: ClassVar[TableSpec] = USER_IDENTITIES
    spark_jobs: int | None


# -- sessions: a session date, on each of its three tables -----------------------------------


@metadata_record
class SessionDateMetadata(AssetRecord):
    """What a sessions run reports for a session date on each of its three tables (their
    place, `dagster/uri`, is on its materialization of each table); read from `sessions`."""

    table: ClassVar[TableSpec] = SESSIONS
    row_count: int = entry(key=ROW_COUNT_KEY)
    changed: bool  # this run changed its sessions (the lifecycle sensor reads it)
    updated: bool  # brought up to date with its events
    recomputed: bool  # for every user
    delta_version: int


@metadata_record
class TableLocationMetadata(MetadataRecord):
    """Where a table is: on the sessions run's own materialization of each of its tables."""

    uri: str = entry(key=URI_KEY, shown=Shown.PATH)


@metadata_record
class SessionsChangedMetadata(AssetRecord):
    """How the run changed the date's sessions (a session both removed and added was
    replaced), for how many users."""

    table: ClassVar[TableSpec] = SESSIONS
    sessions_inserted: int
    sessions_replaced: int
    sessions_removed: int
    users_changed: int
    summary: str = entry(shown=Shown.MARKDOWN)


@metadata_record
class ChannelsMetadata(AssetRecord):
    """The date's sessions by channel and the share that are engaged, as the table holds
    them after the run."""

    table: ClassVar[TableSpec] = SESSIONS
    sessions_by_channel: dict[str, int] = entry(keys=CHANNEL_KEYS)
    engaged_share: float


@metadata_record
class ChangesLoggedMetadata(AssetRecord):
    table: ClassVar[TableSpec] = SESSION_CHANGES
    rows_logged: int  # a replaced session is logged twice: removed, then added


@metadata_record
class SessionsRunMetadata(StepFigures):
    table: ClassVar[TableSpec] = SESSIONS
    dates_requested: int
    dates_updated: int
    dates_changed: int
    users_recomputed: int
    pairs_recomputed: int
    # Touched (user, date) pairs whose sessions came from their old rows and added events,
    # their events unread (pipeline/sessions_additions.py), and the users they are of.
    pairs_from_additions: int
    users_from_additions: int
    dates_searched_by_user: int
    users_looked_up: int
    events_rows_scanned: int
    events_read: int
    sessions_inserted: int
    sessions_replaced: int
    sessions_removed: int
    rows_written: int
    files_rewritten: int
    # The files read to find the old rows of the changed pairs (the relabelled ones too),
    # of which `files_rewritten` held one.
    files_searched: int | None
    files_before: int
    ids_mapped_or_remapped: int
    sessions_relabelled: int
    dates_relabelled: int
    files_relabelled: int
    spark_jobs: int | None


# -- lifecycle: a snapshot day ---------------------------------------------------------------


@metadata_record
class SnapshotDayMetadata(AssetRecord):
    """A `user_lifecycle_snapshot` day as the table holds it after the run."""

    table: ClassVar[TableSpec] = USER_LIFECYCLE_SNAPSHOT
    users_by_state: dict[str, int] = entry(keys=STATE_KEYS)
    users_on_hand: int
    moves_in: int
    moves_out: int
    rewritten: bool  # this run rewrote the day
    row_count: int = entry(key=ROW_COUNT_KEY)
    uri: str = entry(key=URI_KEY, shown=Shown.PATH)
    delta_version: int
    # The trend shows other days, which a later run can rewrite without reporting this one
    # again: only the last day a run reports carries it.
    summary: str = entry(shown=Shown.MARKDOWN)


@metadata_record
class LifecycleStateDayMetadata(AssetRecord):
    table: ClassVar[TableSpec] = USER_LIFECYCLE_STATE
    users_with_a_state: int  # the day's rows in the per-user-per-day view (one per user)
    rewritten: bool
    uri: str = entry(key=URI_KEY, shown=Shown.PATH)
    delta_version: int


@metadata_record
class LifecycleRunMetadata(StepFigures):
    """What the whole run did to the intervals and the snapshot."""

    table: ClassVar[TableSpec] = USER_LIFECYCLE_STATE
    interval_rows: int
    users_restated: int
    restated_from_start: bool
    users_changed: int
    interval_rows_added: int
    interval_rows_removed: int
    # Rows in the files the commit added: new rows and those a rewritten file carried.
    interval_rows_written: int
    interval_files_rewritten: int
    snapshot_days_written: int
    spark_jobs: int | None


# -- the summaries (SPEC §9): an event date's arrivals, a session date's daily figures ---------


@metadata_record
class ArrivalsMetadata(AssetRecord):
    """`arrivals` as the table holds it after the run, and the grace period it gives at R."""

    table: ClassVar[TableSpec] = ARRIVALS
    row_count: int = entry(key=ROW_COUNT_KEY)  # one row per event date and lag
    uri: str = entry(key=URI_KEY, shown=Shown.PATH)
    event_dates: int
    events: int
    event_dates_counted: int  # counted again by this run (their events changed)
    latest_received: str  # R ("" before the first batch)
    grace_period_days: int
    reference_dates: str  # first..last
    reference_events: int
    # F(k), the share of the reference events at most k days late, for k up to the grace
    # period (at most assets/daily.CURVE_SHOWN_DAYS).
    completeness_by_lag: dict[str, float] = entry(shown=Shown.JSON)


@metadata_record
class DailySessionsMetadata(AssetRecord):
    """A `daily_sessions` partition as the table holds it after the run: the `(all)` row's
    figures (numbers, so the asset's Plots tab draws each over the dates), its status."""

    table: ClassVar[TableSpec] = DAILY_SESSIONS
    row_count: int = entry(key=ROW_COUNT_KEY)  # one row per channel, and (all)
    sessions: int
    users: int
    engaged_sessions: int
    converting_sessions: int
    page_views: int
    conversions: int
    duration_seconds: float
    quarantined_sessions: int
    status: str
    expected_completeness: float
    grace_period_days: int
    recomputed: bool  # this run aggregated it again (its sessions changed)
    restated: bool  # this run changed its status or expected completeness only
    summary: str = entry(shown=Shown.MARKDOWN)


# -- erasures (SPEC §8): the output of forget_job's and finish_erasures_job's ops -------------


@metadata_record
class ErasureBegunMetadata(MetadataRecord):
    """What `forget_job` did: the erasure recorded, and the batches ingested again without
    its keys' lines (each reported as a `raw_events` and `rejected_events` partition)."""

    erasure_id: str
    keys_given: int
    stitched_ids: int  # anonymousIds that user_identities mapped to a key given
    # Live rows that held an erased key when the erasure began: what it removes (the
    # corrections log's are kept without the key: `ErasureFinishedMetadata`).
    rows_removed: dict[str, int] = entry(shown=Shown.JSON)
    batches_ingested_again: list[str] = entry(shown=Shown.JSON)
    event_dates_behind: list[str] = entry(shown=Shown.JSON)  # what the events runs redo
    summary: str = entry(shown=Shown.MARKDOWN)
    spark_jobs: int | None


@metadata_record
class ErasureFinishedMetadata(MetadataRecord):
    """What `finish_erasures_job` did: the erasures it finished, the corrections-log rows
    that lost their key, and the data files deleted per table."""

    erasures_finished: list[str] = entry(shown=Shown.JSON)
    corrections_redacted: int
    files_deleted: dict[str, int] = entry(shown=Shown.JSON)
    spark_jobs: int | None


# The steps' figures, one record per asset step: each carries the Spark jobs its step started.
STEP_FIGURES: tuple[type[StepFigures], ...] = (
    IngestRunMetadata,
    EventsRunMetadata,
    IdentitiesRunMetadata,
    SessionsRunMetadata,
    LifecycleRunMetadata,
)


def reported_version(version: int | None) -> int:
    """A table's version as its metadata reports it: -1 when the run committed none."""
    return version if version is not None else -1
