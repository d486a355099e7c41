"""Late data, batch by batch: the incremental tables always equal a full recompute."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from datetime import date, datetime, timedelta

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder
from pyspark.sql import Row

from sessionize_assets.checks import scope as check_scope
from sessionize_assets.lake.delta_spark import DeltaSparkStore
from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_assets.lake.store import WriteConflictError
from sessionize_assets.lake.tables import (
    EVENTS,
    LANDING_BATCHES,
    REJECTED_EVENTS,
    SESSION_CHANGES,
    SESSION_QUARANTINE,
    SESSIONS,
    SESSIONS_FILE_ROWS,
    USER_IDENTITIES,
    USER_LIFECYCLE_SNAPSHOT,
    USER_LIFECYCLE_STATE,
)
from sessionize_assets.partitions import session_dates_for
from sessionize_assets.pipeline import keyed_reads
from sessionize_assets.pipeline import sessions as sessions_pipeline
from sessionize_assets.pipeline.events import update_events
from sessionize_assets.pipeline.identities import update_identities
from sessionize_assets.pipeline.ingest import ingest_batches
from sessionize_assets.pipeline.landing import fingerprint
from sessionize_assets.pipeline.lifecycle import update_lifecycle
from sessionize_assets.pipeline.sessions import update_sessions
from sessionize_assets.resources.landing import LandingZoneResource
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.lifecycle import OPEN_END, states_by_day
from sessionize_tests.driver import BatchRun, process_batch
from sessionize_tests.lifecycle_reference import lifecycle_reference, reference_intervals
from sessionize_tests.reference import (
    SESSION_ATTRIBUTES,
    reference_identities,
    reference_sessions,
    reference_validate,
    stitched,
)
from sessionize_tests.table_rows import table_rows

# Minutes of batches in all: started first (conftest.py).
pytestmark = pytest.mark.slow

D = date(2026, 1, 10)


def day(offset: int) -> date:
    return D + timedelta(days=offset)


def intervals(store: EmbeddedDeltaStore) -> set[tuple]:
    """user_lifecycle_state as (user, state, valid_from, valid_to), None for an open stretch."""
    return {
        (r.user_id, r.state, r.valid_from, None if r.valid_to == OPEN_END else r.valid_to)
        for r in table_rows(store, USER_LIFECYCLE_STATE)
    }


def assert_lifecycle_equals_full_recompute(
    store: EmbeddedDeltaStore, *, start: date, session_days: list[tuple[str, date]]
) -> None:
    """SPEC §4 from the start date through the latest batch: the intervals, each user's state
    on each day (the per-day view of the intervals), and the snapshot."""
    # SPEC §4: through the latest received day ingested, an empty batch included.
    end = max(date.fromisoformat(d) for d in store.row_counts(LANDING_BATCHES))
    expected_states, expected_rows = lifecycle_reference(
        session_days=session_days, start=start, end=end
    )
    assert intervals(store) == reference_intervals(expected_states, end=end)
    by_day = states_by_day(store.read(USER_LIFECYCLE_STATE), first_date=start, last_date=end)
    states = {
        (r.snapshot_date, r.user_id): (r.state, r.state_since, r.days_in_state)
        for r in by_day.collect()
    }
    assert states == expected_states
    rows = sorted(
        (r.snapshot_date, r.state, r.users, r.entered, r.exited)
        for r in table_rows(store, USER_LIFECYCLE_SNAPSHOT)
    )
    assert rows == expected_rows


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

    def assert_equals_full_recompute(self) -> None:
        ref = reference_validate(self.settings.landing_dir, self.settings.start_date)
        events = {r.event_id: r for r in table_rows(self.store, EVENTS)}
        assert set(events) == set(ref.winners)
        for event_id, winner in ref.winners.items():
            assert events[event_id].received_date == winner.received_date
            assert events[event_id].event_ts == winner.ts.replace(tzinfo=None)
        rejected = Counter(r.reason for r in table_rows(self.store, REJECTED_EVENTS))
        assert rejected == ref.rejections
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

    def changes(self, run: str) -> list[tuple]:
        rows = table_rows(self.store, SESSION_CHANGES)
        return sorted(
            (r.change, r.session_start.isoformat(sep=" "), r.event_count)
            for r in rows
            if r.run_id == run
        )


@pytest.fixture
def pipeline(request, spark, settings) -> Pipeline:
    """On the embedded store, or the one `ON_EACH_BACKEND` gives."""
    return Pipeline(spark, settings, store=getattr(request, "param", EmbeddedDeltaStore))


# The five ways a late event changes sessions, on both storage backends.
ON_EACH_BACKEND = pytest.mark.parametrize(
    "pipeline",
    [EmbeddedDeltaStore, DeltaSparkStore],
    ids=["embedded", "delta-spark"],
    indirect=True,
)


@pytest.fixture(params=["hash_set", "join"])
def pair_placement(request, monkeypatch) -> str:
    """Up to PUSHED_KEYS_TOTAL keys or pairs are a hash-set filter in the queries, more are a
    join: the same rules in both placements, under the same tests (0 forces the joins)."""
    if request.param == "join":
        for module in (sessions_pipeline, keyed_reads, check_scope):
            monkeypatch.setattr(module, "PUSHED_KEYS_TOTAL", 0)
    return request.param


@ON_EACH_BACKEND
def test_late_event_merges_two_sessions(pipeline, pair_placement):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00"), ("b", "u", "2026-01-10 10:50")])
    pipeline.process(day(0))
    assert [s[1] for s in pipeline.sessions()] == ["2026-01-10 10:00:00", "2026-01-10 10:50:00"]

    pipeline.land(day(3), [("c", "u", "2026-01-10 10:25")])
    run = pipeline.process(day(3))

    assert pipeline.sessions() == [("u", "2026-01-10 10:00:00", "2026-01-10 10:50:00", 3, 1, False)]
    pipeline.assert_equals_full_recompute()
    assert run.sessions.users_recomputed == 1
    assert pipeline.changes("run-2") == [
        ("added", "2026-01-10 10:00:00", 3),
        ("removed", "2026-01-10 10:00:00", 1),
        ("removed", "2026-01-10 10:50:00", 1),
    ]


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


def test_a_run_killed_between_the_sessions_commit_and_its_log_is_logged_by_the_next(
    pipeline, spark
):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00"), ("b", "u", "2026-01-10 10:50")])
    pipeline.process(day(0))
    pipeline.land(day(3), [("c", "u", "2026-01-10 10:25")])
    killed = KilledBeforeCommitTo(pipeline.store, "session_changes")
    with pytest.raises(Killed):
        process_batch(killed, spark, settings=pipeline.settings, received=day(3), run_id="k")
    merged = pipeline.store.version(SESSIONS)

    run = pipeline.process(day(3))  # the retry: its rows compare equal, the log says otherwise

    assert run.sessions.versions_logged_late == [merged]
    assert pipeline.changes("run-2") == [
        ("added", "2026-01-10 10:00:00", 3),
        ("removed", "2026-01-10 10:00:00", 1),
        ("removed", "2026-01-10 10:50:00", 1),
    ]
    pipeline.assert_equals_full_recompute()
    assert pipeline.process(day(3)).sessions.versions_logged_late == []


@ON_EACH_BACKEND
def page(url: str, referrer: str | None = None) -> dict:
    """A page view's message fields."""
    return {"type": "page", "properties": {"url": url, "referrer": referrer}}


@ON_EACH_BACKEND
def test_a_late_first_page_event_changes_the_landing_page_and_channel(pipeline):
    """SPEC §3b: the batch that delivers a session's new first page event gives the session
    that page's landing URL, referrer, campaign and channel."""
    landing = "https://shop.example/sale?utm_source=ads&utm_medium=CPC"
    pipeline.land(
        day(0),
        [
            ("b", "u", "2026-01-10 10:10", page("https://shop.example/p", "https://t.co/x")),
            ("c", "u", "2026-01-10 10:12", page("https://shop.example/cart")),
        ],
    )
    pipeline.process(day(0))
    before = pipeline.store.read(SESSIONS).collect()
    assert [(r.landing_page_url, r.referrer_host, r.channel) for r in before] == [
        ("https://shop.example/p", "t.co", "Organic Social")
    ]
    pipeline.land(day(2), [("a", "u", "2026-01-10 10:00", page(landing, "https://www.google.de/"))])
    pipeline.process(day(2))
    (after,) = pipeline.store.read(SESSIONS).collect()
    assert (after.landing_page_url, after.referrer_host, after.utm_source, after.channel) == (
        landing,
        "google.de",
        "ads",
        "Paid Search",
    )
    assert (after.page_views, after.exit_page_url) == (3, "https://shop.example/cart")
    pipeline.assert_equals_full_recompute()


def device(anonymous_id: str, **fields) -> dict:
    """Message fields of a device's event: anonymous until `userId` is given."""
    return {
        "type": "track",
        "event": "Tapped",
        "userId": None,
        "anonymousId": anonymous_id,
        **fields,
    }


# Other visitors of each day: three sessions files a day (SESSIONS_FILE_ROWS), of which the
# device's sessions ("d-1" sorts first) are in one.
CROWD = 2 * SESSIONS_FILE_ROWS + 100


def crowd(on: date) -> list[tuple]:
    return [(f"{on}-o{n:04d}", f"o{n:04d}", f"{on} 12:00") for n in range(CROWD)]


@ON_EACH_BACKEND
def test_a_late_sign_in_relabels_the_device_sessions_on_every_date(pipeline, pair_placement):
    """SPEC §3c: a device's sign-in that arrives days late maps its anonymous sessions on
    three dates to the user, rewriting the one file of each date that holds them, in the
    run's one sessions commit; a later sign-in of another user on the same (shared) device
    maps them to that user."""
    for offset in range(3):
        on = day(offset)
        pipeline.land(on, [(f"d{offset}", None, f"{on} 09:00", device("d-1")), *crowd(on)])
        pipeline.process(on)
    assert set(pipeline.stitched().values()) >= {"d-1"}
    files = {
        d: set(pipeline.store.live_files(SESSIONS, partitions=[d])) for d in map(day, range(3))
    }
    assert all(len(found) == 3 for found in files.values())

    # Signed in on the second day, delivered on the sixth.
    pipeline.land(day(5), [("s1", "alice", "2026-01-11 09:10", device("d-1", userId="alice"))])
    version = pipeline.store.version(SESSIONS)
    run = pipeline.process(day(5))
    assert pipeline.store.version(SESSIONS) == version + 1
    assert (run.identities.ids_new, run.identities.ids_remapped) == (1, 0)
    relabel = run.sessions.relabel
    assert (relabel.ids_changed, relabel.rows_relabelled) == (1, 3)
    assert relabel.by_date == {day(0): 1, day(1): 1, day(2): 1}
    assert relabel.files_rewritten == 3  # one of each date's three
    for d, before in files.items():
        after = set(pipeline.store.live_files(SESSIONS, partitions=[d]))
        assert len(before - after) == 1
    stitched = pipeline.stitched()
    assert [stitched[("d-1", f"{day(n)} 09:00:00")] for n in range(3)] == ["alice"] * 3
    assert stitched[("o0001", f"{day(0)} 12:00:00")] == "o0001"
    pipeline.assert_equals_full_recompute()
    # No session changed: the corrections log has nothing of the relabelling.
    assert pipeline.changes("run-4") == [("added", "2026-01-11 09:10:00", 1)]

    # A later sign-in of bob on the same device, delivered on time: bob's now.
    pipeline.land(day(6), [("s2", "bob", "2026-01-16 20:00", device("d-1", userId="bob"))])
    run = pipeline.process(day(6))
    assert (run.identities.ids_new, run.identities.ids_remapped) == (0, 1)
    assert run.sessions.relabel.rows_relabelled == 3
    assert {v for (user, _), v in pipeline.stitched().items() if user == "d-1"} == {"bob"}
    assert pipeline.identities()["d-1"] == ("bob", datetime(2026, 1, 11, 9, 10))
    pipeline.assert_equals_full_recompute()


def test_a_displaced_sign_in_unmaps_the_device(pipeline):
    """A device's only sign-in is displaced by an earlier batch's copy of its id that carries
    no userId (SPEC §2): the device is recomputed from its events, is no longer identified,
    and its sessions are its own again."""
    pipeline.land(day(0), [("a", None, "2026-01-10 09:00", device("d-1"))])
    pipeline.process(day(0))
    pipeline.land(day(2), [("m", "alice", "2026-01-10 09:05", device("d-1", userId="alice"))])
    pipeline.process(day(2))
    assert pipeline.identities() == {"d-1": ("alice", datetime(2026, 1, 10, 9, 5))}
    assert pipeline.stitched()[("d-1", "2026-01-10 09:00:00")] == "alice"

    # The same id, received a day earlier (delivered late): it wins, without a userId.
    pipeline.land(day(1), [("m", None, "2026-01-10 09:05", device("d-1"))])
    run = pipeline.process(day(1))
    assert (run.identities.ids_recomputed, run.identities.ids_unmapped) == (1, 1)
    assert pipeline.identities() == {}
    assert set(pipeline.stitched().values()) == {"d-1"}
    pipeline.assert_equals_full_recompute()


def test_late_event_inside_a_session_only_extends_its_count(pipeline):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00"), ("b", "u", "2026-01-10 10:20")])
    pipeline.process(day(0))
    pipeline.land(day(1), [("c", "u", "2026-01-10 10:10")])
    pipeline.process(day(1))
    assert pipeline.sessions() == [("u", "2026-01-10 10:00:00", "2026-01-10 10:20:00", 3, 1, False)]
    pipeline.assert_equals_full_recompute()


@ON_EACH_BACKEND
def test_late_event_creates_a_session_between_two_and_renumbers(pipeline):
    pipeline.land(day(0), [("a", "u", "2026-01-10 08:00"), ("b", "u", "2026-01-10 12:00")])
    pipeline.process(day(0))
    pipeline.land(day(2), [("c", "u", "2026-01-10 10:00")])
    pipeline.process(day(2))
    assert [(s[1][11:16], s[4]) for s in pipeline.sessions()] == [
        ("08:00", 1),
        ("10:00", 2),
        ("12:00", 3),
    ]
    pipeline.assert_equals_full_recompute()


@ON_EACH_BACKEND
def test_late_event_joins_the_previous_days_session_across_midnight(pipeline):
    pipeline.land(day(0), [("a", "u", "2026-01-10 23:50")])
    pipeline.land(day(1), [("b", "u", "2026-01-11 00:30")], name="b.jsonl")
    pipeline.process(day(0))
    pipeline.process(day(1))
    assert len(pipeline.sessions()) == 2

    pipeline.land(day(5), [("c", "u", "2026-01-11 00:10")])
    pipeline.process(day(5))

    assert pipeline.sessions() == [("u", "2026-01-10 23:50:00", "2026-01-11 00:30:00", 3, 1, False)]
    pipeline.assert_equals_full_recompute()


@ON_EACH_BACKEND
def test_late_event_pulls_the_next_days_session_in(pipeline):
    pipeline.land(day(0), [("a", "u", "2026-01-10 23:00")])
    pipeline.land(day(1), [("b", "u", "2026-01-11 00:20")])
    pipeline.process(day(0))
    pipeline.process(day(1))
    assert [s[1][:10] for s in pipeline.sessions()] == ["2026-01-10", "2026-01-11"]

    pipeline.land(day(4), [("c", "u", "2026-01-10 23:55")])
    pipeline.process(day(4))

    assert pipeline.sessions() == [
        ("u", "2026-01-10 23:00:00", "2026-01-10 23:00:00", 1, 1, False),
        ("u", "2026-01-10 23:55:00", "2026-01-11 00:20:00", 2, 2, False),
    ]
    pipeline.assert_equals_full_recompute()


def test_a_late_event_rewrites_only_its_users_file(pipeline):
    users = 2 * SESSIONS_FILE_ROWS + 10  # three user-range files on the day
    pipeline.land(
        day(0),
        [(f"m{i}", f"user-{i:05d}", f"2026-01-10 {8 + i % 10:02d}:00") for i in range(users)],
    )
    pipeline.process(day(0))
    before = set(pipeline.store.live_files(SESSIONS))
    assert len(before) == 3
    pipeline.land(day(2), [("late", "user-00003", "2026-01-10 11:10")])
    run = pipeline.process(day(2))
    # One user, on the session days an event on 01-10 can decide: 01-08 .. 01-11.
    assert run.sessions.users_recomputed == 1 and run.sessions.pairs_recomputed == 4
    assert (run.sessions.inserted, run.sessions.replaced, run.sessions.removed) == (0, 1, 0)
    assert run.sessions.files_rewritten == 1 and run.sessions.files_total == 3
    assert len(before & set(pipeline.store.live_files(SESSIONS))) == 2  # the others kept
    assert run.events.new_events == 1 and run.events.rows_written == 1  # appended, not rewritten
    pipeline.assert_equals_full_recompute()


def test_duplicates_across_batches_whatever_the_order(pipeline):
    pipeline.land(day(0), [("x", "u", "2026-01-10 10:00"), ("y", "u", "2026-01-10 10:05")])
    pipeline.land(day(2), [("x", "u", "2026-01-10 10:00"), ("z", "v", "2026-01-12 09:00")])
    pipeline.process(day(2))  # the later batch first: its copy of x wins for now
    pipeline.process(day(0))  # the earlier batch arrives: its copy wins, day(2)'s is rejected
    pipeline.assert_equals_full_recompute()
    dup = pipeline.store.read(REJECTED_EVENTS).where("reason = 'duplicate'").collect()
    assert [(r.message_id, r.received_date) for r in dup] == [("x", day(2))]
    assert json.loads(dup[0].raw_line)["messageId"] == "x"


def test_batches_in_any_order_converge(pipeline, pair_placement):
    batches = {
        day(0): [("a", "u", "2026-01-10 10:00"), ("b", "v", "2026-01-10 23:45")],
        day(1): [("c", "v", "2026-01-11 00:05"), ("d", "u", "2026-01-10 10:40")],
        day(3): [("e", "u", "2026-01-10 10:20"), ("f", "v", "2026-01-11 00:35")],
    }
    for received, events in batches.items():
        pipeline.land(received, events)
    for received in (day(3), day(0), day(1)):
        pipeline.process(received)
    pipeline.assert_equals_full_recompute()


def test_redelivered_batch_replaces_what_it_brought(pipeline):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00"), ("b", "u", "2026-01-10 10:20")])
    pipeline.land(day(1), [("c", "u", "2026-01-10 10:40"), ("d", "u", "2026-01-11 09:00")])
    pipeline.process(day(0))
    pipeline.process(day(1))
    pipeline.assert_equals_full_recompute()

    # Re-delivered: "c" is gone, "e" is new, and the batch no longer touches 2026-01-11.
    pipeline.land(day(1), [("e", "u", "2026-01-10 10:10")], name="redelivered.jsonl")
    run = pipeline.process(day(1))

    assert run.events.recomputed == [day(0), day(1)]
    pipeline.assert_equals_full_recompute()
    assert pipeline.sessions() == [("u", "2026-01-10 10:00:00", "2026-01-10 10:20:00", 3, 1, False)]


def test_reprocessing_without_new_data_changes_nothing(pipeline):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00")])
    pipeline.process(day(0))
    version = pipeline.store.version(SESSIONS)
    run = pipeline.process(day(0))  # same files again: same rows, new raw version
    pipeline.assert_equals_full_recompute()
    assert run.sessions.inserted == run.sessions.removed == 0
    assert pipeline.store.version(SESSIONS) >= version


def test_quarantine_follows_late_bot_events(pipeline, pair_placement):
    start = datetime(2026, 1, 10, 0, 0)
    bot = [
        (f"b{i}", "bot", (start + timedelta(minutes=25 * i)).isoformat(sep=" "))
        for i in range(0, 62)
    ]
    pipeline.land(day(0), [e for e in bot if e[2] < "2026-01-11"])
    pipeline.process(day(0))
    assert not any(s[5] for s in pipeline.sessions())
    pipeline.land(day(2), [e for e in bot if e[2] >= "2026-01-11"])
    pipeline.process(day(2))
    pipeline.assert_equals_full_recompute()
    assert any(s[5] for s in pipeline.sessions())


def test_late_session_corrects_the_lifecycle_from_its_day_on(pipeline):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00"), ("w", "w", "2026-01-10 11:00")])
    pipeline.process(day(0))
    pipeline.land(day(3), [("b", "u", "2026-01-13 10:00"), ("c", "v", "2026-01-13 11:00")])
    pipeline.process(day(3))
    assert pipeline.lifecycle(day(1)) == {"inactive": (2, 2, 0), "new": (0, 0, 2)}
    before = intervals(pipeline.store)
    version = pipeline.store.version(USER_LIFECYCLE_SNAPSHOT)

    # Received on day 4, happened on day 1: u turns active on day 1, days 2..4 move with it.
    pipeline.land(day(4), [("d", "u", "2026-01-11 12:00")])
    run = pipeline.process(day(4))

    report = run.lifecycle
    assert report is not None
    # u from its late day, and the users whose current stretch runs out on day 4 (v: new on
    # day 3); w stays inactive and is not restated.
    assert report.users_restated == 2
    assert report.users_changed == 2
    after = intervals(pipeline.store)
    assert before - after == {
        ("u", "inactive", day(1), day(2)),
        ("u", "active", day(3), None),
        ("v", "new", day(3), None),
    }
    assert after - before == {
        ("u", "active", day(1), day(1)),
        ("u", "inactive", day(2), day(2)),
        ("u", "active", day(3), day(3)),
        ("u", "inactive", day(4), None),
        ("v", "new", day(3), day(3)),
        ("v", "inactive", day(4), None),
    }
    assert (report.intervals_removed, report.intervals_added) == (3, 6)
    # The snapshot: the days whose counts move, and the new day. Day 3 counts the same (u is
    # still active, having entered it from inactive), so it is not written; day 0 is kept.
    assert report.days == [day(1), day(2), day(4)]
    assert pipeline.lifecycle(day(1)) == {
        "active": (1, 1, 0),
        "inactive": (1, 1, 0),
        "new": (0, 0, 2),
    }
    assert pipeline.lifecycle(day(2)) == {"inactive": (2, 1, 0), "active": (0, 0, 1)}
    assert pipeline.lifecycle(day(0)) == {"new": (2, 2, 0)}
    assert pipeline.store.version(USER_LIFECYCLE_SNAPSHOT) == (version or 0) + 1  # one commit
    pipeline.assert_equals_full_recompute()
    # The README's query for one day's states, run by delta-rs on the table as it is.
    table = DeltaTable(pipeline.store.uri(USER_LIFECYCLE_STATE))
    got = (
        QueryBuilder()
        .register("user_lifecycle_state", table)
        .execute(
            "SELECT user_id, state, valid_from AS state_since, "
            "DATE '2026-01-12' - valid_from + 1 AS days_in_state "
            "FROM user_lifecycle_state WHERE DATE '2026-01-12' BETWEEN valid_from AND valid_to"
        )
        .read_all()
    )
    assert sorted(tuple(r.values()) for r in pa.table(got).to_pylist()) == [
        ("u", "inactive", day(2), 1),
        ("w", "inactive", day(1), 2),
    ]


def test_days_after_a_late_users_moves_keep_the_other_users_counts(pipeline):
    """A late new user moves `users` on every later day, also on days with no move of theirs:
    those days are written from their old counts (found by the property test)."""
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00")])
    pipeline.process(day(0))
    pipeline.land(day(3), [("b", "u", "2026-01-13 10:00")])
    pipeline.process(day(3))
    # w's first and only session is on day 1: new on 1, inactive from 2 (moves on 1 and 2).
    pipeline.land(day(4), [("c", "w", "2026-01-11 09:00")])
    run = pipeline.process(day(4))

    assert run.lifecycle is not None and run.lifecycle.days == [day(1), day(2), day(3), day(4)]
    assert pipeline.lifecycle(day(3)) == {"active": (1, 1, 0), "inactive": (1, 0, 1)}
    pipeline.assert_equals_full_recompute()


def test_a_batch_that_touches_no_user_writes_no_interval_rows(pipeline):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00")])
    pipeline.process(day(0))
    # 35 days on, u is churned; a batch of nothing but a copy of an old event moves no one.
    for offset in (35, 36):
        pipeline.land(day(offset), [("a", "u", "2026-01-10 10:00")])
    pipeline.process(day(35))
    rows = pipeline.store.read(USER_LIFECYCLE_STATE).count()
    run = pipeline.process(day(36))

    report = run.lifecycle
    assert report is not None
    assert (report.users_restated, report.users_changed) == (0, 0)
    assert (report.intervals_added, report.intervals_removed, report.state_rows_written) == (
        0,
        0,
        0,
    )
    assert pipeline.store.read(USER_LIFECYCLE_STATE).count() == rows
    assert report.days == [day(36)]  # the new day's five rows, and nothing else
    assert pipeline.lifecycle(day(36)) == {"churned": (1, 0, 0)}
    pipeline.assert_equals_full_recompute()


def test_full_refresh_rebuilds_from_raw_and_logs_no_change(pipeline, spark, settings):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00"), ("b", "v", "2026-01-10 23:50")])
    pipeline.land(day(1), [("a", "u", "2026-01-10 10:00"), ("c", "v", "2026-01-11 00:10")])
    pipeline.process(day(1))
    pipeline.process(day(0))
    logged = pipeline.store.read(SESSION_CHANGES).count()

    dates = [day(-1), day(0), day(1), day(2)]
    events = update_events(pipeline.store, spark, event_dates=dates, run_id="rb", full_refresh=True)
    sessions = update_sessions(
        pipeline.store,
        spark,
        session_dates=dates,
        settings=settings,
        run_id="rb",
        full_refresh=True,
    )

    assert events.recomputed == dates and sessions.recomputed == dates
    assert (sessions.inserted, sessions.replaced, sessions.removed) == (0, 0, 0)
    assert pipeline.store.read(SESSION_CHANGES).count() == logged
    pipeline.assert_equals_full_recompute()


def test_a_new_gap_recomputes_the_sessions_whole(pipeline, spark, settings):
    pipeline.land(day(0), [("a", "u", "2026-01-10 10:00"), ("b", "u", "2026-01-10 10:45")])
    pipeline.process(day(0))
    assert len(pipeline.sessions()) == 2

    pipeline.settings = settings.with_overrides(session_gap=timedelta(hours=1))
    run = update_sessions(
        pipeline.store,
        spark,
        session_dates=[day(0)],
        settings=pipeline.settings,
        run_id="new-gap",
    )

    assert run.recomputed == [day(0)]
    assert [(s[1], s[3]) for s in pipeline.sessions()] == [("2026-01-10 10:00:00", 2)]
    again = update_sessions(
        pipeline.store, spark, session_dates=[day(0)], settings=pipeline.settings, run_id="x"
    )
    assert again.updated == []  # absorbed: nothing left to do


def test_a_new_gap_keeps_the_sessions_it_does_not_change(pipeline, spark, settings):
    """Recomputing a date whole rewrites the pairs that changed and keeps the others."""
    pipeline.land(
        day(0),
        [
            ("a", "u", "2026-01-10 10:00"),
            ("b", "u", "2026-01-10 10:45"),
            ("c", "v", "2026-01-10 12:00"),
        ],
    )
    pipeline.process(day(0))
    assert len(pipeline.sessions()) == 3

    pipeline.settings = settings.with_overrides(session_gap=timedelta(hours=1))
    run = update_sessions(
        pipeline.store, spark, session_dates=[day(0)], settings=pipeline.settings, run_id="gap"
    )

    assert run.recomputed == [day(0)]
    assert (run.inserted, run.replaced, run.removed) == (0, 1, 1)  # u's two merge; v's stays
    assert len(pipeline.sessions()) == 2
    pipeline.assert_equals_full_recompute()


def test_two_events_runs_launched_at_once_on_overlapping_dates_end_as_a_full_recompute(
    spark, settings
):
    """Each run's commits are made against the versions it read: the one that commits second
    over a shared date fails with WriteConflictError and commits nothing of that table, and the
    run asked for next (the sensor's) brings every table to the full recompute."""
    p = Pipeline(spark, settings)
    p.land(day(0), [("a1", "u1", f"{day(0)} 08:00"), ("b1", "u2", f"{day(0)} 09:00")])
    p.process(day(0))
    # Late copies for day(-1) and day(0), a duplicate of a1, and day(1)'s own events.
    p.land(
        day(1),
        [
            ("c1", "u1", f"{day(-1)} 23:50"),
            ("a1", "u1", f"{day(0)} 08:00"),
            ("d1", "u2", f"{day(0)} 09:10"),
            ("e1", "u1", f"{day(1)} 07:00"),
        ],
    )
    landing = LandingZoneResource(landing_dir=str(settings.landing_dir))
    ingest_batches(
        p.store,
        landing.read_lines(spark, [day(1)]),
        fingerprints={day(1): fingerprint(day(1), landing.batch_files(day(1)))},
        settings=settings,
        run_id="ingest",
    )
    outcomes: dict[str, str] = {}

    def run(name: str, dates: list[date]) -> None:
        store = EmbeddedDeltaStore(spark=spark, lake=settings.lake_dir)
        try:
            update_events(store, spark, event_dates=dates, run_id=name)
            outcomes[name] = "committed"
        except WriteConflictError:
            outcomes[name] = "conflict"

    runs = [
        threading.Thread(target=run, args=("first", [day(-1), day(0)])),
        threading.Thread(target=run, args=("second", [day(0), day(1)])),
    ]
    for thread in runs:
        thread.start()
    for thread in runs:
        thread.join()
    assert set(outcomes.values()) <= {"committed", "conflict"} and len(outcomes) == 2

    # What the sensors ask for next: the dates the manifests say are behind, then sessions.
    dates = [day(-1), day(0), day(1)]
    update_events(p.store, spark, event_dates=dates, run_id="next")
    update_sessions(
        p.store,
        spark,
        session_dates=session_dates_for(dates, settings),
        settings=settings,
        run_id="next",
    )
    update_lifecycle(p.store, spark, through=day(1), settings=settings, run_id="next")
    p.assert_equals_full_recompute()


def test_two_sessions_runs_that_both_found_no_sessions_table_do_not_both_append(spark, settings):
    """Both runs read `sessions` before it existed and derived the same new sessions of a
    shared date: the second append is a conflict (appends are checked too), not a copy of
    every session, and the run asked for next brings the tables to the full recompute."""
    p = Pipeline(spark, settings)
    p.land(day(0), [("a", "u", f"{day(0)} 08:00"), ("b", "v", f"{day(0)} 23:50")])
    p.land(day(1), [("c", "v", f"{day(1)} 00:10")])
    for received in (day(0), day(1)):
        landing = LandingZoneResource(landing_dir=str(settings.landing_dir))
        ingest_batches(
            p.store,
            landing.read_lines(spark, [received]),
            fingerprints={received: fingerprint(received, landing.batch_files(received))},
            settings=settings,
            run_id="ingest",
        )
    update_events(p.store, spark, event_dates=[day(0), day(1)], run_id="events")
    update_identities(p.store, run_id="events")  # as the events run does
    both_read = threading.Barrier(2, timeout=120)

    class ReadTogether(EmbeddedDeltaStore):
        """The real store; each run waits for the other after reading `sessions`' version."""

        def read_version(self, spec):
            version = super().read_version(spec)
            if spec == SESSIONS:
                both_read.wait()
            return version

    outcomes: dict[str, str] = {}

    def run(name: str, dates: list[date]) -> None:
        store = ReadTogether(spark=spark, lake=settings.lake_dir)
        try:
            update_sessions(store, spark, session_dates=dates, settings=settings, run_id=name)
            outcomes[name] = "committed"
        except WriteConflictError:
            outcomes[name] = "conflict"

    runs = [
        threading.Thread(target=run, args=("first", [day(0)])),
        threading.Thread(target=run, args=("second", [day(0), day(1)])),
    ]
    for thread in runs:
        thread.start()
    for thread in runs:
        thread.join()
    assert sorted(outcomes.values()) == ["committed", "conflict"]
    ids = [r.session_id for r in p.store.read(SESSIONS).collect()]
    assert len(ids) == len(set(ids))

    update_sessions(
        p.store, spark, session_dates=[day(0), day(1)], settings=settings, run_id="next"
    )
    update_lifecycle(p.store, spark, through=day(1), settings=settings, run_id="next")
    p.assert_equals_full_recompute()


def test_a_failed_check_marks_its_dates_and_their_next_runs_heal_them(pipeline):
    """A copy of a session and of an event (what unserialized writers leave) fail the
    blocking checks; the checks mark the dates, the sensors' plans then hold them, and the
    recompute derives them from their inputs again."""
    from dagster import instance_for_test

    from sessionize_assets.lake.tables import BATCH_EVENT_DATES, EVENTS_MANIFEST, SESSIONS_MANIFEST
    from sessionize_assets.partitions import RANGE_END, RANGE_START
    from sessionize_assets.pipeline.manifests import (
        event_dates_behind,
        session_dates_behind,
    )
    from sessionize_tests.test_checks import checks_job

    pipeline.land(day(0), [("a", "u", f"{day(0)} 08:00"), ("b", "u", f"{day(0)} 08:10")])
    pipeline.process(day(0))
    store = pipeline.store
    run_id = str(uuid.uuid4())  # an unserialized writer's run
    copy_of_session = store.read(SESSIONS).limit(1)
    copy_of_event = store.read(EVENTS).limit(1)
    for spec, frame in ((SESSIONS, copy_of_session), (EVENTS, copy_of_event)):
        store.rewrite(spec, add=lambda f=frame: f, commit_metadata={"dagster_run_id": run_id})

    job = checks_job(
        pipeline.settings, {"unique_event_ids": "events", "no_overlapping_sessions": "sessions"}
    )
    with instance_for_test() as instance:
        result = job.execute_in_process(
            instance=instance,
            raise_on_error=False,
            run_id=run_id,
            tags={RANGE_START: day(0).isoformat(), RANGE_END: day(0).isoformat()},
        )
    assert not result.success
    assert {e.check_name for e in result.get_asset_check_evaluations() if not e.passed} == {
        "unique_event_ids",
        "no_overlapping_sessions",
    }
    behind = event_dates_behind(
        store.read_arrow(BATCH_EVENT_DATES), store.read_arrow(EVENTS_MANIFEST)
    )
    assert list(behind) == [day(0)] and behind[day(0)].needs_recompute
    stale = session_dates_behind(
        store.read_arrow(EVENTS_MANIFEST),
        store.read_arrow(SESSIONS_MANIFEST),
        settings=pipeline.settings,
    )
    assert day(0) in stale

    events = update_events(store, pipeline.spark, event_dates=list(behind), run_id="heal")
    assert events.recomputed == [day(0)]
    stale = session_dates_behind(
        store.read_arrow(EVENTS_MANIFEST),
        store.read_arrow(SESSIONS_MANIFEST),
        settings=pipeline.settings,
    )
    update_sessions(
        store, pipeline.spark, session_dates=stale, settings=pipeline.settings, run_id="heal"
    )
    pipeline.assert_equals_full_recompute()
    assert store.read(SESSIONS).count() == 1 and store.read(EVENTS).count() == 2
