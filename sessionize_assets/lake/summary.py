"""What the lake holds, reconciled: printed by `sessionize replay` and `sessionize rebuild`.

Every line ingested is in `raw_events` (valid) or `rejected_events` (`origin = ingest`), and
every raw row is in `events` or `rejected_events` as a cross-batch duplicate
(`origin = events`). So lines = events + cross-batch duplicates + rejected at ingestion.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from sessionize_assets.lake.location import Location
from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import (
    DAILY_SESSIONS,
    EVENTS,
    RAW_EVENTS,
    REJECTED_EVENTS,
    SESSION_CHANGES,
    SESSION_QUARANTINE,
    SESSIONS,
    USER_LIFECYCLE_SNAPSHOT,
    USER_LIFECYCLE_STATE,
)
from sessionize_assets.pipeline.daily import sources_behind
from sessionize_assets.transforms.daily import ALL_CHANNELS
from sessionize_assets.transforms.validation import DEDUP, INGEST


def describe_lake(store: DeltaStore, *, lake: Location) -> list[str]:
    """Lines for a person: the tables' sizes and where they are, and the lines reconciled."""

    def rows(spec) -> int:
        return sum(store.row_counts(spec).values())

    rejected: dict[tuple[str, str], int] = {
        (r["origin"], r["reason"]): r["count"]
        for r in store.read(REJECTED_EVENTS).groupBy("origin", "reason").count().collect()
    }
    at_ingestion = {reason: n for (origin, reason), n in rejected.items() if origin == INGEST}
    duplicates = sum(n for (origin, _), n in rejected.items() if origin == DEDUP)
    events, raw = rows(EVENTS), rows(RAW_EVENTS)
    lines = raw + sum(at_ingestion.values())
    reasons = ", ".join(f"{reason} {n:,}" for reason, n in sorted(at_ingestion.items()))
    out = [
        f"lake: {lake}",
        f"  lines ingested      {lines:,} = {events:,} events + {duplicates:,} cross-batch "
        f"duplicates + {sum(at_ingestion.values()):,} rejected at ingestion"
        + (f" ({reasons})" if reasons else ""),
    ]
    if raw != events + duplicates:
        out.append(
            f"  NOT RECONCILED: raw_events holds {raw:,} rows, events and cross-batch "
            f"duplicates {events + duplicates:,}"
        )
    snapshot_days = len(store.row_counts(USER_LIFECYCLE_SNAPSHOT))
    for spec, what in (
        (RAW_EVENTS, "valid lines, by received day"),
        (REJECTED_EVENTS, "rejected lines, with the reason"),
        (EVENTS, "accepted events, by event day"),
        (SESSIONS, "sessions, by session day"),
        (SESSION_QUARANTINE, "sessions past the maximum length"),
        (SESSION_CHANGES, "corrections logged"),
        (USER_LIFECYCLE_STATE, "lifecycle intervals"),
        (USER_LIFECYCLE_SNAPSHOT, f"snapshot rows ({snapshot_days} days x 5 states)"),
    ):
        out.append(f"  {spec.name:<24}{rows(spec):>12,}  {what}")
    out.extend(_sessions_by_channel(store))
    return out


def _sessions_by_channel(store: DeltaStore) -> list[str]:
    """The sessions by channel, most first, and the share that are engaged (SPEC §3b): summed
    from `daily_sessions` for the dates it counted from the `sessions` files there now, and
    counted from `sessions` for the others (`daily.sources_behind`). Reading every sessions
    file took 18.5 s after a daily batch at the full size (docs/benchmarks.md)."""
    behind = set(sources_behind(store, DAILY_SESSIONS).dates)
    daily = store.read_arrow(
        DAILY_SESSIONS, columns=["session_date", "channel", "sessions", "engaged_sessions"]
    )
    rows = [
        (row["channel"], row["sessions"], row["engaged_sessions"])
        for row in daily.to_pylist()
        if row["channel"] != ALL_CHANNELS and row["session_date"] not in behind
    ]
    if behind:
        rows += [
            (r.channel, r.sessions, r.engaged or 0)
            for r in store.read(SESSIONS, partitions=sorted(behind))
            .groupBy("channel")
            .agg(
                F.count(F.lit(1)).alias("sessions"),
                F.sum(F.col("is_engaged").cast("int")).alias("engaged"),
            )
            .collect()
        ]
    counts: dict[str | None, list[int]] = {}
    for channel, sessions, engaged_sessions in rows:
        held = counts.setdefault(channel, [0, 0])
        held[0] += sessions
        held[1] += engaged_sessions
    total = sum(sessions for sessions, _ in counts.values())
    if not total:
        return []
    engaged = sum(n for _, n in counts.values())
    out = [f"  sessions by channel ({engaged / total:.0%} engaged):"]
    for channel, (sessions, n) in sorted(counts.items(), key=lambda c: (-c[1][0], str(c[0]))):
        out.append(
            f"    {channel or '(none)':<20}{sessions:>10,}  {sessions / total:>4.0%}, "
            f"{n / sessions:.0%} engaged"
        )
    return out
