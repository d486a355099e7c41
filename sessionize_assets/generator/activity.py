"""When things happen: sessions, bots, late uploads and SDK retries, planned one user-day at a time.

Why plans without content: a plan is times and kinds only, drawn from a random stream of its own
per (seed, user, day). That keeps day N the same whatever the number of days generated, and lets
`append_day` replay the history cheaply, rendering message content only for the day it writes.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from itertools import accumulate

from sessionize_assets.generator.formats import DAY, GAP, HOUR, MINUTE, SECOND
from sessionize_assets.generator.population import User

_MAX_LATENESS_DAYS = 90.0

# Local hour weights: people use apps in the evening far more than at 4 am.
_HOUR_CUM_WEIGHTS = list(
    accumulate([1, 0.6, 0.3, 0.2, 0.2, 0.3, 1, 2, 3, 3, 3, 3, 4, 4, 3, 3, 3, 4, 5, 6, 7, 6, 4, 2])
)

# One delivery of a message: (receivedAt, position in the batch's files, sentAt latency in ms).
Delivery = tuple[int, int, int]


@dataclass(slots=True)
class Planned:
    """A message as planned: event time, kind, identity, and every delivery (original first)."""

    ts: int
    kind: str  # identify | open | any | bot
    identified: bool
    deliveries: list[Delivery] = field(default_factory=list)


def plan_human_day(
    user: User, day: int, day_ms: int, seed: int, late_share: float, duplicate_share: float
) -> list[Planned]:
    """The user's sessions of local day `day` (day_ms: its UTC midnight), planned in local time.

    A few sessions on active days, separated by more than the gap; the user's cursor keeps a
    session of the next day from starting inside the previous one.
    """
    if not user.alive(day):
        return []
    forced = day in (user.first_day, user.return_day)
    if not forced and (user.activity == 0 or day in user.break_days):
        return []  # decided without a random stream: most user-days of a big zone are idle
    rng = random.Random(f"sessionize:{seed}:plan:{user.index}:{day}")
    if not forced and rng.random() >= user.activity:
        return []
    local_midnight = day_ms - user.offset_min * MINUTE
    n_sessions = rng.choices((1, 2, 3, 4), (50, 30, 15, 5))[0]
    starts = [
        (local_midnight + _local_hour(rng) * HOUR + rng.randrange(HOUR), False)
        for _ in range(n_sessions)
    ]
    if rng.random() < 0.08:  # late-night UTC session that runs past midnight UTC
        starts.append((day_ms + 23 * HOUR + rng.randint(45, 58) * MINUTE, True))
    planned: list[Planned] = []
    for session_start, long in sorted(starts):
        if user.cursor is not None and session_start <= user.cursor + GAP:
            session_start = user.cursor + GAP + rng.randint(SECOND, 2 * HOUR)
        if user.ts_style == "z_s":
            session_start = -(-session_start // SECOND) * SECOND
        times = session_times(user, rng, session_start, long)
        planned.extend(_session(user, rng, times, late_share, duplicate_share))
        user.had_session = True
        user.cursor = times[-1]
    return planned


def _local_hour(rng: random.Random) -> int:
    return rng.choices(range(24), cum_weights=_HOUR_CUM_WEIGHTS)[0]


def session_times(user: User, rng: random.Random, t0: int, long: bool) -> list[int]:
    """Gaps of seconds to ~20 minutes, with some exactly-30-minute gaps and identical stamps."""
    n = 1 + min(60, int(rng.expovariate(1 / 7)))
    if long:
        n = max(n, 10)
    times = [t0]
    for _ in range(n - 1):
        r = rng.random()
        if r < 0.012:
            gap = 0
        elif r < 0.03:
            gap = GAP  # the boundary: still the same session
        else:
            gap = int(min(20 * MINUTE, max(3 * SECOND, rng.lognormvariate(math.log(45_000), 1.2))))
        if user.ts_style == "z_s":
            gap = gap // SECOND * SECOND
        times.append(times[-1] + gap)
    return times


def _session(
    user: User, rng: random.Random, times: list[int], late_share: float, duplicate_share: float
) -> list[Planned]:
    """The session's messages and when they reach Segment (late uploads come in bulk)."""
    identify_now = (not user.had_session and user.identity == "identified") or (
        user.identity == "converting"
        and not user.identified
        and user.had_session
        and rng.random() < 0.4
    )
    if identify_now:
        user.identified = True
    late_session = rng.random() < late_share * 0.6
    flush = times[-1] + lateness(rng) if late_session else 0
    planned: list[Planned] = []
    for i, ts in enumerate(times):
        kind = "any" if i else ("identify" if identify_now else "open")
        if late_session:
            received = flush + i * rng.randint(2, 40)
        elif rng.random() < late_share * 0.4:
            received = ts + lateness(rng)
        else:
            received = ts + rng.randint(100, 30 * SECOND)
        message = Planned(ts, kind, user.identified, [(received, received, rng.randint(20, 800))])
        add_retries(message, rng, duplicate_share)
        planned.append(message)
    return planned


def lateness(rng: random.Random) -> int:
    """Heavy tail from 1 day: mostly a few days, some weeks or months (offline mobile SDKs)."""
    return int(min(_MAX_LATENESS_DAYS, rng.paretovariate(1.15)) * DAY)


def plan_bot_day(
    user: User, day: int, day_ms: int, seed: int, duplicate_share: float
) -> list[Planned]:
    """Crawlers and monitors: an event every 1-10 minutes for runs longer than 24 hours.

    The bot's position in its crawl carries over in `user`, so a run crosses days unchanged.
    """
    rng = random.Random(f"sessionize:{seed}:plan:{user.index}:{day}")
    if day == 0:
        user.bot_next = day_ms + rng.randrange(10 * HOUR)
        user.bot_run_end = user.bot_next + rng.randint(26 * HOUR, 40 * HOUR)
    planned: list[Planned] = []
    while user.bot_next < day_ms + DAY:
        t = user.bot_next
        received = t + rng.randint(100, 3 * SECOND)
        message = Planned(t, "bot", False, [(received, received, 50)])
        add_retries(message, rng, duplicate_share)
        planned.append(message)
        user.bot_next = t + rng.randint(MINUTE, 10 * MINUTE)
        if user.bot_next >= user.bot_run_end:
            user.bot_next += rng.randint(6 * HOUR, 3 * DAY)
            user.bot_run_end = user.bot_next + rng.randint(26 * HOUR, 40 * HOUR)
    return planned


def plan_late_upload(
    user: User,
    rng: random.Random,
    event_day_ms: int,
    received_day_ms: int,
    max_events: int,
    duplicate_share: float,
) -> list[Planned]:
    """A device that was offline on one day uploads a session of it in bulk on a later day.

    The session lies inside its UTC day, so every event of it is exactly as many days late as
    the days between the two dates. The identity is the one the user started with: the session
    may predate a converting user's identify call.
    """
    times = session_times(user, rng, 0, False)[:max_events]
    start = event_day_ms + rng.randrange(DAY - times[-1] - SECOND)
    if user.ts_style == "z_s":
        start = -(-start // SECOND) * SECOND
    flush = received_day_ms + rng.randrange(DAY - 10 * SECOND)
    planned: list[Planned] = []
    for i, offset in enumerate(times):
        received = flush + i * rng.randint(2, 40)
        message = Planned(
            start + offset,
            "any" if i else "open",
            user.identity == "identified",
            [(received, received, rng.randint(20, 800))],
        )
        add_retries(message, rng, duplicate_share)
        planned.append(message)
    return planned


def add_retries(message: Planned, rng: random.Random, duplicate_share: float) -> None:
    """SDK retries: same message re-sent after a timeout (same batch) or replayed days later."""
    if rng.random() >= duplicate_share:
        return
    original_received = message.deliveries[0][0]
    for _ in range(1 if rng.random() < 0.85 else 2):
        previous = message.deliveries[-1][0]
        if rng.random() < 0.6:
            received = previous + rng.randint(SECOND, 15 * MINUTE)
        else:
            received = (previous // DAY + rng.randint(1, 3)) * DAY + rng.randrange(DAY)
        # Files are not ordered by receivedAt: a same-day retry is sometimes written first.
        same_day = received // DAY == original_received // DAY
        pos = message.deliveries[0][1] - 1 if same_day and rng.random() < 0.5 else received
        message.deliveries.append((received, pos, rng.randint(20, 800)))
