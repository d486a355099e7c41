"""The lake against the full recompute of its landing zone, table by table: what the tests
assert after every kind of run, and what the soak prints when it ends.

The full recompute is the plain-Python reference (`reference.py`, `lifecycle_reference.py`):
SPEC §2's winners and rejections, §3c's identities, §3's sessions with §3b's attributes and the
stitched user, and §4's lifecycle through the latest batch ingested.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import date

from pyspark.sql import SparkSession

from sessionize_assets.lake.store import DeltaStore
from sessionize_assets.lake.tables import (
    ARRIVALS,
    DAILY_SESSIONS,
    EVENTS,
    LANDING_BATCHES,
    REJECTED_EVENTS,
    SESSION_QUARANTINE,
    SESSIONS,
    USER_IDENTITIES,
    USER_LIFECYCLE_SNAPSHOT,
    USER_LIFECYCLE_STATE,
)
from sessionize_assets.resources.lake import STORES
from sessionize_assets.settings import Settings
from sessionize_assets.transforms.lifecycle import states_by_day
from sessionize_assets.transforms.lifecycle_states import OPEN_END
from sessionize_tests.daily_reference import (
    DailySession,
    reference_arrivals,
    reference_daily,
    reference_status,
)
from sessionize_tests.lifecycle_reference import lifecycle_reference, reference_intervals
from sessionize_tests.reference import (
    SESSION_ATTRIBUTES,
    RefIdentity,
    RefSession,
    reference_identities,
    reference_sessions,
    reference_validate,
    stitched,
)
from sessionize_tests.table_rows import table_rows

# Rows of a table that differs shown in its line, each way.
SHOWN = 3


def differences(
    settings: Settings, spark: SparkSession, *, start: date, erased_lines: int = 0
) -> list[str]:
    """One line per table whose rows differ from the full recompute of the landing zone
    (events, rejections by reason, identities, sessions, the quarantine, the lifecycle's
    intervals, states by day and snapshot), with a few rows missing and unexpected; [] when
    the lake equals it. After an erasure, `settings.landing_dir` is the zone without the
    erased keys' lines, and `erased_lines` of theirs landed since, as `erased` rejections."""
    store = STORES[settings.lake_backend](spark=spark, lake=settings.lake)
    ref = reference_validate(settings.landing_dir, start)
    found: list[str] = []

    def compare(table: str, got: Iterable[object], expected: Iterable[object]) -> None:
        found.extend(row_differences(table, got, expected))

    compare(
        EVENTS.name,
        ((r.event_id, r.user_id, r.event_ts, r.received_date) for r in table_rows(store, EVENTS)),
        (
            (k, a.user_key, a.ts.replace(tzinfo=None), a.received_date)
            for k, a in ref.winners.items()
        ),
    )
    compare(
        f"{REJECTED_EVENTS.name} (reasons)",
        (r.reason for r in table_rows(store, REJECTED_EVENTS)),
        (ref.rejections + Counter({"erased": erased_lines})).elements(),
    )
    identities = reference_identities(ref.winners)
    compare(
        USER_IDENTITIES.name,
        ((r.anonymous_id, r.user_id, r.identified_at) for r in table_rows(store, USER_IDENTITIES)),
        ((k, i.user_id, i.identified_at.replace(tzinfo=None)) for k, i in identities.items()),
    )
    ref_sessions = reference_sessions(
        ref.winners,
        gap=settings.session_gap,
        max_length=settings.max_session_length,
        conversion_events=settings.conversion_events,
    )
    expected_sessions = [
        (
            s.user_id,
            s.session_start.replace(tzinfo=None),
            s.session_end.replace(tzinfo=None),
            s.event_count,
            s.session_number,
            s.is_quarantined,
            *(s.attributes[name] for name in SESSION_ATTRIBUTES),
            stitched(s.user_id, identities),
        )
        for s in ref_sessions
    ]
    sessions = table_rows(store, SESSIONS)
    compare(
        SESSIONS.name,
        (
            (
                r.user_id,
                r.session_start,
                r.session_end,
                r.event_count,
                r.session_number,
                r.is_quarantined,
                *(r[name] for name in SESSION_ATTRIBUTES),
                r.stitched_user_id,
            )
            for r in sessions
        ),
        expected_sessions,
    )
    compare(
        f"{SESSION_QUARANTINE.name} (session ids)",
        (r.session_id for r in table_rows(store, SESSION_QUARANTINE)),
        (r.session_id for r in sessions if r.is_quarantined),
    )
    found += lifecycle_differences(
        store, start=start, session_days=[(s[0], s[1].date()) for s in expected_sessions]
    )
    found += summary_differences(
        store, settings, ref.winners, reference_daily_sessions(ref_sessions, identities)
    )
    return found


def reference_daily_sessions(
    sessions: Iterable[RefSession], identities: dict[str, RefIdentity]
) -> list[DailySession]:
    """What §9 reads of each reference session, its stitched user included."""
    return [
        DailySession(
            session_date=s.session_start.date(),
            channel=s.attributes["channel"],
            stitched_user_id=stitched(s.user_id, identities),
            is_engaged=s.attributes["is_engaged"],
            conversions=s.attributes["conversions"],
            page_views=s.attributes["page_views"],
            session_start=s.session_start,
            session_end=s.session_end,
            is_quarantined=s.is_quarantined,
        )
        for s in sessions
    ]


def summary_differences(
    store: DeltaStore, settings: Settings, winners: dict, sessions: list[DailySession]
) -> list[str]:
    """SPEC §9's two tables against its literal reading (`daily_reference.py`), at R, the
    latest received day the lake ingested (an empty batch included)."""
    found = []
    arrivals = reference_arrivals(winners)
    got = {(r.event_date, r.lag_days): r.events for r in table_rows(store, ARRIVALS)}
    if got != dict(arrivals):
        wrong = sorted(k for k in {*got, *arrivals} if got.get(k) != arrivals.get(k))
        found.append(
            f"{ARRIVALS.name}: {len(wrong)} (date, lag) differ, e.g. "
            f"{[(k, got.get(k), arrivals.get(k)) for k in wrong[:SHOWN]]}"
        )
    received = [date.fromisoformat(d) for d in store.row_counts(LANDING_BATCHES)]
    if not received:
        return found
    latest = max(received)
    lateness = settings.lateness
    status = reference_status(
        arrivals,
        latest=latest,
        horizon=lateness.horizon_days,
        window=lateness.window_days,
        target=lateness.target,
    )
    expected = reference_daily(sessions, latest=latest, status=status)
    rows = (
        (
            r.session_date,
            r.channel,
            r.sessions,
            r.users,
            r.engaged_sessions,
            r.converting_sessions,
            r.page_views,
            r.conversions,
            r.duration_seconds,
            r.quarantined_sessions,
            r.status,
            r.expected_completeness,
        )
        for r in table_rows(store, DAILY_SESSIONS)
    )
    return found + row_differences(DAILY_SESSIONS.name, rows, expected)


def row_differences(table: str, got: Iterable[object], expected: Iterable[object]) -> list[str]:
    """One line naming the rows missing and unexpected, when the two bags of rows differ."""
    got_rows, expected_rows = Counter(got), Counter(expected)
    if got_rows == expected_rows:
        return []
    missing = sorted((expected_rows - got_rows).elements(), key=repr)
    unexpected = sorted((got_rows - expected_rows).elements(), key=repr)
    return [
        f"{table}: {len(missing)} rows missing {missing[:SHOWN]}, "
        f"{len(unexpected)} unexpected {unexpected[:SHOWN]}"
    ]


def intervals(store: DeltaStore) -> set[tuple]:
    """user_lifecycle_state as (user, state, valid_from, valid_to), None for an open stretch."""
    return {
        (r.user_id, r.state, r.valid_from, None if r.valid_to == OPEN_END else r.valid_to)
        for r in table_rows(store, USER_LIFECYCLE_STATE)
    }


def lifecycle_differences(
    store: DeltaStore, *, start: date, session_days: list[tuple[str, date]]
) -> list[str]:
    """SPEC §4 from the start date through the latest batch: the intervals, each user's state
    on each day (the per-day view of the intervals), and the snapshot, against the reference."""
    # SPEC §4: through the latest received day ingested, an empty batch included.
    end = max((date.fromisoformat(d) for d in store.row_counts(LANDING_BATCHES)), default=start)
    expected_states, expected_rows = lifecycle_reference(
        session_days=session_days, start=start, end=end
    )
    found = []
    if (got := intervals(store)) != (expected := reference_intervals(expected_states, end=end)):
        found.append(
            f"{USER_LIFECYCLE_STATE.name}: {len(expected - got)} intervals missing "
            f"{sorted(expected - got, key=repr)[:SHOWN]}, {len(got - expected)} unexpected "
            f"{sorted(got - expected, key=repr)[:SHOWN]}"
        )
    by_day = states_by_day(store.read(USER_LIFECYCLE_STATE), first_date=start, last_date=end)
    states = {
        (r.snapshot_date, r.user_id): (r.state, r.state_since, r.days_in_state)
        for r in by_day.collect()
    }
    if states != expected_states:
        wrong = sorted(
            key
            for key in {*states, *expected_states}
            if states.get(key) != expected_states.get(key)
        )
        found.append(
            f"{USER_LIFECYCLE_STATE.name} (states by day): {len(wrong)} (day, user) differ, "
            f"e.g. {[(k, states.get(k), expected_states.get(k)) for k in wrong[:SHOWN]]}"
        )
    rows = sorted(
        (r.snapshot_date, r.state, r.users, r.entered, r.exited)
        for r in table_rows(store, USER_LIFECYCLE_SNAPSHOT)
    )
    if rows != expected_rows:
        missing = sorted(set(expected_rows) - set(rows))
        unexpected = sorted(set(rows) - set(expected_rows))
        found.append(
            f"{USER_LIFECYCLE_SNAPSHOT.name}: {len(missing)} rows missing {missing[:SHOWN]}, "
            f"{len(unexpected)} unexpected {unexpected[:SHOWN]}"
        )
    return found


def assert_lifecycle_equals_full_recompute(
    store: DeltaStore, *, start: date, session_days: list[tuple[str, date]]
) -> None:
    found = lifecycle_differences(store, start=start, session_days=session_days)
    assert not found, "the lifecycle differs from the full recompute:\n" + "\n".join(found)


def assert_tables_equal_the_full_recompute(
    settings: Settings, spark: SparkSession, *, start: date
) -> None:
    """Every table equals the full recompute, and the zone had bots to quarantine (a zone
    without any would not test the quarantine)."""
    found = differences(settings, spark, start=start)
    assert not found, "the lake differs from the full recompute:\n" + "\n".join(found)
    store = STORES[settings.lake_backend](spark=spark, lake=settings.lake)
    assert any(True for _ in table_rows(store, SESSION_QUARANTINE)), "no session was quarantined"
