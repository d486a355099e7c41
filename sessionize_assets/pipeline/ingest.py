"""A landing batch -> its raw_events and rejected_events partitions and its index entry."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.lake.placement import spread_for_collect
from sessionize_assets.lake.store import CommitInfo, DeltaStore
from sessionize_assets.lake.tables import BATCH_EVENT_DATES, EVENT_IDS, RAW_EVENTS, REJECTED_EVENTS
from sessionize_assets.pipeline.erased_keys import erased_keys
from sessionize_assets.pipeline.event_ids import id_hash
from sessionize_assets.pipeline.event_ids import index_rows as event_id_rows
from sessionize_assets.pipeline.landing import BatchFingerprint, record_ingested
from sessionize_assets.pipeline.manifests import batch_event_dates as indexed_event_dates
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.copies import rank_copies, split_batch, split_collected
from sessionize_assets.transforms.parsed_rows import parsed_rows
from sessionize_assets.transforms.validation import (
    ERASED,
    INGEST,
    REASONS,
    mark_erased,
    parse_lines,
    without_erased,
)

# The most text one partition of a batch holds when it is collected (`_commit_on_driver`):
# Spark's task builds a partition's Arrow rows whole (about twice its text) and the driver
# holds them. With the default 1 GB driver, 45 MB of text a partition fit and 64 MB did not
# (a day of 127 MB of text in 16.3 MB of gzip, in the two shuffle partitions): a quarter of
# that leaves room for the driver's other work.
COLLECTED_TEXT_PER_PARTITION = 16 << 20
# A batch whose text is known (`text_bytes`) is collected to the driver up to this many times
# `driver_write_bytes` of it: its rows are held in the driver's Python process (at the peak,
# the collected rows, the accepted ones and the write's sorted copy: about 8 bytes a byte of
# text), not in Spark's heap, which hands them over a partition of COLLECTED_TEXT_PER_PARTITION
# at a time. A day of the full size's zone (66 MB of text) is ingested in one Spark job
# instead of five by Spark's writer, in about 60% of the time (docs/benchmarks.md).
COLLECTED_TEXT_FACTOR = 4
# The most text one partition holds when a large batch's copies are ranked by Spark's
# executors (`rank_copies` sorts each partition's parsed rows, about twice their text). In
# local mode a shuffle makes one partition per core: a backlog of 59 days (737 MB of text)
# sorted about 320 MB a task with the default 1 GB driver and spilled 656 MB to disk.
RANKED_TEXT_PER_PARTITION = 64 << 20


@dataclass(frozen=True, kw_only=True)
class BatchIngested:
    """What one committed batch holds: drives the late-data sensor and the UI."""

    received: date
    events_by_date: dict[date, int]  # accepted rows per event date
    rejected_by_reason: dict[str, int]
    # Event dates whose inputs changed: the batch's dates now, and any it held before.
    touched_event_dates: list[date]

    @property
    def accepted(self) -> int:
        return sum(self.events_by_date.values())

    @property
    def rejected(self) -> int:
        return sum(self.rejected_by_reason.values())


@dataclass(frozen=True, kw_only=True)
class IngestResult:
    raw: CommitInfo
    event_ids: CommitInfo
    rejected: CommitInfo
    index: CommitInfo
    landing: CommitInfo
    batches: dict[date, BatchIngested]


def ingest_landed(
    store: DeltaStore,
    landing: LandingZoneResource,
    spark: Callable[[], SparkSession],
    *,
    fingerprints: Mapping[date, BatchFingerprint],
    settings: Settings,
    run_id: str,
) -> IngestResult:
    """`ingest_batches` of these landing batches (those `fingerprints` names). Batches whose
    text (`text_bytes`) is within `Settings.driver_write_bytes` and plain UTF-8 are read and
    parsed on the driver, with no Spark job (`transforms/parsed_rows.py`); any others are
    read by Spark (`spark`, called only then). The driver parses a line at a time, Spark's
    Python workers one per core: past that bound (a day of the full size's zone, 66 MB of
    text), Spark's job is the quicker once its session runs."""
    days = sorted(fingerprints)
    text_bytes = landing.text_bytes(days)
    plain = (
        landing.read_plain_lines(days)
        if text_bytes is not None and store.collects_on_driver(text_bytes)
        else None
    )
    return ingest_batches(
        store,
        plain if plain is not None else landing.read_lines(spark(), days),
        fingerprints=fingerprints,
        settings=settings,
        run_id=run_id,
        text_bytes=text_bytes,
    )


def ingest_batches(
    store: DeltaStore,
    lines: DataFrame | pa.Table,
    *,
    fingerprints: Mapping[date, BatchFingerprint],
    settings: Settings,
    run_id: str,
    text_bytes: int | None = None,
    erasing: bool = False,
) -> IngestResult:
    """Validate the lines of these batches (those `fingerprints` names); replace their raw rows,
    their id index, their rejections and their index entries, one commit per table however
    many batches (a backfill is one Spark job), and record last what each batch was read from.

    A listed batch without lines becomes empty. The fingerprints are taken before the lines are
    read: a file that changes in between is seen as changed again, never as ingested. A line of
    an erased key is an `erased` rejection; `erasing` (an erasure ingesting a batch again from
    the lake's own lines, `pipeline/forget.py`) drops it instead, and keeps the batch's
    earlier `erased` rejections.

    Lines the driver read (`pa.Table`: `read_plain_lines`) are parsed and written from there,
    with no Spark job. Of lines in a Spark frame, a small batch is collected and written from
    the driver: one whose `text_bytes` (the files' text, gzip uncompressed, about ten times
    their size) are within COLLECTED_TEXT_FACTOR times `Settings.driver_write_bytes`, or, with
    `text_bytes` None (lines from the lake), whose lines Spark estimates within it. Spark
    hands its rows over a partition at a time, each whole in the driver's heap: the lines are
    spread over partitions of at most COLLECTED_TEXT_PER_PARTITION bytes of text, so a batch
    fits the default 1 GB driver whatever its text. A larger batch is written by Spark's
    executors, its lines spread over partitions of at most RANKED_TEXT_PER_PARTITION bytes of
    text for the ranking of their copies.
    """
    days = sorted(fingerprints)
    tags = {"dagster_run_id": run_id, "received_dates": f"{days[0]}..{days[-1]}" if days else ""}
    if isinstance(lines, pa.Table):
        if erasing:
            raise ValueError("an erasure ingests the lake's own lines, in Spark")
        parsed = parsed_rows(
            lines,
            start_date=settings.start_date,
            future_tolerance=settings.future_tolerance,
            max_line_bytes=settings.max_line_bytes,
            erased=erased_keys(store),
        )
        written = _commit_on_driver(store, parsed, days=days, tags=tags, keep_erased=False)
    else:
        written = _ingest_frame(
            store,
            lines,
            days=days,
            tags=tags,
            settings=settings,
            text_bytes=text_bytes,
            erasing=erasing,
        )
    raw = written.raw
    before = indexed_event_dates(store, days)
    index_rows = [
        {
            "received_date": row["received_date"],
            "event_date": row["event_date"],
            "events": row["count"],
            "ingest_version": raw.version or 0,
        }
        for row in sorted(written.by_date, key=lambda r: (r["received_date"], r["event_date"]))
    ]
    index = store.replace_partitions_arrow(
        BATCH_EVENT_DATES,
        pa.Table.from_pylist(index_rows, schema=to_arrow_schema(BATCH_EVENT_DATES.schema)),
        partitions=days,
        commit_metadata=tags,
    )
    landing = record_ingested(
        store, fingerprints.values(), ingest_version=raw.version or 0, run_id=run_id
    )
    # An erasure keeps the batches' `erased` rejections (the lines that landed after an
    # earlier one): they are the batches' lines too.
    kept = _erased_rejections(store, days) if erasing else {}
    batches = {}
    for day in days:
        events = {r["event_date"]: r["events"] for r in index_rows if r["received_date"] == day}
        reasons = {reason: 0 for reason in REASONS}
        reasons.update(
            {r["reason"]: r["count"] for r in written.by_reason if r["received_date"] == day}
        )
        reasons[ERASED] += kept.get(day, 0)
        batches[day] = BatchIngested(
            received=day,
            events_by_date=events,
            rejected_by_reason=reasons,
            touched_event_dates=sorted(set(before.get(day, [])) | set(events)),
        )
    return IngestResult(
        raw=raw,
        event_ids=written.event_ids,
        rejected=written.rejected,
        index=index,
        landing=landing,
        batches=batches,
    )


def _ingest_frame(
    store: DeltaStore,
    lines: DataFrame,
    *,
    days: list[date],
    tags: dict[str, str],
    settings: Settings,
    text_bytes: int | None,
    erasing: bool,
) -> _Written:
    """`ingest_batches`' commits of lines in a Spark frame: collected and written from the
    driver when they fit it, else by Spark's executors."""
    marked = mark_erased(
        parse_lines(
            lines,
            start_date=settings.start_date,
            future_tolerance=settings.future_tolerance,
            max_line_bytes=settings.max_line_bytes,
        ),
        erased_keys(store),
    )
    parsed = without_erased(marked) if erasing else marked
    on_driver = (
        store.writes_on_driver(lines)
        if text_bytes is None
        else store.collects_on_driver(text_bytes // COLLECTED_TEXT_FACTOR)
    )
    if text_bytes is not None:
        # By the in-batch duplicates' window keys: Spark's window reads this shuffle, no
        # other (and hashed rows need no sort, where a round robin sorts them first).
        parsed = spread_for_collect(
            parsed,
            text_bytes,
            per_partition=COLLECTED_TEXT_PER_PARTITION if on_driver else RANKED_TEXT_PER_PARTITION,
            keys=("received_date", "message_id"),
        )
    if on_driver:
        written = _commit_on_driver(
            store,
            parsed.withColumn("id_hash", id_hash("message_id")).toArrow(),
            days=days,
            tags=tags,
            keep_erased=erasing,
        )
    else:
        # Parsed (Python) and ranked (a shuffle of every column) once, read by each commit: on
        # disk, not in the driver's heap, which a backlog's lines outgrow.
        ranked = rank_copies(parsed).persist(StorageLevel.DISK_ONLY)
        try:
            accepted, rejected = split_batch(ranked)
            written = _commit_with_spark(
                store, accepted, rejected, days=days, tags=tags, keep_erased=erasing
            )
        finally:
            ranked.unpersist()
    return written


def _erased_rejections(store: DeltaStore, days: list[date]) -> dict[date, int]:
    """`erased` rejections per batch, read on the driver (a batch's rejections are few)."""
    rows = store.read_arrow(REJECTED_EVENTS, partitions=days, columns=["received_date", "reason"])
    erased = rows.filter(pc.equal(rows.column("reason"), ERASED))
    return dict(Counter(erased.column("received_date").to_pylist()))


@dataclass(frozen=True, kw_only=True)
class _Written:
    """A batch's three commits, and what they hold: accepted rows per (received_date,
    event_date) and rejections per (received_date, reason), as `count` rows."""

    raw: CommitInfo
    event_ids: CommitInfo
    rejected: CommitInfo
    by_date: list[dict[str, Any]]
    by_reason: list[dict[str, Any]]


def _commit_with_spark(
    store: DeltaStore,
    accepted: DataFrame,
    rejected: DataFrame,
    *,
    days: list[date],
    tags: dict[str, str],
    keep_erased: bool,
) -> _Written:
    """A large batch (or any, on the delta-spark backend): counted in one Spark job, each
    table written from its frame."""
    # Counted before the commit, from the frames being written: no re-scan afterwards.
    # Accepted rows per event date and rejections per reason (never null), in one job.
    counted = [
        row.asDict()
        for row in accepted.groupBy("received_date", "event_date")
        .count()
        .unionByName(rejected.groupBy("received_date", "reason").count(), allowMissingColumns=True)
        .collect()
    ]
    raw = store.replace_partitions(RAW_EVENTS, accepted, partitions=days, commit_metadata=tags)
    # The id index, before the received -> event index that makes `events` read the batch.
    event_ids = store.replace_partitions(
        EVENT_IDS, event_id_rows(accepted), partitions=days, commit_metadata=tags
    )
    # rejected_events also holds the cross-batch duplicates `events` owns: keep those.
    ingested = F.col("origin") == INGEST
    rejected_commit = store.rewrite(
        REJECTED_EVENTS,
        partitions=days,
        drop=ingested & (F.col("reason") != ERASED) if keep_erased else ingested,
        add=lambda: rejected,
        commit_metadata=tags,
    )
    return _Written(
        raw=raw,
        event_ids=event_ids,
        rejected=rejected_commit,
        by_date=[row for row in counted if row["reason"] is None],
        by_reason=[row for row in counted if row["reason"] is not None],
    )


def _commit_on_driver(
    store: DeltaStore,
    parsed: pa.Table,
    *,
    days: list[date],
    tags: dict[str, str],
    keep_erased: bool,
) -> _Written:
    """A small batch written from the driver: its parsed lines (with their id hashes, parsed
    on the driver or collected from Spark in one job with no shuffle) have their copies ranked
    and counted on the driver (`split_collected`), and each table is written from there
    (`*_arrow`), the id index from the accepted rows."""
    kept, turned_away = split_collected(parsed)
    raw = store.replace_partitions_arrow(RAW_EVENTS, kept, partitions=days, commit_metadata=tags)
    index = kept.select(["id_hash", "message_id", "event_date", "received_date"])
    event_ids = store.replace_partitions_arrow(
        EVENT_IDS,
        index.rename_columns(["id_hash", "event_id", "event_date", "received_date"]),
        partitions=days,
        commit_metadata=tags,
    )
    # rejected_events also holds the cross-batch duplicates `events` owns: keep those.
    reasons = [reason for reason in REASONS if not (keep_erased and reason == ERASED)]
    dropped = [(day, reason) for day in days for reason in reasons]
    rejected_commit = store.rewrite_arrow(
        REJECTED_EVENTS,
        add=turned_away,
        drop=pa.table(
            {
                "received_date": pa.array([day for day, _ in dropped], pa.date32()),
                "origin": [INGEST] * len(dropped),
                "reason": [reason for _, reason in dropped],
            }
        ),
        files=store.files_with_values(
            REJECTED_EVENTS, column="origin", values={day: [INGEST] for day in days}
        ),
        commit_metadata=tags,
    )
    return _Written(
        raw=raw,
        event_ids=event_ids,
        rejected=rejected_commit,
        by_date=_counts(kept, ["received_date", "event_date"]),
        by_reason=_counts(turned_away, ["received_date", "reason"]),
    )


def _counts(rows: pa.Table, keys: list[str]) -> list[dict[str, Any]]:
    """Rows per value of `keys`, as `count` rows."""
    counted = rows.group_by(keys).aggregate([([], "count_all")])
    return [{**row, "count": row.pop("count_all")} for row in counted.to_pylist()]
