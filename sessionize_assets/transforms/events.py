"""SPEC §2's duplicate rule across batches: one winner per messageId, on any event date."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import date

import pyarrow as pa
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from sessionize_assets.transforms.validation import DEDUP, DUPLICATE

# One copy per (id, batch): ingestion removes copies within a batch (earliest receivedAt,
# then source file, then the line). A copy is therefore named by its id and batch; its event
# date says which `events` partition holds it when it wins.
COPY_KEY = ("event_date", "event_id", "received_date")
Copy = tuple[date, str, date]  # a COPY_KEY on the driver


def copies_in(rows: pa.Table) -> list[Copy]:
    """The COPY_KEY of each Arrow row."""
    return list(zip(*(rows.column(name).to_pylist() for name in COPY_KEY), strict=True))


def raw_to_candidates(raw: DataFrame) -> DataFrame:
    """Raw rows in the shape of `events`, keeping the raw line for losing copies."""
    return raw.withColumnRenamed("message_id", "event_id")


def mark_winners(copies: DataFrame) -> DataFrame:
    """COPY_KEY of every copy of some ids, each with `wins`: it is its id's copy in the earliest
    batch, whatever the event dates of the copies.

    `copies` must hold every copy of each of its ids (the id index gives them, or the whole
    history's raw rows): the earliest batch wins (SPEC §2), and within a batch ingestion has
    already kept one copy.
    """
    # A window, not an aggregate joined back: the copies are read and shuffled once.
    first = F.min("received_date").over(Window.partitionBy("event_id"))
    return copies.select(*COPY_KEY, (F.col("received_date") == first).alias("wins"))


# A duplicate rejection's `detail`.
DUPLICATE_DETAIL = "a copy of this messageId in an earlier batch wins"


def duplicate_rejections(losers: DataFrame) -> DataFrame:
    """`rejected_events` rows for copies that lost to a copy in an earlier batch."""
    return losers.select(
        "raw_line",
        F.lit(DUPLICATE).alias("reason"),
        F.lit(DUPLICATE_DETAIL).alias("detail"),
        F.col("event_id").alias("message_id"),
        "received_date",
        "source_file",
        F.lit(DEDUP).alias("origin"),
        "event_date",
        F.lit(None).cast("binary").alias("raw_bytes"),  # winners' lines are valid UTF-8
    )


def duplicate_rejection_rows(losers: pa.Table) -> pa.Table:
    """`duplicate_rejections` of Arrow rows (the shape of `events` plus the raw line)."""
    count = losers.num_rows
    return pa.table(
        {
            "raw_line": losers["raw_line"],
            "reason": pa.array([DUPLICATE] * count, pa.string()),
            "detail": pa.array([DUPLICATE_DETAIL] * count, pa.string()),
            "message_id": losers["event_id"],
            "received_date": losers["received_date"],
            "source_file": losers["source_file"],
            "origin": pa.array([DEDUP] * count, pa.string()),
            "event_date": losers["event_date"],
            "raw_bytes": pa.nulls(count, pa.binary()),  # winners' lines are valid UTF-8
        }
    )


def rejection_keys(rejected: DataFrame) -> DataFrame:
    """COPY_KEY of the duplicate rejections `events` made (origin `events`) in `rejected`."""
    return rejected.where(F.col("origin") == DEDUP).select(
        "event_date", F.col("message_id").alias("event_id"), "received_date"
    )


@dataclass(frozen=True)
class Contest:
    """The copies of the ids a run settles on the driver (those with a copy in more than one
    batch), and where each stands: among the run's inputs, in `events`, rejected."""

    copies: dict[str, set[Copy]]  # every copy of each contested id
    own: set[Copy]  # those among this run's inputs
    in_events: set[Copy]
    rejected: set[Copy]

    def winner(self, event_id: str) -> Copy:
        """The copy in the earliest batch (one copy per batch)."""
        return min(self.copies[event_id], key=lambda copy: copy[2])

    def settle(self, recompute: Collection[date]) -> Settled:
        """SPEC §2 on these copies: what to append, drop, reject, promote. `recompute` are the
        dates the run recomputes whole: there, `events` and the rejections are compared row
        for row instead, so a decision about a copy on them is only whether it loses."""
        whole = set(recompute)
        settled = Settled()
        for event_id in sorted(self.copies):
            best = self.winner(event_id)
            for copy in sorted(self.copies[event_id]):
                mine, here = copy in self.own, copy[0] in whole
                if copy == best:
                    if copy in self.rejected and not here:
                        settled.unreject.add(copy)
                    if copy not in self.in_events and not mine and copy in self.rejected:
                        settled.promote.add(copy)
                    elif mine and copy in self.in_events and not here:
                        settled.present.add(copy)
                    continue
                if mine:
                    settled.lose.add(copy)
                if copy in self.in_events and not here:
                    settled.drop.add(copy)
                    if not mine:
                        settled.displace.add(copy)
                if (mine or copy in self.in_events) and (here or copy not in self.rejected):
                    settled.reject.add(copy)
        return settled


@dataclass
class Settled:
    """Decisions on contested copies (COPY_KEY sets), made on the driver."""

    lose: set[Copy] = field(default_factory=set)  # this run's copies that do not win
    present: set[Copy] = field(default_factory=set)  # this run's winners already in events
    drop: set[Copy] = field(default_factory=set)  # copies to remove from events (by key)
    displace: set[Copy] = field(default_factory=set)  # of those, other batches' copies
    promote: set[Copy] = field(default_factory=set)  # rejected copies that now win
    unreject: set[Copy] = field(default_factory=set)  # winners whose rejection goes
    reject: set[Copy] = field(default_factory=set)  # copies whose rejection is written
