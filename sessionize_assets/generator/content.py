"""What messages say: Segment message fields, properties, and the rendered JSON lines.

Why pre-rendered halves: a message's JSON is the same for each delivery except `sentAt` and
`receivedAt`, and the user's `context` is the same for all of its messages. Rendering the
message once as (head, tail) around those two stamps, with the context text made once per user,
is what makes tens of millions of lines affordable.
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

from sessionize_assets.generator.formats import dumps, iso
from sessionize_assets.generator.population import User

_PAGES = ("Home", "Category", "Product", "Cart", "Search", "Account", "Help")
_SCREENS = ("Home", "Feed", "Product Detail", "Cart", "Settings", "Orders")
_CATEGORIES = ("shoes", "outdoor", "electronics", "kitchen", "books", "toys")
_QUERIES = ("running shoes", "café crème", "usb-c cable", "winter jacket", "fußball", "lego")
_TRACK_EVENTS = (
    "Product Viewed",
    "Product Viewed",
    "Product Added",
    "Products Searched",
    "Checkout Started",
    "Order Completed",
    "Signed In",
)

SITE = "https://shop.example.com"
# How a web visit arrives (its landing page): (weight, referrer, the landing URL's query). Every
# channel of SPEC §3b, with the query strings analysts meet: `+` and `%xx` encodings, a repeated
# parameter (the first counts), an empty value, and an internal referrer (the site's own host,
# `www.` and upper case included), which counts as none.
_ARRIVALS: tuple[tuple[int, str, str], ...] = (
    (30, "", ""),
    (18, "https://www.google.com/", ""),
    (3, "https://duckduckgo.com/", ""),
    (7, "https://t.co/x", ""),
    (3, "https://m.facebook.com/", ""),
    (5, "https://blog.example.org/best-shoes-2026", ""),
    (6, "https://WWW.Shop.Example.com/cart", ""),
    (8, "https://www.google.com/", "?utm_source=google&utm_medium=cpc&utm_campaign=winter+sale"),
    (
        4,
        "https://m.facebook.com/",
        "?utm_source=facebook&utm_medium=paid_social&utm_campaign=caf%C3%A9%20cr%C3%A8me",
    ),
    (5, "", "?utm_source=newsletter&utm_medium=email&utm_campaign=weekly&utm_content=hero"),
    (2, "https://partner.example.net/", "?utm_source=partner&utm_medium=affiliate&utm_medium=cpm"),
    (2, "https://ads.adnet.example/", "?utm_source=adnet&utm_medium=display&utm_campaign=retarget"),
    (2, "", "?utm_source=spring&utm_campaign=spring+drop&utm_term="),
)
_ARRIVAL_WEIGHTS = tuple(weight for weight, _, _ in _ARRIVALS)
# Mobile installs and re-engagements attributed by the app's SDK: `context.campaign`.
APP_CAMPAIGN_SHARE = 0.15
_APP_CAMPAIGNS = (
    {"source": "facebook", "medium": "paid_social", "name": "app install"},
    {"source": "google", "medium": "cpc", "name": "brand", "term": "shoply"},
    {"source": "newsletter", "medium": "email", "name": "weekly", "content": "push"},
)

# A message rendered around its delivery stamps: (head up to `timestamp`, tail from the body on).
Payload = tuple[str, str]


def message_payload(
    user: User, rng: random.Random, ts: int, kind: str, identified: bool, message_id: str
) -> Payload:
    """One Segment message, in Segment's key order, rendered around `sentAt`/`receivedAt`.

    The head is assembled from fragments that are JSON-encoded once (type and name, the user's
    identity fields); the id and timestamp need no escaping.
    """
    mtype, name = _type_and_name(user, rng, kind)
    identity = user.identity_fields[identified or user.identity == "identified"]
    head = (
        f'{{"messageId":"{message_id}",{_type_fields(mtype, name)},{identity}'
        f'"timestamp":"{iso(ts, user.ts_style, user.offset_min)}"'
    )
    if mtype == "identify":
        traits = {
            "email": f"{user.user_id}@example.com",
            "plan": rng.choice(("free", "plus", "pro")),
        }
        return head, f',"traits":{dumps(traits)}{user.suffix}'
    suffix = user.suffix
    if kind == "open" and mtype == "page":
        properties = _landing_page(rng)
    else:
        properties = _properties(rng, mtype, name or "")
        mobile = user.platform in ("ios", "android")
        if kind == "open" and mobile and rng.random() < APP_CAMPAIGN_SHARE:
            campaign = dumps(rng.choice(_APP_CAMPAIGNS))
            suffix = suffix.replace('"context":{', f'"context":{{"campaign":{campaign},', 1)
    return head, f',"properties":{dumps(properties)}{suffix}'


def _landing_page(rng: random.Random) -> dict[str, Any]:
    """The page a web visit starts on, with where it came from (`_ARRIVALS`)."""
    _, referrer, query = rng.choices(_ARRIVALS, _ARRIVAL_WEIGHTS)[0]
    path = rng.choice(("/", "/sale", f"/product/{rng.randint(1, 500)}"))
    return {"path": path, "url": f"{SITE}{path}{query}", "title": "Shoply", "referrer": referrer}


def delivery_line(message: Payload, ts: int, received: int, latency: int) -> str:
    """The JSON line of one delivery: the message with its `sentAt` and `receivedAt`."""
    head, tail = message
    sent = iso(max(ts, received - latency), "z_ms", 0)
    return f'{head},"sentAt":"{sent}","receivedAt":"{iso(received, "z_ms", 0)}"{tail}'


def _type_and_name(user: User, rng: random.Random, kind: str) -> tuple[str, str | None]:
    mobile = user.platform in ("ios", "android")
    if kind == "identify":
        return "identify", None
    if kind == "bot":
        return "page", rng.choice(_PAGES)
    if kind == "open":
        if mobile:
            return "track", "Application Opened"
        if user.platform == "web":
            return "page", "Home"
        return "track", rng.choice(("Order Completed", "Subscription Renewed"))
    if user.platform == "server":
        return "track", rng.choice(("Order Completed", "Subscription Renewed", "Refunded"))
    if rng.random() < 0.45:
        return ("screen", rng.choice(_SCREENS)) if mobile else ("page", rng.choice(_PAGES))
    return "track", rng.choice(_TRACK_EVENTS)


@cache
def _type_fields(mtype: str, name: str | None) -> str:
    fields = {"type": mtype}
    if name is not None:
        fields["event" if mtype == "track" else "name"] = name
    return dumps(fields)[1:-1]


def _properties(rng: random.Random, mtype: str, name: str) -> dict[str, Any]:
    if mtype == "page":
        path = "/" if name == "Home" else f"/{name.lower()}/{rng.randint(1, 500)}"
        # A page within a visit: the site's own previous page refers to it.
        return {
            "path": path,
            "url": f"{SITE}{path}",
            "title": f"{name} | Shoply",
            "referrer": f"{SITE}/",
        }
    if mtype == "screen":
        return {"name": name}
    if name in ("Product Viewed", "Product Added"):
        props: dict[str, Any] = {
            "product_id": f"sku-{rng.randint(1000, 9999)}",
            "category": rng.choice(_CATEGORIES),
            "price": round(rng.uniform(3, 250), 2),
            "currency": rng.choice(("EUR", "USD")),
        }
        if name == "Product Added":
            props["quantity"] = rng.randint(1, 3)
        return props
    if name == "Products Searched":
        return {"query": rng.choice(_QUERIES)}
    if name in ("Checkout Started", "Order Completed", "Subscription Renewed", "Refunded"):
        return {
            "order_id": f"ord-{rng.getrandbits(32):08x}",
            "total": round(rng.uniform(5, 400), 2),
            "currency": rng.choice(("EUR", "USD")),
            "products": [
                {"product_id": f"sku-{rng.randint(1000, 9999)}", "quantity": rng.randint(1, 2)}
                for _ in range(rng.randint(1, 3))
            ],
        }
    if name == "Signed In":
        return {"method": rng.choice(("password", "google", "apple"))}
    return {}
