"""How final a day's figures are (SPEC §9): the arrival curve, the grace period learned from it,
and each date's status and expected completeness.

An accepted event's lag is `received_date - event_date` in days, of its `events` row. The
arrival curve counts the accepted events of each event date by lag (the `arrivals` table).
From it and R, the latest received day ingested (an empty batch counts), with
- H, the lateness horizon: a date at least H days old is taken to have (nearly) all its events;
- W, the reference window: the dates H to H + W - 1 days old are the reference dates;
- q, the completeness target,

F(k) is the share of the reference dates' events with a lag of at most k, the grace period g
the smallest k >= 0 with F(k) >= q (H when the reference dates hold no event), and a date D is
`complete` when R - D >= g, else `provisional`, with an expected completeness of F(R - D)
(1.0 when the reference dates hold no event).

Everything here is a pure function of those counts, so the assets, the sensor that finds the
dates whose status moved, and the tests' reference all compute it the same way. Shares are
ratios of whole counts, divided once: the same counts give the same floats everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import date, timedelta

COMPLETE = "complete"
PROVISIONAL = "provisional"
STATUSES = (COMPLETE, PROVISIONAL)

ArrivalCounts = Mapping[tuple[date, int], int]  # (event_date, lag_days) -> accepted events


@dataclass(frozen=True, kw_only=True)
class Lateness:
    """The three settings of the rule: H, W (days) and q."""

    horizon_days: int
    window_days: int
    target: float

    def __post_init__(self) -> None:
        if self.horizon_days < 0:
            raise ValueError(f"lateness horizon must be >= 0 days, got {self.horizon_days}")
        if self.window_days < 1:
            raise ValueError(f"lateness window must be at least 1 day, got {self.window_days}")
        if not 0 < self.target <= 1:
            raise ValueError(f"completeness target must be in (0, 1], got {self.target}")

    def reference_dates(self, latest_received: date) -> tuple[date, date]:
        """The first and last reference date: H <= R - D' < H + W."""
        last = latest_received - timedelta(days=self.horizon_days)
        return last - timedelta(days=self.window_days - 1), last


@dataclass(frozen=True, kw_only=True)
class GracePeriod:
    """The grace period at one R, and the curve F it was read from.

    `events_by_lag` holds the reference dates' accepted events by lag; `reference_events` is
    their sum (0: no reference event, so g = H and every share is 1.0).
    """

    latest_received: date
    days: int
    first_reference: date
    last_reference: date
    events_by_lag: Mapping[int, int]
    reference_events: int

    def completeness(self, lag: int) -> float:
        """F(lag): the share of the reference events that had arrived `lag` days after their
        date (1.0 with no reference event)."""
        if not self.reference_events:
            return 1.0
        arrived = sum(events for each, events in self.events_by_lag.items() if each <= lag)
        return arrived / self.reference_events

    def status(self, day: date) -> str:
        """`complete` when R - D >= g, else `provisional` (a date after R included)."""
        return COMPLETE if (self.latest_received - day).days >= self.days else PROVISIONAL

    def expected_completeness(self, day: date) -> float:
        """F(R - D) for event (or session) date `day`."""
        return self.completeness((self.latest_received - day).days)

    def of_dates(self, days: Iterable[date]) -> dict[date, tuple[str, float]]:
        """Each date's (status, expected completeness)."""
        return {day: (self.status(day), self.expected_completeness(day)) for day in days}


def grace_period(
    arrivals: ArrivalCounts, *, latest_received: date, lateness: Lateness
) -> GracePeriod:
    """The grace period g at R = `latest_received`, from the arrival curve (SPEC §9).

    g is the smallest k >= 0 with F(k) >= q. F reaches 1.0 at the largest lag of a reference
    event, which is below H + W (no event is received after R), so g < H + W; with no
    reference event, g = H.
    """
    first, last = lateness.reference_dates(latest_received)
    by_lag: dict[int, int] = {}
    for (event_date, lag), events in arrivals.items():
        if first <= event_date <= last and events:
            by_lag[lag] = by_lag.get(lag, 0) + events
    total = sum(by_lag.values())
    period = GracePeriod(
        latest_received=latest_received,
        days=lateness.horizon_days,
        first_reference=first,
        last_reference=last,
        events_by_lag=dict(sorted(by_lag.items())),
        reference_events=total,
    )
    if not total:
        return period
    # F(0), F(1), ... up to the largest lag, where F is 1.0 >= q: some k qualifies.
    shares = []
    arrived = sum(events for lag, events in by_lag.items() if lag < 0)
    for k in range(max(0, max(by_lag)) + 1):
        arrived += by_lag.get(k, 0)
        shares.append(arrived / total)
    return replace(period, days=next(k for k, F in enumerate(shares) if lateness.target <= F))
