"""SPEC §8: forget people on request, exactly, at the cost of what they touched.

An erasure is a retraction of lines, and sessionize already recomputes exactly what a changed
batch touches. So an erasure is made of the pipeline's own recipes, in three stages:

1. `begin_erasure` (one turn of the writer lock): the keys given, and every anonymousId
   `user_identities` maps to them, are recorded in `erasures` as salted hashes; from then on
   ingestion rejects their lines. One Spark job counts the live rows that hold them, table by
   table, and names the batches that do. Those batches are ingested again from the lake's own
   copy of their lines (the raw lines of `raw_events` and the ingest rejections), without the
   erased keys' lines: their `raw_events`, id index, rejections and index entries are what a
   landing zone without those lines would have given, and their new index version puts the
   event dates they hold behind.
2. The runs that follow a re-delivered batch follow this one, with their recipes unchanged
   (the daemon's sensors and automation, or `sessionize forget` itself): `events` recomputes
   the dates behind (a duplicate the erased copy had beaten is promoted back), identities
   drop the erased anonymousIds, sessions recompute the (user, day) pairs whose events
   changed, with the quarantine and the corrections log, and the lifecycle corrects its
   intervals and snapshot from the earliest changed day.
3. `finish_erasure` (one turn of the lock), once nothing is behind: no live row may hold an
   erased key any more, but the corrections log, whose entries keep their session and lose
   the key (`ERASED_USER`). Then every data file under the tables that holds an erased key,
   which is now a file kept for time travel or left by a killed writer, is deleted at once,
   and the erasures are marked finished.

Every step is idempotent and derived again from the lake: an erasure killed anywhere is
finished by running it again (the hashes recorded in step 1 carry the stitched ids it
found), and every table meanwhile is a correct state of the lake (never a half-applied
commit). What history it costs is in docs/erasure.md.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from functools import reduce
from urllib.parse import unquote

import pyarrow.fs as pafs
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from sessionize_assets.lake.delta_rs.log_files import DELTA_LOG_DIR
from sessionize_assets.lake.location import Location
from sessionize_assets.lake.store import DeltaStore, LakeError, TableSpec
from sessionize_assets.lake.tables import (
    EVENTS,
    LANDING_BATCHES,
    RAW_EVENTS,
    REJECTED_EVENTS,
    SESSION_CHANGES,
    SESSION_QUARANTINE,
    SESSIONS,
    USER_IDENTITIES,
    USER_LIFECYCLE_STATE,
)
from sessionize_assets.pipeline.erased_keys import (
    Erasure,
    erasure_book,
    new_salt,
    record_erasures,
)
from sessionize_assets.pipeline.ingest import IngestResult, ingest_batches
from sessionize_assets.pipeline.landing import BatchFingerprint, ingested_batches
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.erased import ErasedKeys, key_hash
from sessionize_assets.transforms.validation import ERASED, INGEST

_USER_KEYS = ("user_id", "segment_user_id", "anonymous_id")
# The tables whose rows can hold a user key, and the columns that do. `rejected_events` holds
# a line's text, and a key in it as a JSON string.
KEY_COLUMNS: Mapping[str, tuple[str, ...]] = {
    RAW_EVENTS.name: _USER_KEYS,
    REJECTED_EVENTS.name: ("raw_line",),
    EVENTS.name: _USER_KEYS,
    USER_IDENTITIES.name: ("anonymous_id", "user_id"),
    SESSIONS.name: ("user_id", "stitched_user_id"),
    SESSION_QUARANTINE.name: ("user_id",),
    SESSION_CHANGES.name: ("user_id",),
    USER_LIFECYCLE_STATE.name: ("user_id",),
}
KEYED_TABLES = (
    RAW_EVENTS,
    REJECTED_EVENTS,
    EVENTS,
    USER_IDENTITIES,
    SESSIONS,
    SESSION_QUARANTINE,
    SESSION_CHANGES,
    USER_LIFECYCLE_STATE,
)
# What the corrections log keeps of an erased key's sessions: their changes, not who.
ERASED_USER = "(erased)"


class ErasureNotCaughtUp(LakeError):
    """An erasure cannot finish: live rows still hold its keys (the runs that follow it have
    not caught up). Nothing was deleted."""


def holds_erased(spec: TableSpec, erased: ErasedKeys) -> Column:
    """Whether a row of `spec` (one of `KEYED_TABLES`) holds an erased key."""
    if spec is REJECTED_EVENTS:
        return erased.text_holds_erased("raw_line")
    return erased.any_is_erased(KEY_COLUMNS[spec.name])


@dataclass(frozen=True, kw_only=True)
class Holding:
    """Live rows that hold an erased key: per table, rows per partition value."""

    rows: Mapping[str, Mapping[str, int]]

    def total(self, table: str) -> int:
        return sum(self.rows.get(table, {}).values())

    def partitions(self, spec: TableSpec) -> list[date]:
        return sorted(date.fromisoformat(p) for p in self.rows.get(spec.name, {}))

    @property
    def removed(self) -> dict[str, int]:
        """What an erasure removes, per table: every row that holds a key, but the
        corrections log's, which it keeps without the key."""
        return {
            spec.name: self.total(spec.name) for spec in KEYED_TABLES if spec is not SESSION_CHANGES
        }


def live_rows_holding(store: DeltaStore, erased: ErasedKeys) -> Holding:
    """The live rows of every keyed table that hold an erased key, counted per partition in
    one Spark job (it reads the key columns of every live file)."""
    frames = [
        store.read(spec)
        .where(holds_erased(spec, erased))
        .select(
            F.lit(spec.name).alias("table"),
            F.col(spec.partition_by).cast("string").alias("partition"),
        )
        for spec in KEYED_TABLES
        if store.exists(spec)
    ]
    if not frames:
        return Holding(rows={})
    rows: dict[str, dict[str, int]] = {}
    for row in (
        reduce(DataFrame.unionByName, frames).groupBy("table", "partition").count().collect()
    ):
        rows.setdefault(row["table"], {})[row["partition"]] = row["count"]
    return Holding(rows=rows)


@dataclass(frozen=True, kw_only=True)
class ErasureBegun:
    erasure: Erasure
    holding: Holding  # what the live tables held of every erased key when it began
    ingested: IngestResult | None  # the batches ingested again without the erased lines
    fingerprints: Mapping[date, BatchFingerprint]  # what those batches were read from


def begin_erasure(
    store: DeltaStore, *, keys: Collection[str], settings: Settings, run_id: str
) -> ErasureBegun:
    """Record the erasure of `keys` (and of the anonymousIds stitched to them), then ingest
    the batches holding their lines again without them. Run again with the same keys before
    the erasure finished, it goes on with the same erasure. The caller holds the writer lock.
    """
    if not keys or any(not key for key in keys):
        raise ValueError("an erasure needs at least one key, and no empty key")
    book = erasure_book(store)
    salt = book.salt or new_salt()
    key_hashes = frozenset(key_hash(salt=salt, key=key) for key in keys)
    wanted = set(keys)
    identities = store.read_arrow(USER_IDENTITIES, columns=["anonymous_id", "user_id"])
    stitched = {
        key_hash(salt=salt, key=row["anonymous_id"])
        for row in identities.to_pylist()
        if row["user_id"] in wanted and row["anonymous_id"] not in wanted
    }
    going = book.going(key_hashes)
    stitched_hashes = frozenset(stitched | set(going.stitched_hashes if going else ()))
    known = book.erased.hashes if book.erased else frozenset()
    erased = ErasedKeys(salt=salt, hashes=known | key_hashes | stitched_hashes)
    holding = live_rows_holding(store, erased)
    holding_batches = {*holding.partitions(RAW_EVENTS), *holding.partitions(REJECTED_EVENTS)}
    landing = store.read_arrow(LANDING_BATCHES)
    if going is None:
        erasure = Erasure(
            erasure_id=run_id,
            requested_at=datetime.now(UTC),
            key_hashes=key_hashes,
            stitched_hashes=stitched_hashes,
            rows_removed=holding.removed,
            batches=tuple(sorted(holding_batches)),
        )
        batches = sorted(holding_batches)
    else:
        # Counted when it began. A batch it ingested again is done once its landing record
        # (an ingestion's last commit) is younger than the erasure: a run killed between a
        # batch's first and last commits left its raw rows clean, and the rest to redo.
        recorded_at = {
            row["received_date"]: row["ingested_at"]
            for row in landing.select(["received_date", "ingested_at"]).to_pylist()
        }
        unfinished = {
            day
            for day in going.batches
            if recorded_at.get(day) is None or recorded_at[day] < going.requested_at
        }
        erasure = replace(
            going,
            stitched_hashes=stitched_hashes,
            batches=tuple(sorted({*going.batches, *holding_batches})),
        )
        batches = sorted(holding_batches | unfinished)
    if erasure != going:
        record_erasures(store, book, salt=salt, changed=[erasure])
    ingested, recorded = None, {}
    if batches:
        recorded = {d: f for d, f in ingested_batches(landing).items() if d in batches}
        unrecorded = [day for day in batches if day not in recorded]
        if unrecorded:
            raise LakeError(f"batches {unrecorded} hold rows but no landing record: not ingested?")
        ingested = ingest_batches(
            store,
            lake_lines(store, batches),
            fingerprints={day: recorded[day] for day in batches},
            settings=settings,
            run_id=run_id,
            erasing=True,
        )
    return ErasureBegun(erasure=erasure, holding=holding, ingested=ingested, fingerprints=recorded)


def lake_lines(store: DeltaStore, batches: Iterable[date]) -> DataFrame:
    """The non-blank lines of these batches as the lake holds them, in the form the landing
    zone gives them (`raw_line`, `received_date`, `source_file`): every valid line is in
    `raw_events`, every other in the ingest rejections (an `invalid_encoding` line's exact
    bytes in `raw_bytes`). Lines rejected as `erased` have no text left, and are not lines."""
    batches = sorted(set(batches))
    raw = store.read(RAW_EVENTS, partitions=batches).select(
        "raw_line", "received_date", "source_file"
    )
    rejected = (
        store.read(REJECTED_EVENTS, partitions=batches)
        .where((F.col("origin") == INGEST) & (F.col("reason") != ERASED))
        .select(
            F.coalesce(F.col("raw_bytes").cast("string"), F.col("raw_line")).alias("raw_line"),
            "received_date",
            "source_file",
        )
    )
    return raw.unionByName(rejected)


@dataclass(frozen=True, kw_only=True)
class ErasureFinished:
    erasures: tuple[Erasure, ...]  # those it finished (none: nothing was going)
    corrections_redacted: int  # corrections-log rows that lost their key
    files_deleted: Mapping[str, int]  # per table


def finish_erasure(
    store: DeltaStore, spark: Callable[[], SparkSession], *, run_id: str
) -> ErasureFinished:
    """Finish every erasure going, once the runs that follow it have caught up: the
    corrections log loses the erased keys, every data file that holds one is deleted, and
    the erasures are marked finished. `ErasureNotCaughtUp` when another live row still holds
    an erased key (nothing is deleted then). The caller holds the writer lock."""
    book = erasure_book(store)
    pending = book.pending
    erased = book.erased
    if not pending or erased is None:
        return ErasureFinished(erasures=(), corrections_redacted=0, files_deleted={})
    holding = live_rows_holding(store, erased)
    left = {
        spec.name: holding.total(spec.name)
        for spec in KEYED_TABLES
        if spec is not SESSION_CHANGES and holding.total(spec.name)
    }
    if left:
        where = ", ".join(
            f"{table}: {rows} rows on {', '.join(sorted(holding.rows[table])[:3])}"
            for table, rows in left.items()
        )
        raise ErasureNotCaughtUp(
            f"erased keys are still in live rows ({where}): the runs that follow the erasure "
            "have not caught up. Run what is behind (the daemon does, or `sessionize replay`), "
            "then finish the erasure again."
        )
    redacted = holding.total(SESSION_CHANGES.name)
    if redacted:
        days = holding.partitions(SESSION_CHANGES)
        holds = holds_erased(SESSION_CHANGES, erased)
        store.rewrite(
            SESSION_CHANGES,
            partitions=days,
            drop=holds,
            add=lambda: (
                store.read(SESSION_CHANGES, partitions=days)
                .where(holds)
                .withColumn("user_id", F.lit(ERASED_USER))
            ),
            commit_metadata={"dagster_run_id": run_id, "sessionize": "erasure"},
        )
    files = files_holding(store, spark(), erased)
    live = {spec.name: set(store.live_files(spec)) for spec in KEYED_TABLES}
    still = sorted(path for table, paths in files.items() for path in paths if path in live[table])
    if still:
        raise LakeError(f"live files still hold erased keys after the erasure: {still[:5]}")
    for paths in files.values():
        for path in paths:
            filesystem, where = Location.of(path).filesystem()
            filesystem.delete_file(where)
    finished_at = datetime.now(UTC)
    done = [replace(erasure, finished_at=finished_at) for erasure in pending]
    record_erasures(store, book, salt=erased.salt, changed=done)
    return ErasureFinished(
        erasures=tuple(done),
        corrections_redacted=redacted,
        files_deleted={table: len(paths) for table, paths in files.items()},
    )


def files_holding(
    store: DeltaStore, spark: SparkSession, erased: ErasedKeys
) -> dict[str, list[str]]:
    """Every data file under the keyed tables' folders, live, kept for time travel or left by
    a killed writer (the log's own files aside), that holds an erased key: their paths as
    `live_files` gives them, per table, found in one Spark job over their key columns."""
    frames = []
    for spec in KEYED_TABLES:
        paths = data_files_on_disk(Location.of(store.uri(spec)))
        if not paths:
            continue
        columns = StructType([spec.schema[name] for name in KEY_COLUMNS[spec.name]])
        frames.append(
            spark.read.schema(columns)
            # Files of the staging folders and of the partitions alike, with no partition
            # columns inferred from their paths.
            .option("recursiveFileLookup", "true")
            .parquet(*paths)
            .where(holds_erased(spec, erased))
            .select(F.lit(spec.name).alias("table"), F.col("_metadata.file_path").alias("path"))
        )
    if not frames:
        return {}
    found: dict[str, set[str]] = {}
    for row in reduce(DataFrame.unionByName, frames).distinct().collect():
        # Spark names a file by URI (`file:///...`, `s3a://...`): as `Location` names it.
        found.setdefault(row["table"], set()).add(str(Location.of(unquote(row["path"]))))
    return {table: sorted(paths) for table, paths in found.items()}


def data_files_on_disk(root: Location) -> list[str]:
    """The Parquet files under a table's folder but its log, as locations (`str`)."""
    filesystem, base = root.filesystem()
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    found = []
    for info in filesystem.get_file_info(selector):
        relative = info.path[len(base) :].lstrip("/")
        if info.type != pafs.FileType.File or not relative.endswith(".parquet"):
            continue
        if relative.split("/", 1)[0] == DELTA_LOG_DIR:
            continue
        found.append(str(root / relative))
    return sorted(found)
