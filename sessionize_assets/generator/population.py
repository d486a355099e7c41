"""The simulated users: static traits drawn once per seed, plus the little state carried per day.

Why static traits: platform, identity, time zone and timestamp format decide which awkward input
shapes the pipeline sees, and the day a user arrives or churns must not depend on how many days
are generated, so that a longer zone extends a shorter one instead of being a different one.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from typing import Any

from sessionize_assets.generator.formats import dumps

# Devices shared by two people who sign in on it (a family tablet): this share of the users
# who sign in use an earlier such user's device (its anonymousId), so the device maps to
# whichever of them signed in last (SPEC §3c).
SHARED_DEVICE_SHARE = 0.03

# Users arrive over time: 40% are there on the first day, the rest come later at this mean.
ARRIVAL_MEAN_DAYS = 30.0

# (IANA name, UTC offset in minutes): includes half- and three-quarter-hour offsets on purpose.
_TIMEZONES: tuple[tuple[str, int], ...] = (
    ("Europe/Berlin", 60),
    ("Europe/London", 0),
    ("Africa/Cairo", 120),
    ("America/New_York", -300),
    ("America/Los_Angeles", -480),
    ("America/Sao_Paulo", -180),
    ("America/St_Johns", -210),
    ("Asia/Kolkata", 330),
    ("Asia/Kathmandu", 345),
    ("Asia/Tokyo", 540),
    ("Australia/Brisbane", 600),
)
_TZ_WEIGHTS = (20, 12, 5, 18, 12, 6, 2, 10, 2, 8, 5)

_BOT_AGENTS = (
    "Mozilla/5.0 (compatible; AhrefsBot/7.0; +http://ahrefs.com/robot/)",
    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
    "python-requests/2.31.0",
    "HeadlessChrome/120.0.6099.109 uptime-monitor",
)


@dataclass(slots=True)
class User:
    """Static traits of one simulated user, and the state that carries over from day to day."""

    index: int
    is_bot: bool
    platform: str  # web | ios | android | server
    identity: str  # identified | anonymous | converting
    anon_user_field: str  # how an anonymous user's SDK sends userId: absent | null | empty
    user_id: str
    anonymous_id: str | None
    ts_style: str  # z_ms | z_s | offset | naive | utc_us
    offset_min: int
    first_day: int
    activity: float
    churn_day: int | None
    break_days: range
    return_day: int | None
    identity_fields: tuple[str, str]  # rendered userId/anonymousId: (anonymous, identified)
    suffix: str  # the rendered `context`, `channel` and `version` that end each of its lines
    # Carried from one day to the next: the whole per-user memory of the simulation.
    identified: bool = False  # converting users flip this at their identify call
    cursor: int | None = None  # time of the user's last planned event
    had_session: bool = False
    bot_next: int = 0  # bots: time of the next event
    bot_run_end: int = 0  # bots: end of the current crawl

    def alive(self, day: int) -> bool:
        """Arrived and not churned on `day` (it may still be one of its inactive days)."""
        return self.first_day <= day and (self.churn_day is None or day <= self.churn_day)


def make_users(seed: int, users: int, bot_share: float) -> list[User]:
    """Users differ in platform, identity, time zone and habits, as in a real product."""
    rng = random.Random(f"sessionize:{seed}:users")
    n_bots = round(users * bot_share)
    if bot_share > 0 and users >= 20:
        n_bots = max(1, n_bots)
    bot_slots = set(rng.sample(range(users), n_bots)) if n_bots else set()
    made = [_make_user(rng, index, index in bot_slots) for index in range(users)]
    _share_devices(made, random.Random(f"sessionize:{seed}:shared-devices"))
    return made


def _share_devices(users: list[User], rng: random.Random) -> None:
    """Give `SHARED_DEVICE_SHARE` of the users who sign in on a device an earlier one's
    device. Drawn apart from the other traits, which stay what the seed made them."""
    signing_in = [
        user
        for user in users
        if not user.is_bot and user.anonymous_id is not None and user.identity != "anonymous"
    ]
    for at, user in enumerate(signing_in[1:], start=1):
        if rng.random() < SHARED_DEVICE_SHARE:
            owner = signing_in[rng.randrange(at)]
            user.anonymous_id = owner.anonymous_id
            user.identity_fields = (
                _identity_fields(None, user.anon_user_field, owner.anonymous_id),
                _identity_fields(user.user_id, user.anon_user_field, owner.anonymous_id),
            )


def _make_user(rng: random.Random, index: int, is_bot: bool) -> User:
    platform = (
        "web" if is_bot else rng.choices(("web", "ios", "android", "server"), (50, 20, 20, 10))[0]
    )
    tz_name, offset = rng.choices(_TIMEZONES, _TZ_WEIGHTS)[0]
    if platform == "web":
        style = "z_ms"
    elif platform == "ios":
        style = rng.choices(("z_ms", "offset"), (60, 40))[0]
    elif platform == "android":
        style = rng.choices(("z_ms", "offset"), (50, 50))[0]
    else:
        style = rng.choices(("utc_us", "naive", "z_s"), (40, 30, 30))[0]
    if is_bot:
        identity = "anonymous"
    elif platform == "server":
        identity = "identified"
    else:
        identity = rng.choices(("identified", "anonymous", "converting"), (55, 30, 15))[0]
    segment = rng.choices(("power", "regular", "casual", "one_off"), (15, 35, 30, 20))[0]
    activity = {"power": 0.85, "regular": 0.45, "casual": 0.15, "one_off": 0.0}[segment]
    first_day = 0 if rng.random() < 0.4 else 1 + int(rng.expovariate(1 / ARRIVAL_MEAN_DAYS))
    churn_day = first_day + rng.randint(0, 4) if rng.random() < 0.2 else None
    break_days = range(0)
    if segment in ("power", "regular") and rng.random() < 0.2:
        b = first_day + rng.randint(1, 5)
        break_days = range(b, b + rng.randint(3, 9))
    return_day = None
    if segment == "one_off" and rng.random() < 0.35:
        return_day = first_day + rng.randint(8, 12)
    anonymous_id = None if platform == "server" else _uuid(rng)
    anon_user_field = rng.choice(("absent", "null", "empty"))
    user_id = f"u_{rng.getrandbits(48):012x}"
    context = _context(rng, platform, tz_name, is_bot)
    channel = "server" if platform == "server" else "client"
    return User(
        index=index,
        is_bot=is_bot,
        platform=platform,
        identity=identity,
        anon_user_field=anon_user_field,
        user_id=user_id,
        anonymous_id=anonymous_id,
        ts_style=style,
        offset_min=offset if style == "offset" else 0,
        first_day=first_day,
        activity=activity,
        churn_day=churn_day,
        break_days=break_days,
        return_day=return_day,
        identity_fields=(
            _identity_fields(None, anon_user_field, anonymous_id),
            _identity_fields(user_id, anon_user_field, anonymous_id),
        ),
        suffix=f',"context":{dumps(context)},"channel":"{channel}","version":2}}',
        identified=identity == "identified",
    )


def _identity_fields(user_id: str | None, anon_user_field: str, anonymous_id: str | None) -> str:
    """`"userId":…,"anonymousId":…,` as the SDK sends them; anonymous SDKs differ on userId."""
    fields: dict[str, str | None] = {}
    if user_id is not None:
        fields["userId"] = user_id
    elif anon_user_field == "null":
        fields["userId"] = None
    elif anon_user_field == "empty":
        fields["userId"] = ""
    if anonymous_id is not None:
        fields["anonymousId"] = anonymous_id
    return dumps(fields)[1:-1] + "," if fields else ""


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _context(rng: random.Random, platform: str, tz_name: str, is_bot: bool) -> dict[str, Any]:
    """A Segment-like `context` object per device, reused by all of the user's events."""
    ip = f"{rng.randint(11, 223)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
    locale = rng.choice(("en-US", "de-DE", "pt-BR", "hi-IN", "ja-JP", "en-GB", "fr-FR"))
    if platform == "web":
        agent = (
            rng.choice(_BOT_AGENTS)
            if is_bot
            else (
                "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 "
                "(KHTML, like Gecko) Version/17.2 Safari/605.1.15"
                if rng.random() < 0.4
                else "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like "
                "Gecko) Chrome/120.0.0.0 Safari/537.36"
            )
        )
        return {
            "library": {"name": "analytics.js", "version": "next-1.62.0"},
            "ip": ip,
            "locale": locale,
            "userAgent": agent,
        }
    if platform in ("ios", "android"):
        ios = platform == "ios"
        return {
            "library": {
                "name": "analytics-ios" if ios else "analytics-android",
                "version": "4.1.8" if ios else "4.11.3",
            },
            "app": {"name": "Shoply", "version": rng.choice(("3.4.0", "3.5.1", "3.6.0"))},
            "device": {
                "id": _uuid(rng),
                "manufacturer": "Apple" if ios else rng.choice(("samsung", "Google", "Xiaomi")),
                "model": rng.choice(("iPhone14,5", "iPhone15,2"))
                if ios
                else rng.choice(("SM-S911B", "Pixel 8", "2201117TG")),
                "type": platform,
            },
            "os": {
                "name": "iOS" if ios else "Android",
                "version": rng.choice(("17.2", "16.7.4")) if ios else rng.choice(("14", "13")),
            },
            "network": {"wifi": rng.random() < 0.6, "carrier": rng.choice(("T-Mobile", "Vivo"))},
            "ip": ip,
            "locale": locale,
            "timezone": tz_name,
        }
    return {"library": {"name": "analytics-python", "version": "2.3.2"}, "ip": ip}
