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
    return head, f',"properties":{dumps(_properties(rng, mtype, name or ""))}{user.suffix}'


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
        return {
            "path": path,
            "url": f"https://shop.example.com{path}",
            "title": f"{name} | Shoply",
            "referrer": rng.choice(("", "https://www.google.com/", "https://t.co/x")),
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
