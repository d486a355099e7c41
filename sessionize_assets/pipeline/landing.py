"""The landing zone against what was ingested: which batch folders are new or changed (SPEC §1).

A batch's fingerprint is the SHA-256 of its files' names, sizes and content digests. File
times are left out: a re-delivery that writes the same bytes again is the same batch.
Ingestion records the files it read in `landing_batches`, in the last commit of its run. The
landing sensor and `sessionize replay` compare the folders with that table rather than with a
cursor, so
- a folder whose content did not change is not asked for again, whoever delivered it;
- a batch whose ingestion failed, or died before that commit, stays pending;
- a new daemon, or a new Dagster home, needs nothing handed over.

A file is hashed only when its size or modification time differs from what was recorded (or
from the caller's cache of digests): an unchanged zone costs one `stat` per file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.lake.store import CommitInfo, DeltaStore
from sessionize_assets.lake.tables import LANDING_BATCHES

_READ_CHUNK = 1 << 20
# path -> (bytes, modified_ns, sha256) of files read, for a later comparison to reuse.
DigestCache = MutableMapping[str, tuple[int, int, str]]


@dataclass(frozen=True, kw_only=True)
class LandingFile:
    name: str
    bytes: int
    modified_ns: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class BatchFingerprint:
    """What one batch folder holds, file by file (sorted by name)."""

    received: date
    files: tuple[LandingFile, ...]

    @property
    def digest(self) -> str:
        lines = "".join(f"{f.name}\t{f.bytes}\t{f.sha256}\n" for f in self.files)
        return hashlib.sha256(lines.encode()).hexdigest()

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)


@dataclass(frozen=True, kw_only=True)
class PendingBatch:
    """A folder to ingest: never ingested, or its content differs from what was."""

    found: BatchFingerprint
    ingested: BatchFingerprint | None

    @property
    def received(self) -> date:
        return self.found.received

    @property
    def why(self) -> str:
        return "new" if self.ingested is None else "changed"


@dataclass(frozen=True, kw_only=True)
class LandingComparison:
    pending: list[PendingBatch]  # oldest first
    unchanged: list[date]
    # Ingested, and the folder is gone: what was ingested stays (SPEC §1), with a warning.
    vanished: list[date]
    # Digests of the files the record does not vouch for (path -> bytes, modified_ns, sha256):
    # pass them back as `cached` next time, so a re-delivered file is read once.
    digests: dict[str, tuple[int, int, str]]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(_READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fingerprint(
    received: date,
    files: Iterable[Path],
    *,
    known: BatchFingerprint | None = None,
    cached: Mapping[str, tuple[int, int, str]] | None = None,
    digested: DigestCache | None = None,
) -> BatchFingerprint:
    """The batch's fingerprint. A file whose size and modification time are those `known`
    records under its name, or `cached` under its path, is not read. The digest of every
    other file (read, or taken from `cached`) goes into `digested`."""
    recorded = {f.name: f for f in known.files} if known else {}
    found = []
    for path in sorted(files, key=lambda p: p.name):
        status = path.stat()
        size, modified = status.st_size, status.st_mtime_ns
        before = recorded.get(path.name)
        if before is not None and (before.bytes, before.modified_ns) == (size, modified):
            sha = before.sha256
        else:
            hit = (cached or {}).get(str(path))
            fresh = hit is not None and tuple(hit[:2]) == (size, modified)
            sha = hit[2] if hit is not None and fresh else file_sha256(path)
            if digested is not None:
                digested[str(path)] = (size, modified, sha)
        found.append(LandingFile(name=path.name, bytes=size, modified_ns=modified, sha256=sha))
    return BatchFingerprint(received=received, files=tuple(found))


def ingested_batches(rows: pa.Table) -> dict[date, BatchFingerprint]:
    """`landing_batches` rows (as read with delta-rs) by received day."""
    batches = {}
    for row in rows.to_pylist():
        files = tuple(LandingFile(**f) for f in json.loads(row["files"]))
        batches[row["received_date"]] = BatchFingerprint(received=row["received_date"], files=files)
    return batches


def compare_landing(
    folders: Mapping[date, list[Path]],
    ingested: Mapping[date, BatchFingerprint],
    *,
    cached: Mapping[str, tuple[int, int, str]] | None = None,
) -> LandingComparison:
    """Each batch folder (received day -> its files) against what was ingested for that day.

    An empty folder is an empty batch: new if nothing was ingested for its day. `cached` holds
    digests from an earlier comparison (its `digests`), so a file is read once.
    """
    pending, unchanged = [], []
    digests: dict[str, tuple[int, int, str]] = {}
    for day in sorted(folders):
        before = ingested.get(day)
        found = fingerprint(day, folders[day], known=before, cached=cached, digested=digests)
        if before is not None and before.digest == found.digest:
            unchanged.append(day)
        else:
            pending.append(PendingBatch(found=found, ingested=before))
    vanished = sorted(day for day, batch in ingested.items() if day not in folders and batch.files)
    return LandingComparison(
        pending=pending, unchanged=unchanged, vanished=vanished, digests=digests
    )


def record_ingested(
    store: DeltaStore,
    batches: Iterable[BatchFingerprint],
    *,
    ingest_version: int,
    run_id: str,
) -> CommitInfo:
    """Record what these batches were read from, replacing their earlier records."""
    batches = sorted(batches, key=lambda b: b.received)
    now = datetime.now(UTC)
    rows = [
        {
            "received_date": batch.received,
            "fingerprint": batch.digest,
            "files": json.dumps([dataclasses.asdict(f) for f in batch.files]),
            "ingest_version": ingest_version,
            "run_id": run_id,
            "ingested_at": now,
        }
        for batch in batches
    ]
    return store.replace_partitions_arrow(
        LANDING_BATCHES,
        pa.Table.from_pylist(rows, schema=to_arrow_schema(LANDING_BATCHES.schema)),
        partitions=[batch.received for batch in batches],
        commit_metadata={"dagster_run_id": run_id},
    )
