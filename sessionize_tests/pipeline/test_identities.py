"""The Delta-log bookkeeping of `user_identities` (pipeline/identities.py)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionize_assets.lake.store import FileChange
from sessionize_assets.pipeline.identities import _absorb, _first_and_latest, _order, net_files


def change(path: str, version: int, *, added: bool) -> FileChange:
    return FileChange(path=path, partition="2026-01-01", version=version, added=added)


def test_net_files_leave_out_a_file_added_and_removed_in_between():
    changes = [
        change("old", 3, added=False),  # there before: removed
        change("a", 3, added=True),  # added, still there: added
        change("b", 4, added=True),  # added, then removed: neither
        change("b", 5, added=False),
        change("c", 5, added=True),
    ]
    assert net_files(changes) == (["a", "c"], ["old"])


def test_net_files_of_no_change_are_empty():
    assert net_files([]) == ([], [])


@settings(max_examples=200, deadline=None, database=None)
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(["a1", "a2", "a3"]),
            st.integers(0, 5),
            st.integers(0, 30).map(lambda i: f"e{i}"),  # "e10" sorts before "e2"
        ),
        unique_by=lambda e: e[2],
        max_size=12,
    )
)
def test_an_ids_first_and_latest_events_are_all_its_identity_keeps(events):
    """Absorbing only each anonymous id's first and latest identifying events of a change
    gives the rows that absorbing every one of them, in order, gives."""
    start = datetime(2026, 1, 10)
    rows = [
        {
            "event_id": event_id,
            "anonymous_id": key,
            "segment_user_id": f"u-{event_id}",
            "event_ts": start + timedelta(minutes=minute),
        }
        for key, minute, event_id in events
    ]
    table = pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [
                ("event_id", pa.string()),
                ("anonymous_id", pa.string()),
                ("segment_user_id", pa.string()),
                ("event_ts", pa.timestamp("us")),
            ]
        ),
    )

    def absorbed(kept: list[dict]) -> dict[str, dict]:
        found: dict[str, dict] = {}
        for event in sorted(kept, key=_order):
            found[event["anonymous_id"]] = _absorb(found.get(event["anonymous_id"]), event)
        return found

    assert absorbed(_first_and_latest(table).to_pylist()) == absorbed(rows)
