"""The scale benchmark's figures of a batch, and its report: the tables it prints."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from bench_printing import table

from sessionize_assets.assets.reports import (
    STEP_FIGURES,
    AssetRecord,
    EventsRunMetadata,
    LifecycleRunMetadata,
    RawBatchMetadata,
    SessionsChangedMetadata,
    SessionsRunMetadata,
    StepFigures,
)
from sessionize_assets.definitions import (
    EVENTS_JOB,
    INGEST_JOB,
    LIFECYCLE_JOB,
    SESSIONS_JOB,
    SUMMARIES_JOB,
)

STEPS = (("ingest", INGEST_JOB), ("events", EVENTS_JOB), ("sessions", SESSIONS_JOB))
SNAPSHOT = ("snapshot", LIFECYCLE_JOB)
# SPEC §9's arrivals and daily_sessions, after the snapshot.
SUMMARIES = ("summaries", SUMMARIES_JOB)
StepT = TypeVar("StepT", bound=StepFigures)
RecordT = TypeVar("RecordT", bound=AssetRecord)


@dataclass(kw_only=True)
class BatchFigures:
    shape: str
    history: int
    seconds: dict[str, float] = field(default_factory=dict)
    # The metadata of each materialization of the batch's runs, by asset.
    metadata: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def step(self, name: str) -> float:
        return self.seconds.get(name, 0.0)

    @property
    def pipeline(self) -> float:
        """ingest + events + sessions: what the per-batch targets are about."""
        return sum(self.step(name) for name, _ in STEPS)

    def run(self, figures: type[StepT]) -> StepT:
        """A step's figures summed over the batch's runs of it (zeros when none ran): each
        range run reports them on one of its materializations only."""
        found = [
            r for m in self.metadata.get(figures.table.name, []) if (r := figures.in_metadata(m))
        ]
        return figures(
            **{x.name: sum(getattr(r, x.name) or 0 for r in found) for x in fields(figures)}
        )

    def total(self, record: type[RecordT], figure: Callable[[RecordT], int]) -> int:
        """A partition's figure summed over the batch's materializations of `record`'s table."""
        return sum(
            figure(record.from_metadata(m)) for m in self.metadata.get(record.table.name, [])
        )


def report(
    figures: list[BatchFigures],
    recompute: dict[str, dict[str, float]],
    *,
    histories: list[int],
    users: int,
) -> None:
    print()
    print(f"machine: {os.cpu_count()} cores; {users:,} users; histories {histories} days")
    for shape, full in recompute.items():
        print(
            f"[{shape}] lake after {histories[-1] + 1} days: {full['events']:,.0f} events, "
            f"{full['sessions']:,.0f} sessions; user_lifecycle_state {full['state_rows']:,.0f} "
            f"interval rows, against {full['user_days']:,.0f} user-days "
            f"({full['state_rows'] / max(full['user_days'], 1):.1%})"
        )
    print()
    print("(a) full recompute and (b) floor, seconds: (b) sessions from events, (b2) from raw")
    print(
        table(
            [
                "backend:shape",
                "rebuild events",
                "rebuild sessions",
                "(a) rebuild",
                "(b2) raw floor",
                "(a)/(b2)",
                "(a2) sessions only",
                "(b) floor",
                "(a2)/(b)",
            ],
            [
                [
                    shape,
                    f"{full.get('events_step', 0):.1f}",
                    f"{full.get('sessionize_step', 0):.1f}",
                    f"{full['rebuild']:.1f}",
                    f"{full['raw_floor']:.1f}",
                    f"{full['rebuild'] / full['raw_floor']:.2f}",
                    f"{full['sessions_rebuild']:.1f}",
                    f"{full['floor']:.1f}",
                    f"{full['sessions_rebuild'] / full['floor']:.2f}",
                ]
                for shape, full in recompute.items()
            ],
        )
    )
    print()
    print("(c) one daily batch end to end through the Dagster definitions, seconds")
    rows = []
    for f in figures:
        rebuild = recompute[f.shape]["rebuild"]
        base = next(g for g in figures if g.shape == f.shape and g.history == histories[0])
        rows.append(
            [
                f.shape,
                str(f.history),
                *(f"{f.step(name):.1f}" for name, _ in (*STEPS, SNAPSHOT, SUMMARIES)),
                f"{f.pipeline:.1f}",
                f"{100 * f.pipeline / rebuild:.1f}%",
                f"{f.pipeline / base.pipeline:.2f}",
                f"{f.step('snapshot') / max(f.step('events') + f.step('sessions'), 1e-9):.2f}",
            ]
        )
    print(
        table(
            [
                "backend:shape",
                "history",
                "ingest",
                "events",
                "sessions",
                "snapshot",
                "summaries",
                "i+e+s",
                "of (a)",
                f"vs {histories[0]}d",
                "snap/(e+s)",
            ],
            rows,
        )
    )
    print()
    print("(c2) Spark jobs the batch's runs started, per step (each action is one)")
    print(
        table(
            [
                "backend:shape",
                "history",
                "ingest",
                "events",
                "identities",
                "sessions",
                "snapshot",
                "i+e+id+s",
            ],
            [
                [
                    f.shape,
                    str(f.history),
                    *(str(f.run(step).spark_jobs) for step in STEP_FIGURES),
                    str(sum(f.run(step).spark_jobs or 0 for step in STEP_FIGURES[:-1])),
                ]
                for f in figures
            ],
        )
    )
    print()
    print("(d) rows read and written by the batch, per table")
    rows = []
    for f in figures:
        events, sessions = f.run(EventsRunMetadata), f.run(SessionsRunMetadata)
        new_events = events.new_events
        changed = f.total(
            SessionsChangedMetadata,
            lambda m: m.sessions_inserted + m.sessions_removed + m.sessions_replaced,
        )
        written = events.rows_written + sessions.rows_written
        rows.append(
            [
                f.shape,
                str(f.history),
                f"{f.total(RawBatchMetadata, lambda m: m.accepted):,}",
                f"{events.raw_rows_read:,}",
                f"{events.contested_ids:,}",
                f"{events.dates_also_changed}",
                f"{new_events:,}",
                f"{events.rows_written:,}",
                f"{events.files_removed}",
                f"{sessions.users_looked_up:,} in {sessions.dates_searched_by_user}d",
                f"{sessions.pairs_from_additions:,}",
                f"{sessions.events_rows_scanned:,}",
                f"{sessions.events_read:,}",
                f"{sessions.pairs_recomputed:,}",
                f"{changed:,}",
                f"{sessions.rows_written:,}",
                f"{sessions.files_rewritten}/{sessions.files_before}",
                f"{written / max(new_events + changed, 1):.2f}",
            ]
        )
    print(
        table(
            [
                "backend:shape",
                "history",
                "batch events",
                "raw read",
                "contested ids",
                "other dates changed",
                "new events",
                "events written",
                "events files rewr.",
                "sessions: users looked up",
                "pairs from additions",
                "events rows scanned",
                "events read",
                "pairs",
                "sessions changed",
                "sessions written",
                "sessions files rewr.",
                "written/(new+changed)",
            ],
            rows,
        )
    )
    print()
    print("(f) the lifecycle step: users restated and changed, rows written against the bound")
    print("    bound = 3 x (users whose state changed + 5 x snapshot days written)")
    rows = []
    for f in figures:
        state = f.run(LifecycleRunMetadata)
        days = state.snapshot_days_written
        changed_users = state.users_changed
        logical = state.interval_rows_added + 5 * days
        physical = state.interval_rows_written + 5 * days
        bound = 3 * (changed_users + 5 * days)
        rows.append(
            [
                f.shape,
                str(f.history),
                f"{f.step('snapshot'):.1f}",
                f"{f.step('snapshot') / max(f.step('events') + f.step('sessions'), 1e-9):.2f}",
                f"{days}",
                f"{state.users_restated:,}",
                f"{changed_users:,}",
                f"{state.interval_rows_removed:,}",
                f"{state.interval_rows_added:,}",
                f"{logical:,}",
                f"{bound:,}",
                f"{logical / max(bound, 1):.2f}",
                f"{physical:,}",
                f"{state.interval_files_rewritten}",
                f"{state.interval_rows:,}",
            ]
        )
    print(
        table(
            [
                "backend:shape",
                "history",
                "snapshot s",
                "snap/(e+s)",
                "days written",
                "users restated",
                "users changed",
                "intervals removed",
                "intervals added",
                "rows written",
                "bound",
                "written/bound",
                "rows in files written",
                "interval files rewr.",
                "interval rows",
            ],
            rows,
        )
    )
    print()
    print("(e) peak driver memory, MB")
    print(
        table(
            ["backend:shape", "python driver", "JVM (driver + local executors)"],
            [
                [shape, f"{full['peak_python_mb']:.0f}", f"{full['peak_jvm_mb']:.0f}"]
                for shape, full in recompute.items()
            ],
        )
    )
