"""From plans to batch lines: each delivery becomes an entry filed under its received day.

Why entries carry their outcome and a sort key: a batch is written once all of its deliveries
are known, in an order that does not depend on the order they were filed in, and the expected
outcome is counted without keeping anything once the batch is written.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from sessionize_assets.generator.activity import Planned, plan_bot_day, plan_human_day
from sessionize_assets.generator.content import Payload, delivery_line, message_payload
from sessionize_assets.generator.formats import (
    DAY,
    EVENTS_STREAM,
    MAX_PER_USER_DAY,
    message_id,
    message_key,
)
from sessionize_assets.generator.population import User

# SPEC §2 outcome of a line, decided when it is planned (see zone.py for why this is exact).
VALID, LATE, DUPLICATE, BEFORE_START, INVALID = range(5)
# A line waiting for its batch: (position in the files, unique sequence, outcome, text). The
# text is None for batches that are only counted, not written (append_day's history).
Entry = tuple[int, int, int, str | None]
Filed = tuple[int, Entry]  # (batch, entry)


@dataclass(frozen=True, slots=True)
class Frame:
    """What planning needs to know about the run."""

    seed: int
    start_ms: int
    pipeline_start_ms: int
    days: int  # batches [0, days) are in the zone
    write_from: int  # batches from this one on are rendered
    planned_late_share: float
    duplicate_share: float
    salt: int  # mixed into message ids, from the seed


class Planner:
    """Plans the days of a set of users and renders the deliveries that will be written."""

    def __init__(self, frame: Frame, users: list[User]) -> None:
        self.frame = frame
        self.users = users

    def day(self, day: int) -> Iterator[Filed]:
        """Every delivery of the users' messages of `day` that lands in the zone."""
        f = self.frame
        day_ms = f.start_ms + day * DAY
        for user in self.users:
            if user.is_bot:
                planned = plan_bot_day(user, day, day_ms, f.seed, f.duplicate_share)
            else:
                planned = plan_human_day(
                    user, day, day_ms, f.seed, f.planned_late_share, f.duplicate_share
                )
            if not planned:
                continue
            if len(planned) > MAX_PER_USER_DAY:  # would overflow the id key's message index
                raise ValueError(f"user {user.index} has too many events on day {day}")
            yield from self.file(
                [(user, p) for p in planned],
                key_base=message_key(EVENTS_STREAM, day, user.index << 20),
                content=f"content:{user.index}:{day}",
            )

    def file(
        self, items: list[tuple[User, Planned]], *, key_base: int, content: str
    ) -> Iterator[Filed]:
        """Each delivery of `items` that lands in the zone, rendered if its batch is written.

        `content` names the random stream of the items' message content, drawn for all of them
        in order or not at all: a day of history that lands in no written batch costs no
        rendering.
        """
        f = self.frame
        rendered = any(
            f.write_from <= (received - f.start_ms) // DAY < f.days
            for _user, p in items
            if p.ts >= f.start_ms
            for received, _pos, _latency in p.deliveries
        )
        payloads = self._payloads(items, key_base, content) if rendered else None
        for j, (_user, p) in enumerate(items):
            if p.ts < f.start_ms:
                continue
            event_day = p.ts // DAY
            for i, (received, pos, latency) in enumerate(p.deliveries):
                batch = (received - f.start_ms) // DAY
                if batch >= f.days:
                    continue
                if p.ts < f.pipeline_start_ms:
                    outcome = BEFORE_START
                elif i:
                    outcome = DUPLICATE
                else:
                    outcome = LATE if received // DAY > event_day else VALID
                text = None
                if payloads is not None and batch >= f.write_from:
                    text = delivery_line(payloads[j], p.ts, received, latency)
                yield batch, (pos, (key_base + j) << 2 | i, outcome, text)

    def _payloads(
        self, items: list[tuple[User, Planned]], key_base: int, content: str
    ) -> list[Payload]:
        rng = random.Random(f"sessionize:{self.frame.seed}:{content}")
        result: list[Payload] = []
        for j, (user, p) in enumerate(items):
            mid = message_id(user.platform, rng.getrandbits(64), key_base + j, self.frame.salt)
            result.append(message_payload(user, rng, p.ts, p.kind, p.identified, mid))
        return result
