"""A landing zone and lake processed batch by batch in the tests, as production does (without
Dagster), and the comparison of its tables with the full recompute."""

from __future__ import annotations

import json
from collections import Counter
from datetime import date, datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import Row

from sessionize_assets.lake.delta_spark.store import DeltaSparkStore
from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_assets.lake.tables import (
    EVENTS,
    REJECTED_EVENTS,
    SESSION_CHANGES,
    SESSION_QUARANTINE,
    SESSIONS,
    USER_IDENTITIES,
    USER_LIFECYCLE_SNAPSHOT,
)
from sessionize_assets.settings import Settings
from sessionize_tests.driver import BatchRun, process_batch, summarise
from sessionize_tests.full_recompute import (
    assert_lifecycle_equals_full_recompute,
    reference_daily_sessions,
    summary_differences,
)
from sessionize_tests.reference import (
    SESSION_ATTRIBUTES,
    reference_identities,
    reference_sessions,
    reference_validate,
    stitched,
)
from sessionize_tests.table_rows import table_rows

D = date(2026, 1, 10)


def day(offset: int) -> date:
    return D + timedelta(days=offset)


class Pipeline:
    """A landing zone and lake in tmp folders, processed batch by batch like production."""

    def __init__(
        self, spark, settings: Settings, *, store: type[EmbeddedDeltaStore] = EmbeddedDeltaStore
    ) -> None:
        self.spark = spark
        self.settings = settings
        self.store = store(spark=spark, lake=settings.lake_dir)
        self.runs = 0

    def land(self, received: date, events: list[tuple], *, name: str = "part.jsonl") -> None:
        """events: (message_id, user, 'YYYY-MM-DD HH:MM[:SS]'[, message fields]) received on
        `received`; the fields (type, properties, context...) replace a track `Tapped`."""
        folder = self.settings.landing_dir / f"received_date={received.isoformat()}"
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        lines = []
        for i, (mid, user, ts, *fields) in enumerate(events):
            when = datetime.fromisoformat(ts)
            arrived = max(when, datetime.combine(received, datetime.min.time())) + timedelta(
                seconds=i + 1
            )
            assert arrived.date() == received, "test data: event arrives on another day"
            lines.append(
                json.dumps(
                    {
                        "messageId": mid,
                        "userId": user,
                        "timestamp": when.isoformat() + "Z",
                        "receivedAt": arrived.isoformat() + "Z",
                        **(fields[0] if fields else {"type": "track", "event": "Tapped"}),
                    }
                )
            )
        (folder / name).write_text("\n".join(lines) + "\n")

    def process(self, received: date) -> BatchRun:
        self.runs += 1
        return process_batch(
            self.store,
            self.spark,
            settings=self.settings,
            received=received,
            run_id=f"run-{self.runs}",
        )

    def summarise(self, *, run_id: str) -> None:
        """SPEC §9's summaries_job, for a test that runs the other steps one by one: after it,
        `arrivals` and `daily_sessions` are up to date with the lake."""
        summarise(self.store, settings=self.settings, run_id=run_id)

    def sessions(self, rows: list[Row] | None = None) -> list[tuple]:
        """The sessions as (user, start, end, events, number, quarantined), of the table or
        of `rows` read from it."""
        return sorted(
            (
                r.user_id,
                r.session_start.isoformat(sep=" "),
                r.session_end.isoformat(sep=" "),
                r.event_count,
                r.session_number,
                r.is_quarantined,
            )
            for r in (table_rows(self.store, SESSIONS) if rows is None else rows)
        )

    def assert_equals_full_recompute(
        self, *, landing: Path | None = None, erased_lines: int = 0
    ) -> None:
        """The lake against the full recompute of the landing zone (or of `landing`, the zone
        without an erasure's lines), with `erased_lines` re-delivered since rejected as
        `erased`."""
        ref = reference_validate(landing or self.settings.landing_dir, self.settings.start_date)
        events = {r.event_id: r for r in table_rows(self.store, EVENTS)}
        assert set(events) == set(ref.winners)
        for event_id, winner in ref.winners.items():
            assert events[event_id].received_date == winner.received_date
            assert events[event_id].event_ts == winner.ts.replace(tzinfo=None)
        rejected = Counter(r.reason for r in table_rows(self.store, REJECTED_EVENTS))
        assert rejected == ref.rejections + Counter({"erased": erased_lines})
        ref_sessions = reference_sessions(
            ref.winners,
            gap=self.settings.session_gap,
            max_length=self.settings.max_session_length,
            conversion_events=self.settings.conversion_events,
        )
        expected = sorted(
            (
                s.user_id,
                s.session_start.replace(tzinfo=None).isoformat(sep=" "),
                s.session_end.replace(tzinfo=None).isoformat(sep=" "),
                s.event_count,
                s.session_number,
                s.is_quarantined,
            )
            for s in ref_sessions
        )
        sessions = table_rows(self.store, SESSIONS)
        assert self.sessions(sessions) == expected
        # SPEC §3b and §3c: every attribute of every session, and its stitched user.
        identities = reference_identities(ref.winners)
        assert self.identities() == {
            key: (found.user_id, found.identified_at.replace(tzinfo=None))
            for key, found in identities.items()
        }
        assert {
            (r.user_id, r.session_start): (
                *(r[name] for name in SESSION_ATTRIBUTES),
                r.stitched_user_id,
            )
            for r in sessions
        } == {
            (s.user_id, s.session_start.replace(tzinfo=None)): (
                *(s.attributes[name] for name in SESSION_ATTRIBUTES),
                stitched(s.user_id, identities),
            )
            for s in ref_sessions
        }
        quarantined = {r.session_id for r in table_rows(self.store, SESSION_QUARANTINE)}
        flagged = {r.session_id for r in sessions if r.is_quarantined}
        assert quarantined == flagged
        # SPEC §9: the arrival curve and the daily figures with their statuses.
        summaries = summary_differences(
            self.store,
            self.settings,
            ref.winners,
            reference_daily_sessions(ref_sessions, identities),
        )
        assert not summaries, "\n".join(summaries)
        assert_lifecycle_equals_full_recompute(
            self.store,
            start=self.settings.start_date,
            session_days=[(s.user_id, s.session_start.date()) for s in ref_sessions],
        )

    def identities(self) -> dict[str, tuple[str, datetime]]:
        """user_identities as anonymous_id: (user_id, identified_at)."""
        return {
            r.anonymous_id: (r.user_id, r.identified_at)
            for r in table_rows(self.store, USER_IDENTITIES)
        }

    def stitched(self) -> dict[tuple[str, str], str]:
        """(user key, session start) -> stitched_user_id of every session."""
        return {
            (r.user_id, r.session_start.isoformat(sep=" ")): r.stitched_user_id
            for r in table_rows(self.store, SESSIONS)
        }

    def lifecycle(self, snapshot_date: date) -> dict[str, tuple[int, int, int]]:
        """The snapshot of one day: (users, entered, exited) for the states not all zero."""
        rows = table_rows(self.store, USER_LIFECYCLE_SNAPSHOT)
        return {
            r.state: (r.users, r.entered, r.exited)
            for r in rows
            if r.snapshot_date == snapshot_date and (r.users or r.exited)
        }

    def changes(self, run: str, *, user: str | None = None) -> list[tuple]:
        """The corrections log of `run` (of `user`'s sessions only, when given)."""
        rows = table_rows(self.store, SESSION_CHANGES)
        return sorted(
            (r.change, r.session_start.isoformat(sep=" "), r.event_count)
            for r in rows
            if r.run_id == run and user in (None, r.user_id)
        )


# The placements of a change's keys (conftest.py's `pair_placement`): both on the embedded
# store, Spark's joins on delta-spark. The placement is read-side code both backends share
# (`lake/delta_rs/reads.py`, `pipeline/keyed_reads.py`), and delta-spark writes every change
# with Delta's operations whatever the placement, so its hash-set run would repeat the
# embedded one's reads and its own join run's writes (what it saves: docs/testing.md).
ON_EACH_BACKEND_AND_PLACEMENT = pytest.mark.parametrize(
    ("pipeline", "pair_placement"),
    [(EmbeddedDeltaStore, "hash_set"), (EmbeddedDeltaStore, "join"), (DeltaSparkStore, "join")],
    ids=["embedded-hash_set", "embedded-join", "delta-spark-join"],
    indirect=True,
)


class Killed(BaseException):
    """The run's process stops here, as with kill -9: nothing after it runs."""


class KilledBeforeCommitTo:
    """The lake as seen by a run killed just before it commits to one table."""

    def __init__(self, store: EmbeddedDeltaStore, table: str) -> None:
        self._store, self._table = store, table

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def _commit(self, method: str, spec, *args, **kwargs):
        if spec.name == self._table:
            raise Killed(spec.name)
        return getattr(self._store, method)(spec, *args, **kwargs)

    def rewrite(self, spec, **kwargs):
        return self._commit("rewrite", spec, **kwargs)

    def replace_partitions_arrow(self, spec, data, **kwargs):
        return self._commit("replace_partitions_arrow", spec, data, **kwargs)

    def replace_partitions(self, spec, df, **kwargs):
        return self._commit("replace_partitions", spec, df, **kwargs)

    def rewrite_arrow(self, spec, **kwargs):
        return self._commit("rewrite_arrow", spec, **kwargs)
