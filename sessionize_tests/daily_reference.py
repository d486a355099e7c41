"""SPEC §9 read literally, over the full recompute's accepted events and sessions: the arrival
curve, the grace period, each date's status and expected completeness, and `daily_sessions`.

Nothing here uses the pipeline's own rule (`transforms/completeness.py`) or aggregation
(`transforms/daily.py`): the tests hold the lake's tables against this.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime

from sessionize_tests.reference import Accepted

ALL = "(all)"


def reference_arrivals(winners: Mapping[str, Accepted]) -> Counter[tuple[date, int]]:
    """Accepted events per (event date, lag in days)."""
    return Counter(
        (event.ts.date(), (event.received_date - event.ts.date()).days)
        for event in winners.values()
    )


@dataclass(frozen=True)
class ReferenceStatus:
    grace_days: int
    lags: tuple[int, ...]  # every reference event's lag

    def completeness(self, days_old: int) -> float:
        """F(k): the share of the reference events with a lag of at most k (1.0: none)."""
        if not self.lags:
            return 1.0
        return sum(1 for lag in self.lags if lag <= days_old) / len(self.lags)


def reference_status(
    arrivals: Counter[tuple[date, int]],
    *,
    latest: date,
    horizon: int,
    window: int,
    target: float,
) -> ReferenceStatus:
    """SPEC §9: the reference dates D' with H <= R - D' < H + W, and g the smallest k >= 0
    with F(k) >= q (H with no reference event)."""
    lags = tuple(
        lag
        for (day, lag), events in sorted(arrivals.items())
        for _ in range(events)
        if horizon <= (latest - day).days < horizon + window
    )
    status = ReferenceStatus(grace_days=horizon, lags=lags)
    if lags:
        k = 0
        while status.completeness(k) < target:
            k += 1
        status = ReferenceStatus(grace_days=k, lags=lags)
    return status


@dataclass(frozen=True)
class DailySession:
    """What §9 reads of one session."""

    session_date: date
    channel: str | None
    stitched_user_id: str | None
    is_engaged: bool | None
    conversions: int | None
    page_views: int | None
    session_start: datetime
    session_end: datetime
    is_quarantined: bool


def reference_daily(
    sessions: Iterable[DailySession], *, latest: date, status: ReferenceStatus
) -> Counter[tuple]:
    """`daily_sessions` rows: per (date, channel) and (date, (all)), the figures, the status and
    the expected completeness. The duration is summed in whole microseconds."""
    groups: dict[tuple[date, str | None], list[DailySession]] = defaultdict(list)
    for session in sessions:
        groups[(session.session_date, session.channel)].append(session)
        groups[(session.session_date, ALL)].append(session)
    rows: Counter[tuple] = Counter()
    for (day, channel), members in groups.items():
        micros = sum((s.session_end - s.session_start) // _MICROSECOND for s in members)
        page_views = [s.page_views for s in members if s.page_views is not None]
        conversions = [s.conversions for s in members if s.conversions is not None]
        days_old = (latest - day).days
        rows[
            (
                day,
                channel,
                len(members),
                len({s.stitched_user_id for s in members if s.stitched_user_id is not None}),
                sum(1 for s in members if s.is_engaged),
                sum(1 for s in members if (s.conversions or 0) >= 1),
                sum(page_views) if page_views else None,
                sum(conversions) if conversions else None,
                micros / 1_000_000,
                sum(1 for s in members if s.is_quarantined),
                "complete" if days_old >= status.grace_days else "provisional",
                status.completeness(days_old),
            )
        ] += 1
    return rows


_MICROSECOND = datetime(2000, 1, 1, 0, 0, 0, 1) - datetime(2000, 1, 1)
