"""Stitching under late data (SPEC §3c): a late sign-in maps a device's sessions on every
date, a displaced one unmaps them."""

from __future__ import annotations

from datetime import date, datetime

import pytest

from sessionize_assets.lake.tables import (
    SESSIONS,
    SESSIONS_FILE_ROWS,
)
from sessionize_tests.harness import (
    ON_EACH_BACKEND_AND_PLACEMENT,
    day,
)

# Minutes of batches in all: started first (conftest.py).
pytestmark = pytest.mark.slow


def device(anonymous_id: str, **fields) -> dict:
    """Message fields of a device's event: anonymous until `userId` is given."""
    return {
        "type": "track",
        "event": "Tapped",
        "userId": None,
        "anonymousId": anonymous_id,
        **fields,
    }


# Other visitors of each day: three sessions files a day (SESSIONS_FILE_ROWS), of which the
# device's sessions ("d-1" sorts first) are in one.
CROWD = 2 * SESSIONS_FILE_ROWS + 100


def crowd(on: date) -> list[tuple]:
    return [(f"{on}-o{n:04d}", f"o{n:04d}", f"{on} 12:00") for n in range(CROWD)]


@ON_EACH_BACKEND_AND_PLACEMENT
def test_a_late_sign_in_relabels_the_device_sessions_on_every_date(pipeline, pair_placement):
    """SPEC §3c: a device's sign-in that arrives days late maps its anonymous sessions on
    three dates to the user, rewriting the one file of each date that holds them, in the
    run's one sessions commit; a later sign-in of another user on the same (shared) device
    maps them to that user."""
    for offset in range(3):
        on = day(offset)
        pipeline.land(on, [(f"d{offset}", None, f"{on} 09:00", device("d-1")), *crowd(on)])
        pipeline.process(on)
    assert set(pipeline.stitched().values()) >= {"d-1"}
    files = {
        d: set(pipeline.store.live_files(SESSIONS, partitions=[d])) for d in map(day, range(3))
    }
    assert all(len(found) == 3 for found in files.values())

    # Signed in on the second day, delivered on the sixth.
    pipeline.land(day(5), [("s1", "alice", "2026-01-11 09:10", device("d-1", userId="alice"))])
    version = pipeline.store.version(SESSIONS)
    run = pipeline.process(day(5))
    assert pipeline.store.version(SESSIONS) == version + 1
    assert (run.identities.ids_new, run.identities.ids_remapped) == (1, 0)
    relabel = run.sessions.relabel
    assert (relabel.ids_changed, relabel.rows_relabelled) == (1, 3)
    assert relabel.by_date == {day(0): 1, day(1): 1, day(2): 1}
    assert relabel.files_rewritten == 3  # one of each date's three
    for d, before in files.items():
        after = set(pipeline.store.live_files(SESSIONS, partitions=[d]))
        assert len(before - after) == 1
    stitched = pipeline.stitched()
    assert [stitched[("d-1", f"{day(n)} 09:00:00")] for n in range(3)] == ["alice"] * 3
    assert stitched[("o0001", f"{day(0)} 12:00:00")] == "o0001"
    pipeline.assert_equals_full_recompute()
    # No session changed: the corrections log has nothing of the relabelling.
    assert pipeline.changes("run-4") == [("added", "2026-01-11 09:10:00", 1)]

    # A later sign-in of bob on the same device, delivered on time: bob's now.
    pipeline.land(day(6), [("s2", "bob", "2026-01-16 20:00", device("d-1", userId="bob"))])
    run = pipeline.process(day(6))
    assert (run.identities.ids_new, run.identities.ids_remapped) == (0, 1)
    assert run.sessions.relabel.rows_relabelled == 3
    assert {v for (user, _), v in pipeline.stitched().items() if user == "d-1"} == {"bob"}
    assert pipeline.identities()["d-1"] == ("bob", datetime(2026, 1, 11, 9, 10))
    pipeline.assert_equals_full_recompute()


def test_a_displaced_sign_in_unmaps_the_device(pipeline):
    """A device's only sign-in is displaced by an earlier batch's copy of its id that carries
    no userId (SPEC §2): the device is recomputed from its events, is no longer identified,
    and its sessions are its own again."""
    pipeline.land(day(0), [("a", None, "2026-01-10 09:00", device("d-1"))])
    pipeline.process(day(0))
    pipeline.land(day(2), [("m", "alice", "2026-01-10 09:05", device("d-1", userId="alice"))])
    pipeline.process(day(2))
    assert pipeline.identities() == {"d-1": ("alice", datetime(2026, 1, 10, 9, 5))}
    assert pipeline.stitched()[("d-1", "2026-01-10 09:00:00")] == "alice"

    # The same id, received a day earlier (delivered late): it wins, without a userId.
    pipeline.land(day(1), [("m", None, "2026-01-10 09:05", device("d-1"))])
    run = pipeline.process(day(1))
    assert (run.identities.ids_recomputed, run.identities.ids_unmapped) == (1, 1)
    assert pipeline.identities() == {}
    assert set(pipeline.stitched().values()) == {"d-1"}
    pipeline.assert_equals_full_recompute()
