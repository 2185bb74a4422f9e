"""Transfers sharing links in virtual time (dist_lib/transfers.py), against hand-derived ends."""

from __future__ import annotations

import pytest

from dist_lib.transfers import Scheduler, Transfer


def run(capacity, transfers):
    """Add (start, duration, usage) transfers and return each one's end, in the order given."""
    scheduler = Scheduler(capacity)
    made = [Transfer(start, duration, usage, None, None, (i,)) for i, (start, duration, usage) in enumerate(transfers)]
    for t in made:
        scheduler.add(t)
    while scheduler.next_completions():
        pass
    return [t.end for t in made]


def test_a_transfer_alone_takes_its_duration():
    assert run([1], [(0.5, 2.0, ((0, 1),))]) == [2.5]


def test_transfers_on_different_links_do_not_slow_each_other():
    assert run([1, 1], [(0.0, 1.0, ((0, 1),)), (0.0, 1.0, ((1, 1),))]) == [1.0, 1.0]


def test_a_node_with_two_nics_carries_two_messages_at_full_speed_and_three_at_two_thirds():
    one = ((0, 1),)
    assert run([2], [(0.0, 1.0, one)] * 2) == [1.0, 1.0]
    assert run([2], [(0.0, 1.0, one)] * 3) == [pytest.approx(1.5)] * 3


def test_a_transfer_moves_at_the_share_of_its_most_loaded_link():
    # A crosses links 0 and 1, B only link 0, C and D only link 1. Link 0 carries two (1/2 each), link 1
    # three (1/3 each), so A moves at 1/3, B at 1/2 (proportional shares: B does not take the part of
    # link 0 that A leaves unused, as max-min sharing would). B ends at 2; A, C and D have 1/3 left then,
    # still at 1/3 on link 1, and end at 3.
    ends = run([1, 1], [(0.0, 1.0, ((0, 1), (1, 1))), (0.0, 1.0, ((0, 1),)), (0.0, 1.0, ((1, 1),)),
                        (0.0, 1.0, ((1, 1),))])
    assert ends == [pytest.approx(3.0), pytest.approx(2.0), pytest.approx(3.0), pytest.approx(3.0)]
