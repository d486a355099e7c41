"""Every partitions definition and mapping of the asset graph.

Why the sessions window is exact: a session starting on day D is decided by
- the event before its first event, if that one is within the gap G: at most
  `lookback = ceil(G / 1 day)` days before D (D-1 for G = 30 min), and
- its chain up to start + L, plus the next event if it comes within G (that one only decides
  quarantine): at most `lookahead = ceil((L + G) / 1 day)` days after D (D+2 with the defaults,
  since a start at 23:59 on D plus 24 h 30 min ends on D+2).
No other event can change it, so sessions D depends on events D-lookback .. D+lookahead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import date, timedelta

from dagster import (
    AssetSelection,
    AutomationCondition,
    DailyPartitionsDefinition,
    TimeWindowPartitionMapping,
)

from sessionize_assets.settings import Settings

PARTITION_FORMAT = "%Y-%m-%d"
# Run tags that target one partition, or a range of them in a single run (public Dagster tags).
PARTITION_TAG = "dagster/partition"
RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"
ONE_DAY = timedelta(days=1)


def received_day_partitions(settings: Settings) -> DailyPartitionsDefinition:
    """One partition per landing batch (the UTC day events were received), through today.

    Today is included: a live collector writes today's folder during the day, the landing
    sensor ingests what has landed and ingests it again as it grows (a changed folder is a
    re-delivery), and the snapshot's today is provisional until the day is over.
    """
    return _utc_days(settings, end_offset=1)


def event_day_partitions(settings: Settings) -> DailyPartitionsDefinition:
    """Event (and session) days: one day past the received days, since `timestamp` may lead
    `receivedAt` by the future tolerance (a batch of today holds events of tomorrow 00:04)."""
    return _utc_days(settings, end_offset=2)


def daily_figure_partitions(settings: Settings) -> DailyPartitionsDefinition:
    """The session days that are over, through yesterday: `daily_sessions`' partitions.

    A day's figures are a partition once the day is over, which is when an analyst asks for
    them and what the freshness check expects by its deadline: yesterday's. Today's and
    tomorrow's rows are in the table as the lake holds them, shown once their day is over
    (`sensors/behind.py`, `Behind.summary_dates`)."""
    return _utc_days(settings, end_offset=0)


def last_partition_through(partitions_def: DailyPartitionsDefinition, day: date) -> str | None:
    """The latest partition key of `partitions_def` on or before `day` (None: none yet)."""
    last = partitions_def.get_last_partition_key()
    if last is None:
        return None
    return min(last, day.strftime(PARTITION_FORMAT))


def _utc_days(settings: Settings, *, end_offset: int) -> DailyPartitionsDefinition:
    """UTC days from the start date to `end_offset` days past the last complete one."""
    return DailyPartitionsDefinition(
        start_date=settings.start_date.isoformat(),
        timezone="UTC",
        fmt=PARTITION_FORMAT,
        end_offset=end_offset,
    )


def session_lookback_days(settings: Settings) -> int:
    return math.ceil(settings.session_gap / ONE_DAY)


def session_lookahead_days(settings: Settings) -> int:
    return math.ceil((settings.max_session_length + settings.session_gap) / ONE_DAY)


def sessions_on_events_mapping(settings: Settings) -> TimeWindowPartitionMapping:
    """sessions D <- events D-lookback .. D+lookahead."""
    return TimeWindowPartitionMapping(
        start_offset=-session_lookback_days(settings),
        end_offset=session_lookahead_days(settings),
    )


def days_around(days: list[date], *, before: int, after: int) -> set[date]:
    """Every date from `before` days before to `after` days after each of `days`."""
    return {day + timedelta(days=offset) for day in days for offset in range(-before, after + 1)}


def event_window(session_dates: list[date], settings: Settings) -> list[date]:
    """Event dates that decide the sessions of `session_dates`."""
    return sorted(
        days_around(
            session_dates,
            before=session_lookback_days(settings),
            after=session_lookahead_days(settings),
        )
    )


def session_dates_for(event_dates: list[date], settings: Settings) -> list[date]:
    """Session dates whose sessions can change when events on `event_dates` change."""
    days = days_around(
        event_dates,
        before=session_lookahead_days(settings),
        after=session_lookback_days(settings),
    )
    return sorted(d for d in days if d >= settings.start_date)


def contiguous_ranges(
    days: list[date],
    *,
    max_days: int,
    bridge_gaps: bool = True,
    loads: Mapping[date, float] | None = None,
) -> list[tuple[date, date]]:
    """Cover `days` with (first, last) ranges of at most `max_days` days' worth of work each.

    A day weighs its load: the events its run takes on, in typical days of the lake
    (`manifests.event_date_loads`, `manifests.session_date_loads`); without `loads`, a day
    weighs 1, as a received day's batch does. So a backlog of whole days is cut every
    `max_days` days, and a daily batch whose late events reach a few hundred dates is one run.

    One range run per range: partitions in a range that have nothing new are skipped by the
    assets, so a gap inside a range costs a manifest lookup, not a recompute. A gap of fewer
    than `max_days` days is bridged. Ingestion has no such skip (a day in its range is read
    as a batch): it passes `bridge_gaps=False`.
    """
    ranges: list[tuple[date, date]] = []
    load = 0.0
    for day in sorted(set(days)):
        weight = 1.0 if loads is None else loads.get(day, 0.0)
        if ranges:
            gap = (day - ranges[-1][1]).days - 1
            joins = gap == 0 or (bridge_gaps and gap < max_days)
            if joins and load + weight <= max_days:
                ranges[-1] = (ranges[-1][0], day)
                load += weight
                continue
        ranges.append((day, day))
        load = weight
    return ranges


def late_data_condition(*, ignore: AssetSelection | None = None) -> AutomationCondition:
    """eager() for late data: every partition whose events changed, not only the latest one.

    What is left out of `eager()`, and why:
    - `in_latest_time_window`: it would ignore late data for old dates;
    - `any_deps_missing`: it would hold a date back until every event date of its window
      exists, although an event date with no events is legitimately empty;
    - `newly_missing`: sessions follow from events, not from the calendar. A new day's
      partition has nothing to compute until its events exist, and on a first tick (a new
      Dagster home after `sessionize replay`) every empty date would count as newly missing.

    And one thing is added: a partition is requested a tick after its deps were updated at
    the earliest (`~updated`), if no run has taken it up by then. The stale_sessions_sensor
    requests the same partitions as soon as the events run has ended, as one range run;
    automation would request them as a backfill, which the backfill daemon starts up to 30 s
    later (its loop is fixed). The sensor ticks more often (`AUTOMATION_INTERVALS`).

    Updates of the `ignore` deps do not count.
    """
    updated = AutomationCondition.any_deps_updated()
    if ignore is not None:
        updated = updated.ignore(ignore)
    return (
        updated.since_last_handled()
        & ~updated.with_label("not on the update's tick")
        & ~AutomationCondition.any_deps_in_progress()
        & ~AutomationCondition.in_progress()
    ).with_label("eager for late data")


def same_day_mapping() -> TimeWindowPartitionMapping:
    """snapshot D <- sessions D (received-day and event-day partitions share their dates)."""
    return TimeWindowPartitionMapping()


def previous_day_mapping() -> TimeWindowPartitionMapping:
    """snapshot D <- its own D-1: the balance the day is advanced from."""
    return TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)


def days_between(first: date, last: date) -> list[date]:
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


def lifecycle_range(
    *,
    sessions_reported: Iterable[date],
    through: date | None,
    latest: date | None,
    start: date,
    failed_from: date | None = None,
) -> tuple[date, date] | None:
    """The snapshot dates a lifecycle run is asked for, or None: nothing to do.

    A lifecycle run brings the whole snapshot up to date whatever range it is given (the lake's
    own bookkeeping says what is stale), and it reports every day of its range, each with its
    own figures. So the range says which partitions Dagster must record again, not which days
    are corrected. It ends at the latest received day (the snapshot's last date) and starts at
    the earliest of
    - the first date no run has computed yet (from `start` when none has);
    - `failed_from`, the first day of a failed run: its partitions are reported again;
    - the earliest of `sessions_reported`, the session dates materialized since the snapshot
      last ran, changed or not. In the lineage, snapshot day D follows from sessions D and from
      snapshot D-1, so once sessions D has a newer materialization, Dagster shows D and every
      later day as unsynced until each is reported after it. The run re-reads nothing for
      them: reporting a day costs a line of the event log, not a Spark job.
    """
    if latest is None:
        return None
    candidates = [day for day in sessions_reported if day <= latest]
    if failed_from is not None and failed_from <= latest:
        candidates.append(failed_from)
    first_missing = start if through is None else through + ONE_DAY
    if first_missing <= latest:
        candidates.append(first_missing)
    if not candidates:
        return None
    return max(min(candidates), start), latest
