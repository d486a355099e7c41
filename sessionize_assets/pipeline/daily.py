"""Keeping SPEC §9's tables exact: `arrivals` after each change of `events`, `daily_sessions`
after each change of `sessions` or of a date's status.

- `arrivals` is counted again, from `events`, for the event dates a run changed.
- A `daily_sessions` date is behind when its `sessions` files are not the ones its rows were
  computed from (`daily_sessions_manifest`: a late event, a relabel by stitching, an erasure),
  or when its status or expected completeness is no longer what the lake says (R moved on, or
  the reference dates' arrivals changed). The first are computed again from `sessions`; the
  others keep their figures and take the new status.

Both tables and the manifest are a few rows a date, read and written on the driver with
delta-rs. Each question is answered from the lake at every call, so a run that failed or died
leaves its dates behind for the next one: daily rows are committed before the manifest that
says they are current.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.lake.store import DeltaStore, TableSpec
from sessionize_assets.lake.tables import (
    ARRIVALS,
    DAILY_SESSIONS,
    DAILY_SESSIONS_MANIFEST,
    EVENTS,
    LANDING_BATCHES,
    SESSIONS,
)
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.completeness import GracePeriod, grace_period
from sessionize_assets.transforms.daily import (
    ALL_CHANNELS,
    DAILY_SOURCE_COLUMNS,
    arrival_counts,
    daily_figures,
)


def latest_received(store: DeltaStore) -> date | None:
    """R: the latest received day ingested (an empty batch folder counts), from the lake's
    landing record; None before the first batch."""
    days = store.read_arrow(LANDING_BATCHES, columns=["received_date"])["received_date"]
    return pc.max(days).as_py() if len(days) else None


def current_grace_period(store: DeltaStore, settings: Settings) -> GracePeriod | None:
    """The grace period at R, from `arrivals` as it is (None before the first batch)."""
    latest = latest_received(store)
    if latest is None:
        return None
    rows = store.read_arrow(ARRIVALS).to_pylist()
    counts = {(row["event_date"], row["lag_days"]): row["events"] for row in rows}
    return grace_period(counts, latest_received=latest, lateness=settings.lateness)


def update_arrivals(
    store: DeltaStore, *, event_dates: Iterable[date], run_id: str
) -> dict[date, dict[int, int]]:
    """Count the arrivals of `event_dates` again from `events` (the dates a run changed), and
    return them per date, events by lag."""
    dates = sorted(set(event_dates))
    if not dates:
        return {}
    events = store.read_arrow(EVENTS, partitions=dates, columns=["event_date", "received_date"])
    counts = arrival_counts(events)
    _replace(store, ARRIVALS, counts, partitions=dates, run_id=run_id)
    by_date: dict[date, dict[int, int]] = {day: {} for day in dates}
    for row in counts.to_pylist():
        by_date[row["event_date"]][row["lag_days"]] = row["events"]
    return by_date


@dataclass(frozen=True, kw_only=True)
class DailyBehind:
    """The `daily_sessions` dates to update: `figures` to compute again from `sessions`,
    `status` to give a new status only. `files` holds each date's current sessions files
    fingerprint, which the manifest records once the date is written."""

    figures: frozenset[date]
    status: frozenset[date]
    files: Mapping[date, str]
    grace: GracePeriod | None

    @property
    def dates(self) -> list[date]:
        return sorted(self.figures | self.status)


def daily_behind(store: DeltaStore, settings: Settings) -> DailyBehind:
    """Every `daily_sessions` date that does not match the lake (module docstring)."""
    current = {
        date.fromisoformat(value): _fingerprint(files)
        for value, files in store.partition_files(SESSIONS).items()
    }
    recorded = {
        row["partition_date"]: row["sessions_files"]
        for row in store.read_arrow(DAILY_SESSIONS_MANIFEST).to_pylist()
    }
    # A date whose sessions are all gone (an erasure) has an empty fingerprint to record.
    empty = _fingerprint([])
    figures = {day for day, files in current.items() if recorded.get(day) != files}
    figures |= {day for day, files in recorded.items() if day not in current and files != empty}
    grace = current_grace_period(store, settings)
    held = store.read_arrow(
        DAILY_SESSIONS,
        columns=["session_date", "status", "expected_completeness"],
        where=pc.field("channel") == ALL_CHANNELS,
    ).to_pylist()
    status = set()
    if grace is not None:
        status = {
            row["session_date"]
            for row in held
            if (row["status"], row["expected_completeness"])
            != (grace.status(row["session_date"]), grace.expected_completeness(row["session_date"]))
        }
    return DailyBehind(
        figures=frozenset(figures),
        status=frozenset(status - figures),
        files={day: current.get(day, empty) for day in figures},
        grace=grace,
    )


@dataclass(frozen=True, kw_only=True)
class DailyReport:
    """What an update of `daily_sessions` did: the dates computed again from `sessions`, those
    given a new status only, and the grace period it applied (None: no batch yet)."""

    recomputed: list[date]
    restated: list[date]
    grace: GracePeriod | None

    @property
    def changed(self) -> list[date]:
        return sorted({*self.recomputed, *self.restated})


def update_daily(store: DeltaStore, *, settings: Settings, run_id: str) -> DailyReport:
    """Bring every behind `daily_sessions` date up to date (`daily_behind`), in one commit of
    the table and then one of its manifest."""
    behind = daily_behind(store, settings)
    grace = behind.grace
    if not behind.dates or grace is None:
        return DailyReport(recomputed=[], restated=[], grace=grace)
    figures = sorted(behind.figures)
    statuses = grace.of_dates(behind.dates)
    fresh = daily_figures(
        store.read_arrow(SESSIONS, partitions=figures, columns=list(DAILY_SOURCE_COLUMNS)),
        statuses=statuses,
    )
    restated = sorted(behind.status)
    kept = store.read_arrow(DAILY_SESSIONS, partitions=restated)
    days = kept["session_date"].to_pylist()
    kept = kept.set_column(
        kept.schema.get_field_index("status"),
        "status",
        pa.array([statuses[day][0] for day in days], pa.string()),
    ).set_column(
        kept.schema.get_field_index("expected_completeness"),
        "expected_completeness",
        pa.array([statuses[day][1] for day in days], pa.float64()),
    )
    schema = to_arrow_schema(DAILY_SESSIONS.schema)
    rows = pa.concat_tables([fresh.cast(schema), kept.select(schema.names).cast(schema)])
    _replace(store, DAILY_SESSIONS, rows, partitions=behind.dates, run_id=run_id)
    now = datetime.now(UTC)
    manifest = [
        {"partition_date": day, "sessions_files": files, "run_id": run_id, "processed_at": now}
        for day, files in sorted(behind.files.items())
    ]
    _replace(
        store,
        DAILY_SESSIONS_MANIFEST,
        pa.Table.from_pylist(manifest, schema=to_arrow_schema(DAILY_SESSIONS_MANIFEST.schema)),
        partitions=figures,
        run_id=run_id,
    )
    return DailyReport(recomputed=figures, restated=restated, grace=grace)


def _fingerprint(files: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(sorted(files)).encode()).hexdigest()


def _replace(
    store: DeltaStore, spec: TableSpec, rows: pa.Table, *, partitions: list[date], run_id: str
) -> None:
    if not partitions:
        return
    store.replace_partitions_arrow(
        spec,
        rows,
        partitions=partitions,
        commit_metadata={"dagster_run_id": run_id, "table": spec.name},
    )
