"""The landing zone, generated day by day and written one batch at a time.

Why streaming: the scale benchmark needs about 20 million events over 180 days, which do not fit
in memory as objects. The simulation walks the days in order; on each day it plans every user's
messages and files each delivery under its received day. A received day is complete once the
next day has been planned (no local day starts more than a day before its UTC date), and is then
written and forgotten. What stays in memory is the users' small state and the deliveries still
pending for later days (late uploads and retries), each as its rendered line.

Why the expected outcome is exact without holding every message id: a retry is always received
after its original, which is in the zone whenever the retry is, so the original wins and every
retry is a duplicate (SPEC §2), unless the event is before the pipeline start. Each line's
outcome is therefore known when it is planned.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

from sessionize_assets.generator.activity import Planned, plan_late_upload
from sessionize_assets.generator.formats import (
    DAY,
    INVALID_STREAM,
    LATE_STREAM,
    MAX_DAYS,
    MAX_USERS,
    MINUTE,
    SECOND,
    date_ms,
    dumps,
    iso,
    message_key,
)
from sessionize_assets.generator.invalid import (
    MANDATORY_VARIANTS,
    invalid_line,
    invalid_variants,
)
from sessionize_assets.generator.planner import (
    BEFORE_START,
    DUPLICATE,
    INVALID,
    LATE,
    VALID,
    Entry,
    Filed,
    Frame,
    Planner,
)
from sessionize_assets.generator.population import User, make_users
from sessionize_assets.generator.writer import (
    batch_name,
    count_lines,
    existing_batches,
    file_parts,
    refuse_foreign_batches,
    write_batch,
)

# What the generator produces (a line over the pipeline's length limit it does not).
REJECTION_REASONS: tuple[str, ...] = (
    "invalid_encoding",
    "malformed_json",
    "missing_message_id",
    "missing_user",
    "bad_timestamp",
    "bad_received_at",
    "future_timestamp",
    "before_start",
    "duplicate",
)
LATE_SHAPES: tuple[str, ...] = ("recent", "uniform")

_FALLBACK_COPY = 3  # delivery number of the retry added to a batch that has none


@dataclass(frozen=True)
class GenerationReport:
    """What the zone holds and what a correct SPEC §2 implementation must make of it."""

    out: Path
    batches: int
    files: int
    lines: int
    valid_events: int
    late_events: int
    expected_rejections: dict[str, int]
    users: int
    written_batches: int  # the last ones; fewer than `batches` after append_day

    @property
    def late_share(self) -> float:
        """Measured share of valid events whose received date is after their event date."""
        return self.late_events / self.valid_events if self.valid_events else 0.0

    @property
    def events_per_user_day(self) -> float:
        """Valid events per user and received day: how to size `users` for a wanted volume.

        With the defaults it is about 3.8 over 30 days and 4.5 over 180 (users keep arriving
        over the first weeks), so 25,000 users give about 20 million events in 180 days.
        """
        return self.valid_events / (self.users * self.batches) if self.users else 0.0

    def summary(self) -> str:
        """A few lines for humans running `sessionize generate`."""
        rejected = sum(self.expected_rejections.values())
        reasons = ", ".join(f"{k}={v}" for k, v in self.expected_rejections.items() if v)
        wrote = (
            f"wrote {self.batches} batches"
            if self.written_batches == self.batches
            else f"wrote {self.written_batches} batch(es), the zone now holds {self.batches}"
        )
        return "\n".join(
            [
                f"{wrote}: {self.files} files, {self.lines} lines in {self.out}",
                f"expected: {self.valid_events} valid events ({self.late_events} late, "
                f"{self.late_share:.1%}), {rejected} rejected lines",
                f"rejections: {reasons or 'none'}",
                f"volume: {self.events_per_user_day:.2f} valid events per user per day",
            ]
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ZoneSpec:
    """What defines a landing zone, all but its number of days: where it is written (`out`),
    its first received day (`start`), its `users` and `seed`, and the shares of awkward data.

    `late_share` is the share of events delivered at least a day late, and `late_shape` how
    late: "recent" (mostly 1-3 days with a tail of months, as offline mobile SDKs do; the share
    measured in a zone is a little lower, as the latest days' late events arrive after its end)
    or "uniform" (each batch gets `late_share` of its events from days spread evenly over the
    whole history: the worst case for incremental processing). `pipeline_start`: the day before
    which events are rejected (`start` when None).
    """

    out: Path
    start: date
    users: int
    seed: int
    late_share: float = 0.05
    late_shape: str = "recent"
    bot_share: float = 0.01
    duplicate_share: float = 0.01
    invalid_share: float = 0.005
    pipeline_start: date | None = None
    gzip_share: float = 0.3

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", Path(self.out))  # a str is taken too
        if not 0 <= self.users < MAX_USERS:
            raise ValueError(f"users must be in [0, {MAX_USERS}), got {self.users}")
        if self.late_shape not in LATE_SHAPES:
            raise ValueError(
                f"late_shape must be one of {', '.join(LATE_SHAPES)}, got {self.late_shape!r}"
            )
        shares = (
            self.late_share, self.bot_share, self.duplicate_share, self.invalid_share,
            self.gzip_share,
        )  # fmt: skip
        for share in shares:
            if not 0 <= share < 1:
                raise ValueError(f"shares must be in [0, 1), got {share}")

    @property
    def accepted_from(self) -> date:
        """The first day whose events are accepted (`pipeline_start`, else `start`)."""
        return self.start if self.pipeline_start is None else self.pipeline_start


def generate_landing_zone(zone: ZoneSpec, *, days: int) -> GenerationReport:
    """Write the landing zone `zone` for [start, start + days) and report the expected outcome.

    Same arguments give byte-identical files, and the first N batches are the same whatever
    `days` is (see `append_day`). Batches are written one by one as the days are generated, so
    memory does not grow with `days`.

    Existing `*.jsonl[.gz]` files in the batch folders written are replaced (a re-delivery);
    other `received_date=` folders under `zone.out` are refused because they would silently
    change the expected counts.
    """
    _check_days(days)
    refuse_foreign_batches(zone.out, [zone.start + timedelta(days=d) for d in range(days)])
    return _Simulation(zone, days=days, write_from=0).run()


def append_day(zone: ZoneSpec) -> GenerationReport:
    """Add the next received day to the zone `zone`, written by `generate_landing_zone`.

    Writes exactly the batch that generating one more day would have written, so a zone can grow
    a day at a time, for example next to a running pipeline. The history is replayed without
    being rendered (late uploads and retries from earlier days land in the new batch), which
    takes a fraction of a full generation. The report covers the whole zone.
    """
    out, start = zone.out, zone.start
    found = existing_batches(out)
    if not found:
        raise FileNotFoundError(f"{out} holds no batch to append to; generate a zone first")
    expected = [start + timedelta(days=d) for d in range(len(found))]
    if found != expected:
        raise ValueError(
            f"{out} must hold consecutive batches from {start}, found {found[0]} .. {found[-1]} "
            f"({len(found)} folders); pass the --start the zone was generated with"
        )
    _check_days(len(found) + 1)
    last_lines = count_lines(out / batch_name(found[-1]))
    return _Simulation(
        zone, days=len(found) + 1, write_from=len(found), last_lines=last_lines
    ).run()


def _check_days(days: int) -> None:
    if not 1 <= days < MAX_DAYS - 1:  # one more day is planned than written
        raise ValueError(f"days must be in [1, {MAX_DAYS - 1}), got {days}")


class _Simulation:
    """One pass over the days: plan, file each delivery under its received day, complete days.

    Batches from `write_from` on are rendered and written; earlier ones are only counted, which
    is how `append_day` rebuilds the state and the pending deliveries of the history.
    `last_lines`, the lines found in the batch before `write_from`, must match its replay: a
    zone generated with other arguments is not extended.
    """

    def __init__(
        self, config: ZoneSpec, *, days: int, write_from: int, last_lines: int | None = None
    ) -> None:
        self.config = config
        self.days = days
        self.write_from = write_from
        self.last_lines = last_lines
        self.start_ms = date_ms(config.start)
        self.pipeline_start_ms = date_ms(config.accepted_from)
        self.frame = Frame(
            seed=config.seed,
            start_ms=self.start_ms,
            pipeline_start_ms=self.pipeline_start_ms,
            days=days,
            write_from=write_from,
            # The uniform shape's late events are made when their batch is completed instead.
            planned_late_share=config.late_share if config.late_shape == "recent" else 0.0,
            duplicate_share=config.duplicate_share,
            salt=random.Random(f"sessionize:{config.seed}:ids").getrandbits(62),
        )
        self.people = make_users(config.seed, config.users, config.bot_share)
        self.humans = [u for u in self.people if not u.is_bot]
        # Broken lines borrow a human's shape; a zone of bots only borrows a stand-in's.
        self.line_users = self.humans or make_users(config.seed, 1, 0.0)
        self.planner = Planner(self.frame, self.people)
        self.pending: defaultdict[int, list[Entry]] = defaultdict(list)
        self.completed = 0  # batches before this one are written: nothing may land there
        self.rejections: Counter[str] = Counter()
        self.valid = self.late = self.lines = self.files = 0

    def run(self) -> GenerationReport:
        c = self.config
        for day in range(self.days + 1):  # day `days` only completes the last batch
            self._file(self.planner.day(day))
            if day:
                self._complete(day - 1)
        return GenerationReport(
            out=c.out,
            batches=self.days,
            files=self.files,
            lines=self.lines,
            valid_events=self.valid,
            late_events=self.late,
            expected_rejections={r: self.rejections.get(r, 0) for r in REJECTION_REASONS},
            users=c.users,
            written_batches=self.days - self.write_from,
        )

    def _file(self, filed: Iterable[Filed]) -> None:
        for batch, entry in filed:
            if batch < self.completed:  # a local day starts less than a day before its UTC day
                raise RuntimeError(f"internal error: a line for completed batch {batch}")
            self.pending[batch].append(entry)

    def _complete(self, batch: int) -> None:
        """All deliveries of `batch` are known: add its extras, count it, and write it."""
        c = self.config
        day_ms = self.start_ms + batch * DAY
        if c.late_shape == "uniform" and batch > 0:
            originals = sum(1 for e in self.pending[batch] if e[1] & 3 == 0)
            self._late_uploads(batch, day_ms, originals)
        entries = self.pending.pop(batch, [])
        self.completed = batch + 1
        if c.duplicate_share > 0 and not any(e[2] == DUPLICATE for e in entries):
            self._add_retry(entries, batch, day_ms)
        outcomes = Counter(e[2] for e in entries)
        self.valid += outcomes[VALID] + outcomes[LATE]
        self.late += outcomes[LATE]
        self.rejections["duplicate"] += outcomes[DUPLICATE]
        self.rejections["before_start"] += outcomes[BEFORE_START]

        variants: list[tuple[str, str]] = []
        invalid_rng = random.Random(f"sessionize:{c.seed}:invalid:{batch}")
        if c.invalid_share > 0:
            wanted = round(c.invalid_share * len(entries) / (1 - c.invalid_share))
            count = max(len(MANDATORY_VARIANTS), wanted) if batch == 0 else wanted
            # The first batch shows every variant, so any zone exercises every reason.
            variants = invalid_variants(invalid_rng, count, with_mandatory=batch == 0)
            self.rejections.update(reason for reason, _variant in variants)
        n_lines = len(entries) + len(variants)
        parts = file_parts(
            random.Random(f"sessionize:{c.seed}:files:{batch}"), n_lines, c.gzip_share
        )
        self.lines += n_lines
        self.files += len(parts)
        if batch == self.write_from - 1 and self.last_lines not in (None, n_lines):
            raise ValueError(
                f"{batch_name(c.start + timedelta(days=batch))} holds {self.last_lines} lines, "
                f"these arguments make {n_lines}: pass the arguments the zone was generated with"
            )
        if batch < self.write_from:
            return
        for i, (reason, variant) in enumerate(variants):
            key = message_key(INVALID_STREAM, batch, i)
            user = invalid_rng.choice(self.line_users)
            received, text = invalid_line(
                invalid_rng, user, reason, variant, day_ms, self.pipeline_start_ms, key,
                self.frame.salt,
            )  # fmt: skip
            entries.append((received, key << 2, INVALID, text))
        entries.sort()
        lines: list[str] = []
        for _pos, _seq, _outcome, rendered in entries:
            if rendered is None:
                raise RuntimeError(f"internal error: an unrendered line in batch {batch}")
            lines.append(rendered)
        write_batch(c.out / batch_name(c.start + timedelta(days=batch)), lines, parts)

    def _late_uploads(self, batch: int, day_ms: int, originals: int) -> None:
        """The uniform shape: bulk uploads of sessions from days spread evenly over the history.

        Their number is `late_share` of the batch's events, so the share holds per batch; each
        picks an earlier day uniformly, then a user who was around on that day.
        """
        c = self.config
        target = round(originals * c.late_share / (1 - c.late_share))
        if not target or not any(u.first_day < batch for u in self.humans):
            return
        rng = random.Random(f"sessionize:{c.seed}:late:{batch}")
        items: list[tuple[User, Planned]] = []
        while len(items) < target:
            day = rng.randrange(batch)
            tries = (rng.choice(self.humans) for _ in range(64))
            user = next((u for u in tries if u.alive(day)), None)
            if user is None:
                continue
            planned = plan_late_upload(
                user, rng, self.start_ms + day * DAY, day_ms, target - len(items), c.duplicate_share
            )
            items.extend((user, p) for p in planned)
        key_base = message_key(LATE_STREAM, batch, 0)
        self._file(self.planner.file(items, key_base=key_base, content=f"late-content:{batch}"))

    def _add_retry(self, entries: list[Entry], batch: int, day_ms: int) -> None:
        """A batch without any retry gets one, so even a tiny zone shows `duplicate`."""
        eligible = sorted(e for e in entries if e[2] == VALID and e[0] + MINUTE < day_ms + DAY)
        if not eligible:
            return
        rng = random.Random(f"sessionize:{self.config.seed}:retry:{batch}")
        pos, seq, _outcome, text = rng.choice(eligible)
        received = pos + rng.randint(1, 59) * SECOND  # an original's position is its receivedAt
        if text is not None:
            message = json.loads(text)
            message["sentAt"] = iso(received - 30, "z_ms", 0)
            message["receivedAt"] = iso(received, "z_ms", 0)
            text = dumps(message)
        entries.append((pos - 1, seq | _FALLBACK_COPY, DUPLICATE, text))
