"""A daily batch's events run on the driver: the change `events_change.settle` makes for a run
that recomputes no date, made from Arrow reads and written with `rewrite_arrow`, so the run
starts no Spark job (and, as a run of its own under the daemon, no Spark session).

The rule is the same code: the contested ids are found in the id index
(`event_ids.other_copies_on_driver`) and settled by `Contest.settle`. Only the reads differ:
each is a filter, applied as the files are read, on the few partitions that can hold what it
looks for. It is taken when the run's copies are at most HELD_ON_DRIVER (the index's count)
and what it writes, with the files it rewrites, is within `driver_write_bytes`
(`DeltaStore.rewrites_on_driver`; never on the delta-spark backend). Otherwise Spark settles
the run, as it does a run with a recomputed date.
"""

from __future__ import annotations

from collections.abc import Collection

import pyarrow as pa
import pyarrow.compute as pc

from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import EVENTS, RAW_EVENTS, REJECTED_EVENTS
from sessionize_assets.pipeline.event_ids import Contested, other_copies_on_driver
from sessionize_assets.pipeline.events_change import (
    HELD_ON_DRIVER,
    DriverFiles,
    EventsChange,
    in_raw,
    raw_on_driver,
)
from sessionize_assets.pipeline.keyed_reads import pair_keys, pair_texts
from sessionize_assets.pipeline.manifests import Inputs
from sessionize_assets.transforms.events import (
    COPY_KEY,
    Contest,
    Copy,
    copies_in,
    duplicate_rejection_rows,
)
from sessionize_assets.transforms.validation import DEDUP

# About what a copy takes in Arrow, in the shape of `events` (the mid size's daily batch: 11.0
# MiB for 15,354 copies): a run whose copies would take more than `driver_write_bytes` at this
# is settled by Spark without reading them on the driver first (a full-size day's 110,000
# would take about 80 MiB, and 2-3 s to read and let go).
COPY_BYTES = 700
# `raw_events`' columns in the shape of `events`, and with the line.
_EVENT_COLUMNS = EVENTS.schema.fieldNames()
_LINE_COLUMNS = [*_EVENT_COLUMNS, "raw_line"]


def settle_on_driver(store: DeltaStore, inputs: Inputs, *, rows: int) -> EventsChange | None:
    """The change of a run that absorbs `inputs` (`rows` copies, the index's count) and
    recomputes no date, made on the driver; None when it does not fit there (the caller
    settles the run with Spark)."""
    if rows > HELD_ON_DRIVER or not store.collects_on_driver(rows * COPY_BYTES):
        return None
    own = raw_on_driver(store, inputs, columns=_EVENT_COLUMNS)
    if not store.collects_on_driver(own.nbytes):
        return None
    contest = _contest(store, other_copies_on_driver(store, copies_in(own)))
    settled = contest.settle(())
    # Rows of other batches' copies that win now, and the lines of every rejected copy.
    lines = _raw_copies(store, settled.promote | settled.reject)
    events_add = pa.concat_tables(
        [
            _copies(own, settled.lose | settled.present, keep=False),
            _copies(lines, settled.promote).select(_EVENT_COLUMNS),
        ]
    )
    rejections_add = (
        duplicate_rejection_rows(_copies(lines, settled.reject)) if settled.reject else None
    )
    files = DriverFiles(
        events=_files_holding(store, settled.drop, in_events=True),
        rejections=_files_holding(store, settled.unreject, in_events=False),
    )
    fits = store.rewrites_on_driver(EVENTS, events_add, files=files.events) and (
        rejections_add is None
        or store.rewrites_on_driver(REJECTED_EVENTS, rejections_add, files=files.rejections)
    )
    if not fits:
        return None
    return EventsChange(
        events_add=events_add,
        events_drop=sorted(settled.drop),
        rejections_add=rejections_add,
        rejections_drop=sorted(settled.unreject),
        on_driver=files,
        dates_touched={d for d, _, _ in settled.drop | settled.promote},
        contested=len(contest.copies),
        added=events_add.num_rows,
        displaced=len(settled.displace),
        promoted=len(settled.promote),
        rejected=len(settled.reject),
    )


def _contest(store: DeltaStore, found: Contested) -> Contest:
    """Where the contested ids' copies stand, as `events_change._contest` finds it: their
    keys in `events` on the dates of their copies, and in the duplicate rejections of their
    batches."""
    if not found.copies:
        return Contest(copies={}, own=set(), in_events=set(), rejected=set())
    ids = pa.array(sorted(found.copies), pa.string())
    everywhere = [copy for group in found.copies.values() for copy in group]
    in_events = store.read_arrow(
        EVENTS,
        partitions=sorted({d for d, _, _ in everywhere}),
        columns=list(COPY_KEY),
        where=pc.field("event_id").isin(ids),
    )
    rejected = store.read_arrow(
        REJECTED_EVENTS,
        partitions=sorted({r for _, _, r in everywhere}),
        columns=["event_date", "message_id", "received_date"],
        where=(pc.field("origin") == DEDUP) & pc.field("message_id").isin(ids),
    )
    return Contest(
        copies=found.copies,
        own=found.held,
        in_events=set(copies_in(in_events)),
        rejected=set(copies_in(rejected.rename_columns(list(COPY_KEY)))),
    )


def _raw_copies(store: DeltaStore, copies: Collection[Copy]) -> pa.Table:
    """The raw rows of these copies, with their lines, in the shape of `events`."""
    ids = pa.array(sorted({event_id for _, event_id, _ in copies}), pa.string())
    raw = store.read_arrow(
        RAW_EVENTS,
        partitions=sorted({r for _, _, r in copies}),
        columns=in_raw(_LINE_COLUMNS),
        where=pc.field("message_id").isin(ids),
    )
    return _copies(raw.rename_columns(_LINE_COLUMNS), copies)


def _copies(rows: pa.Table, copies: Collection[Copy], *, keep: bool = True) -> pa.Table:
    """The rows that are one of these copies (`keep`), or the others: one copy per (id,
    batch) makes (`received_date`, `event_id`) its key."""
    wanted = pa.array(pair_texts((r, i) for _, i, r in copies), pa.string())
    found = pc.is_in(pair_keys(rows, partition="received_date", key="event_id"), value_set=wanted)
    return rows.filter(found if keep else pc.invert(found))


def _files_holding(store: DeltaStore, copies: Collection[Copy], *, in_events: bool) -> list[str]:
    """The live files that can hold these copies: in `events` (by event date and id), or in
    the duplicate rejections (by batch and id), chosen from the log's statistics."""
    if not copies:
        return []
    values: dict[str, set[str]] = {}
    for event_date, event_id, received_date in copies:
        values.setdefault((event_date if in_events else received_date).isoformat(), set()).add(
            event_id
        )
    if in_events:
        return store.files_with_values(EVENTS, column="event_id", values=values)
    return store.files_with_values(REJECTED_EVENTS, column="message_id", values=values)
