"""SPEC §2's duplicate rule across batches and dates: the winner of an id, and what becomes of
each copy of a contested id (transforms/events.py)."""

from __future__ import annotations

from datetime import date, timedelta

from sessionize_assets.transforms.events import Contest, mark_winners

D = date(2026, 1, 10)


def day(offset: int) -> date:
    return D + timedelta(days=offset)


def test_mark_winners_takes_the_earliest_batch_whatever_the_date(spark):
    copies = spark.createDataFrame(
        [
            (day(3), "a", day(4)),
            (day(1), "a", day(2)),  # the earliest batch, on an earlier date: wins
            (day(5), "a", day(5)),
            (day(0), "b", day(6)),  # alone: wins
        ],
        "event_date date, event_id string, received_date date",
    )
    marked = sorted((r.event_id, r.received_date, r.wins) for r in mark_winners(copies).collect())
    assert marked == [
        ("a", day(2), True),
        ("a", day(4), False),
        ("a", day(5), False),
        ("b", day(6), True),
    ]


# Copies of "x": received on day 0 (the earliest batch) with its timestamp on day 0, and on
# day 2 re-stamped onto day 1.
FIRST = (day(0), "x", day(0))
LATER = (day(1), "x", day(2))


def contest(*, own, in_events=(), rejected=()) -> Contest:
    return Contest(
        copies={"x": {FIRST, LATER}},
        own=set(own),
        in_events=set(in_events),
        rejected=set(rejected),
    )


def test_a_copy_of_a_later_batch_loses_to_the_winner_in_events():
    settled = contest(own=[LATER], in_events=[FIRST]).settle([])
    assert (settled.lose, settled.reject) == ({LATER}, {LATER})
    assert not (settled.drop or settled.promote or settled.unreject)


def test_the_earliest_batch_arriving_last_displaces_the_copy_in_events():
    settled = contest(own=[FIRST], in_events=[LATER]).settle([])
    assert settled.lose == set() and settled.present == set()  # FIRST is appended
    assert settled.drop == settled.displace == settled.reject == {LATER}


def test_a_copy_no_table_holds_yet_is_left_to_the_run_of_its_own_input():
    settled = contest(own=[FIRST]).settle([])
    assert not (settled.drop or settled.reject or settled.lose)


def test_a_rejected_copy_whose_winner_vanished_is_promoted():
    only = Contest(copies={"x": {LATER}}, own=set(), in_events=set(), rejected={LATER})
    settled = only.settle([])
    assert settled.promote == settled.unreject == {LATER}
    assert not (settled.reject or settled.drop)


def test_a_retry_after_a_crash_does_not_reject_or_append_twice():
    # Killed after the rejections commit: the displaced copy is rejected but still in events.
    settled = contest(own=[FIRST], in_events=[LATER], rejected=[LATER]).settle([])
    assert settled.drop == {LATER} and settled.reject == set()
    # Killed after the events commit: this run's winner is there already.
    settled = contest(own=[FIRST], in_events=[FIRST], rejected=[LATER]).settle([])
    assert settled.present == {FIRST} and not (settled.drop or settled.reject)


def test_on_a_recomputed_date_a_losing_copy_is_rejected_again_whole():
    # The recomputed dates' rejections are written again: a loser there is rejected anew,
    # and `events` there is compared row for row (no drop by key).
    settled = contest(own=[LATER], in_events=[FIRST, LATER], rejected=[LATER]).settle([day(1)])
    assert settled.lose == settled.reject == {LATER} and settled.drop == set()
