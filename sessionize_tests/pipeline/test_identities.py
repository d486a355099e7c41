"""The Delta-log bookkeeping of `user_identities` (pipeline/identities.py)."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionize_assets.lake.embedded import EmbeddedDeltaStore
from sessionize_assets.lake.store import FileChange
from sessionize_assets.lake.tables import EVENTS, USER_IDENTITIES
from sessionize_assets.pipeline.identities import (
    MERGE_ON_DRIVER_BYTES,
    _absorb,
    _first_and_latest,
    _order,
    net_files,
    update_identities,
)


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


def test_a_change_too_large_to_merge_on_the_driver_builds_the_table_again(spark, tmp_path):
    """The same batches absorbed by the driver's merge, and by building the table again with
    Spark (any change above `merge_on_driver_bytes`), give the same rows and figures."""
    day = date(2026, 1, 10)

    def events(*rows: tuple[str, str | None, str | None, int]):
        at = datetime(2026, 1, 10, 8)
        fixed = {"event_date": day, "received_at": at, "received_date": day, "source_file": "f"}
        return spark.createDataFrame(
            [
                {
                    "event_id": event_id,
                    "user_id": user or anon,
                    "anonymous_id": anon,
                    "segment_user_id": user,
                    "event_ts": at + timedelta(minutes=minute),
                    **fixed,
                }
                for event_id, anon, user, minute in rows
            ],
            EVENTS.schema,
        )

    first = [("e1", "a1", "u1", 5), ("e2", "a2", "u2", 10), ("e3", "a2", None, 1)]
    # The next batch: a later sign-in moves a1 to u9, a2 signs in earlier, a3 is new.
    later = [("e4", "a1", "u9", 30), ("e5", "a2", "u2", 2), ("e6", "a3", "u3", 7)]
    tables, reports = [], []
    for lake, driver_bytes in (("merged", MERGE_ON_DRIVER_BYTES), ("built", 0)):
        store = EmbeddedDeltaStore(spark=spark, lake=tmp_path / lake)
        store.replace_partitions(EVENTS, events(*first), partitions=[day])
        assert update_identities(store, run_id="r1").rebuilt  # a first run
        store.rewrite(EVENTS, add=lambda: events(*later))
        reports.append(update_identities(store, run_id="r2", merge_on_driver_bytes=driver_bytes))
        tables.append(sorted(store.read_arrow(USER_IDENTITIES).to_pylist(), key=str))
    merged, built = reports
    assert (merged.rebuilt, built.rebuilt) == (False, True)
    assert tables[0] == tables[1]
    assert {row["anonymous_id"]: row["user_id"] for row in tables[0]} == {
        "a1": "u9", "a2": "u2", "a3": "u3"
    }  # fmt: skip
    for report in reports:
        assert (report.ids_new, report.ids_remapped, report.ids_unmapped) == (1, 1, 0)
