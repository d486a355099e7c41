"""The asset keys other parts look up, each from its table's spec: one name for both."""

from __future__ import annotations

from dagster import AssetKey

from sessionize_assets.lake.tables import EVENTS, RAW_EVENTS, SESSIONS, USER_LIFECYCLE_SNAPSHOT

RAW_EVENTS_KEY = AssetKey(RAW_EVENTS.name)
EVENTS_KEY = AssetKey(EVENTS.name)
SESSIONS_KEY = AssetKey(SESSIONS.name)
SNAPSHOT_KEY = AssetKey(USER_LIFECYCLE_SNAPSHOT.name)
