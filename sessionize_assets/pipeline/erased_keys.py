"""The `erasures` table (SPEC §8): what has been erased, as salted hashes, and what is going.

An erasure is recorded before it changes anything else. From then on ingestion rejects its
keys' lines (`pipeline/ingest.py`), and a second run of it finds its hashes: the anonymousIds
stitched to its keys among them, which `user_identities` forgets as the erasure goes on. It is
marked finished once the last data file that held its keys is deleted (`pipeline/forget.py`).
The table is small (a row a key) and read and written on the driver.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.lake.store import CommitInfo, DeltaStore
from sessionize_assets.lake.tables import ERASURES
from sessionize_assets.transforms.erased import ErasedKeys

# Bytes of a new lake's salt (hex in the table).
SALT_BYTES = 16


@dataclass(frozen=True, kw_only=True)
class Erasure:
    """One erasure: the hashes of the keys given and of the anonymousIds stitched to them."""

    erasure_id: str
    requested_at: datetime
    key_hashes: frozenset[str]
    stitched_hashes: frozenset[str]
    rows_removed: Mapping[str, int]
    batches: tuple[date, ...]  # ingested again without the keys' lines
    finished_at: datetime | None = None

    @property
    def hashes(self) -> frozenset[str]:
        return self.key_hashes | self.stitched_hashes


@dataclass(frozen=True, kw_only=True)
class ErasureBook:
    """The `erasures` table as read at `version`: the lake's salt (None before the first
    erasure) and every erasure."""

    salt: str | None
    erasures: tuple[Erasure, ...]
    version: int

    @property
    def erased(self) -> ErasedKeys | None:
        """Every key erased or being erased, as hashes: None when there is none."""
        if self.salt is None:
            return None
        hashes = frozenset(h for erasure in self.erasures for h in erasure.hashes)
        return ErasedKeys(salt=self.salt, hashes=hashes)

    @property
    def pending(self) -> list[Erasure]:
        """The erasures not finished, oldest first."""
        return [e for e in self.erasures if e.finished_at is None]

    def going(self, key_hashes: Collection[str]) -> Erasure | None:
        """The unfinished erasure of exactly these keys: a run of it again finishes it."""
        wanted = frozenset(key_hashes)
        return next((e for e in self.pending if e.key_hashes == wanted), None)


def erasure_book(store: DeltaStore) -> ErasureBook:
    version = store.read_version(ERASURES)
    rows = store.read_arrow(ERASURES).to_pylist()
    by_id: dict[str, list[dict]] = {}
    for row in rows:
        by_id.setdefault(row["erasure_id"], []).append(row)
    erasures = tuple(
        sorted(
            (
                Erasure(
                    erasure_id=erasure_id,
                    requested_at=own[0]["requested_at"],
                    key_hashes=frozenset(r["key_hash"] for r in own if not r["stitched"]),
                    stitched_hashes=frozenset(r["key_hash"] for r in own if r["stitched"]),
                    rows_removed=json.loads(own[0]["rows_removed"]),
                    batches=tuple(map(date.fromisoformat, json.loads(own[0]["batches"]))),
                    finished_at=own[0]["finished_at"],
                )
                for erasure_id, own in by_id.items()
            ),
            key=lambda e: (e.requested_at, e.erasure_id),
        )
    )
    return ErasureBook(salt=rows[0]["salt"] if rows else None, erasures=erasures, version=version)


def erased_keys(store: DeltaStore) -> ErasedKeys | None:
    """Every key erased or being erased (None: none), for ingestion to reject their lines."""
    return erasure_book(store).erased


def new_salt() -> str:
    return secrets.token_hex(SALT_BYTES)


def record_erasures(
    store: DeltaStore, book: ErasureBook, *, salt: str, changed: Iterable[Erasure]
) -> CommitInfo:
    """Write `changed` (new erasures, or ones with new hashes or finished) in place of their
    earlier rows, against the table as `book` read it: a concurrent change of the same
    days' rows fails the commit (`WriteConflictError`) rather than losing one."""
    changed = list(changed)
    ids = {e.erasure_id for e in changed}
    days = sorted({e.requested_at.date() for e in changed})
    kept = [e for e in book.erasures if e.erasure_id not in ids and e.requested_at.date() in days]
    rows = [
        _row(erasure, key_hash=h, salt=salt, stitched=False)
        for erasure in [*kept, *changed]
        for h in sorted(erasure.key_hashes)
    ]
    rows += [
        _row(erasure, key_hash=h, salt=salt, stitched=True)
        for erasure in [*kept, *changed]
        for h in sorted(erasure.stitched_hashes)
    ]
    return store.replace_partitions_arrow(
        ERASURES,
        pa.Table.from_pylist(rows, schema=to_arrow_schema(ERASURES.schema)),
        partitions=days,
        read_version=book.version,
    )


def _row(erasure: Erasure, *, key_hash: str, salt: str, stitched: bool) -> dict:
    return {
        "erasure_id": erasure.erasure_id,
        "requested_date": erasure.requested_at.date(),
        "requested_at": erasure.requested_at,
        "salt": salt,
        "key_hash": key_hash,
        "stitched": stitched,
        "rows_removed": json.dumps(dict(sorted(erasure.rows_removed.items()))),
        "batches": json.dumps([day.isoformat() for day in sorted(erasure.batches)]),
        "finished_at": erasure.finished_at,
    }
