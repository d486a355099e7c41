"""The lifecycle's bookkeeping: what `user_lifecycle_state` and `user_lifecycle_snapshot` have
absorbed, as Delta `txn` actions of their own commits, and what a run reports.

- `user_lifecycle_state` records the `sessions` version it reflects and its as-of day, both in
  the version of one application id (`ABSORBED`, see `absorbed_mark`);
- `user_lifecycle_snapshot` records the `user_lifecycle_state` version its counts reflect
  (`STATE_ABSORBED`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date

from sessionize_assets.lake.store import AppTransaction

# Delta application ids of the bookkeeping (see the module docstring).
ABSORBED = "sessionize.user_lifecycle_state.absorbed"  # version: `absorbed_mark`
STATE_ABSORBED = "sessionize.user_lifecycle_snapshot.state_version"
# Above every date's proleptic ordinal (date.max is 3,652,059): the as-of day's share of a mark.
_DAYS = 10_000_000

Interval = tuple[str, str, date, date]  # user_id, state, valid_from, valid_to


@dataclass(kw_only=True)
class LifecycleReport:
    as_of: date
    days: list[date] = field(default_factory=list)  # every snapshot day this run wrote
    restated_from_start: bool = False  # no usable bookkeeping: every user was restated
    users_restated: int = 0
    users_changed: int = 0  # users with an interval row added or removed
    intervals_added: int = 0
    intervals_removed: int = 0
    state_rows_written: int = 0  # rows in the files committed, carried rows included
    state_files_rewritten: int = 0
    state_rows: int = 0  # interval rows in the table after the run
    state_version: int | None = None
    snapshot_version: int | None = None


def absorbed_mark(sessions_version: int | None, as_of: date) -> AppTransaction:
    """The intervals' bookkeeping in one `AppTransaction`: the `sessions` version they reflect
    (None before any) and their as-of day, packed so that the version grows whenever either
    does (neither moves back; Delta records one application version per commit)."""
    absorbed = 0 if sessions_version is None else sessions_version + 1
    return AppTransaction(app_id=ABSORBED, version=absorbed * _DAYS + as_of.toordinal())


def absorbed_by(version: int | None) -> tuple[int | None, date | None]:
    """(`sessions` version, as-of day) of an `absorbed_mark` version; (None, None) for none."""
    if version is None:
        return None, None
    absorbed, ordinal = divmod(version, _DAYS)
    return (None if absorbed == 0 else absorbed - 1), date.fromordinal(ordinal)


@dataclass(frozen=True, kw_only=True)
class IntervalCommit:
    """How a run commits the intervals: with its bookkeeping mark, against the version read."""

    tags: dict[str, str]
    mark: AppTransaction | None  # None: the table's mark already says what this run absorbs
    read_version: int | None
