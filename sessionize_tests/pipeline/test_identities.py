"""The Delta-log bookkeeping of `user_identities` (pipeline/identities.py)."""

from __future__ import annotations

from sessionize_assets.lake.store import FileChange
from sessionize_assets.pipeline.identities import net_files


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
