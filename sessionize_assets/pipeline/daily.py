"""Keeping SPEC §9's two summary tables exact: `arrivals` (counted from `events`) and
`daily_sessions` (aggregated from `sessions`, with each date's status).

A summary date is behind when the files of its source partition are not the ones it was
counted from (`summaries_manifest`): a late event, a relabel by stitching, an erasure, whatever
run made the change. Those dates are counted again from their source. A `daily_sessions` date
is also behind when its status or expected completeness is no longer what the lake says (R
moved on, or the reference dates' arrivals changed): it keeps its figures and takes the new
status.

Everything here is a few rows a date, read and written on the driver with delta-rs (no Spark
job). Each question is answered from the lake at every call, so a run that failed or died
leaves its dates behind for the next one: a summary's rows are committed before the manifest
that says they are current.
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
    EVENTS,
    LANDING_BATCHES,
    SESSIONS,
    SUMMARIES_MANIFEST,
)
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.completeness import GracePeriod, grace_period
from sessionize_assets.transforms.daily import (
    ALL_CHANNELS,
    DAILY_SOURCE_COLUMNS,
    arrival_counts,
    daily_figures,
)

# Each summary table and the table it is counted from.
SOURCES = {ARRIVALS.name: EVENTS, DAILY_SESSIONS.name: SESSIONS}


def latest_received(store: DeltaStore) -> date | None:
    """R: the latest received day ingested (an empty batch folder counts), from the lake's
    landing record; None before the first batch."""
    days = store.read_arrow(LANDING_BATCHES, columns=["received_date"])["received_date"]
    return pc.max(days).as_py() if len(days) else None


def current_grace_period(store: DeltaStore, settings: Settings) -> GracePeriod | None:
    """The grace period at R, from `arrivals` as the lake holds it (None: no batch yet)."""
    latest = latest_received(store)
    if latest is None:
        return None
    rows = store.read_arrow(ARRIVALS).to_pylist()
    counts = {(row["event_date"], row["lag_days"]): row["events"] for row in rows}
    return grace_period(counts, latest_received=latest, lateness=settings.lateness)


@dataclass(frozen=True, kw_only=True)
class SourcesBehind:
    """The dates of a summary whose source partition changed since it was counted, each
    with its source files' fingerprint now (recorded once the date is counted again)."""

    summary: TableSpec
    files: Mapping[date, str]

    @property
    def dates(self) -> list[date]:
        return sorted(self.files)


def sources_behind(store: DeltaStore, summary: TableSpec) -> SourcesBehind:
    """`summary`'s dates whose source files are not the ones recorded (module docstring),
    dates whose source partition is gone included (counted again as empty)."""
    source = SOURCES[summary.name]
    current = {
        date.fromisoformat(value): _fingerprint(files)
        for value, files in store.partition_files(source).items()
    }
    recorded = _recorded(store, summary)
    empty = _fingerprint([])
    behind = {day: files for day, files in current.items() if recorded.get(day) != files}
    behind |= {
        day: empty for day, files in recorded.items() if day not in current and files != empty
    }
    return SourcesBehind(summary=summary, files=behind)


def update_arrivals(store: DeltaStore, *, run_id: str) -> dict[date, dict[int, int]]:
    """Count again the arrivals of every event date whose `events` changed, and return them,
    events by lag per date."""
    behind = sources_behind(store, ARRIVALS)
    dates = behind.dates
    if not dates:
        return {}
    events = store.read_arrow(EVENTS, partitions=dates, columns=["event_date", "received_date"])
    counts = arrival_counts(events)
    _replace(store, ARRIVALS, counts, partitions=dates, run_id=run_id)
    _record(store, behind, run_id=run_id)
    by_date: dict[date, dict[int, int]] = {day: {} for day in dates}
    for row in counts.to_pylist():
        by_date[row["event_date"]][row["lag_days"]] = row["events"]
    return by_date


@dataclass(frozen=True, kw_only=True)
class DailyBehind:
    """The `daily_sessions` dates to update: `figures`, to aggregate again from `sessions`;
    `status`, to give their new status only; at `grace` (None: no batch yet)."""

    figures: SourcesBehind
    status: frozenset[date]
    grace: GracePeriod | None

    @property
    def dates(self) -> list[date]:
        return sorted({*self.figures.files, *self.status})


def daily_behind(store: DeltaStore, settings: Settings) -> DailyBehind:
    """Every `daily_sessions` date that does not match the lake (module docstring)."""
    figures = sources_behind(store, DAILY_SESSIONS)
    grace = current_grace_period(store, settings)
    status: set[date] = set()
    if grace is not None:
        held = store.read_arrow(
            DAILY_SESSIONS,
            columns=["session_date", "status", "expected_completeness"],
            where=pc.field("channel") == ALL_CHANNELS,
        ).to_pylist()
        status = {
            row["session_date"]
            for row in held
            if (row["status"], row["expected_completeness"])
            != (grace.status(row["session_date"]), grace.expected_completeness(row["session_date"]))
        }
    return DailyBehind(figures=figures, status=frozenset(status - set(figures.files)), grace=grace)


@dataclass(frozen=True, kw_only=True)
class DailyReport:
    """What an update of `daily_sessions` did: the dates aggregated again from `sessions`, those
    given a new status only, and the grace period it applied (None: no batch yet)."""

    recomputed: list[date]
    restated: list[date]
    grace: GracePeriod | None

    @property
    def changed(self) -> list[date]:
        return sorted({*self.recomputed, *self.restated})


def update_daily(store: DeltaStore, *, settings: Settings, run_id: str) -> DailyReport:
    """Bring every behind `daily_sessions` date up to date (`daily_behind`): one commit of the
    table, then one of the manifest."""
    behind = daily_behind(store, settings)
    grace = behind.grace
    if grace is None or not behind.dates:
        return DailyReport(recomputed=[], restated=[], grace=grace)
    recomputed, restated = behind.figures.dates, sorted(behind.status)
    statuses = grace.of_dates(behind.dates)
    schema = to_arrow_schema(DAILY_SESSIONS.schema)
    fresh = daily_figures(
        store.read_arrow(SESSIONS, partitions=recomputed, columns=list(DAILY_SOURCE_COLUMNS)),
        statuses=statuses,
    ).cast(schema)
    kept = store.read_arrow(DAILY_SESSIONS, partitions=restated).select(schema.names)
    days = kept["session_date"].to_pylist()
    for name, position in (("status", 0), ("expected_completeness", 1)):
        column = pa.array([statuses[day][position] for day in days], schema.field(name).type)
        kept = kept.set_column(schema.get_field_index(name), name, column)
    rows = pa.concat_tables([fresh, kept.cast(schema)])
    _replace(store, DAILY_SESSIONS, rows, partitions=behind.dates, run_id=run_id)
    _record(store, behind.figures, run_id=run_id)
    return DailyReport(recomputed=recomputed, restated=restated, grace=grace)


def latest_days(store: DeltaStore, *, days: int) -> list[dict]:
    """The `(all)` rows of the latest `days` session dates `daily_sessions` holds, oldest
    first: what `sessionize daily` prints."""
    rows = store.read_arrow(DAILY_SESSIONS, where=pc.field("channel") == ALL_CHANNELS).to_pylist()
    return sorted(rows, key=lambda row: row["session_date"])[-days:] if days > 0 else []


def _fingerprint(files: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(sorted(files)).encode()).hexdigest()


def _recorded(store: DeltaStore, summary: TableSpec) -> dict[date, str]:
    return {day: row["source_files"] for day, row in _manifest(store, summary).items()}


def _manifest(store: DeltaStore, summary: TableSpec) -> dict[date, dict]:
    rows = store.read_arrow(SUMMARIES_MANIFEST, partitions=[summary.name]).to_pylist()
    return {row["partition_date"]: row for row in rows}


def _record(store: DeltaStore, behind: SourcesBehind, *, run_id: str) -> None:
    """Record the counted dates' source files: the summary's manifest partition (a row a date,
    a few hundred at most) rewritten with them."""
    if not behind.files:
        return
    name = behind.summary.name
    now = datetime.now(UTC)
    rows = _manifest(store, behind.summary)
    for day, files in behind.files.items():
        rows[day] = {
            "summary": name,
            "partition_date": day,
            "source_files": files,
            "run_id": run_id,
            "processed_at": now,
        }
    schema = to_arrow_schema(SUMMARIES_MANIFEST.schema)
    table = pa.Table.from_pylist([rows[day] for day in sorted(rows)], schema=schema)
    _replace(store, SUMMARIES_MANIFEST, table, partitions=[name], run_id=run_id)


def _replace(
    store: DeltaStore, spec: TableSpec, rows: pa.Table, *, partitions: list, run_id: str
) -> None:
    if partitions:
        store.replace_partitions_arrow(
            spec,
            rows,
            partitions=partitions,
            commit_metadata={"dagster_run_id": run_id, "table": spec.name},
        )
