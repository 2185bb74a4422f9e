"""Transfers sharing links in virtual time (dist_lib/engine/transfers.py), against hand-derived ends."""

from __future__ import annotations

import gc
import weakref

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_lib.engine.transfers import PythonScheduler, PythonTransfer, Scheduler, Transfer


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


# ---- the C twins (dist_lib/native/_transfers.c) against the Python specification ----------------------------

def _c_twins():
    try:
        from dist_lib._buffers import Scheduler as CScheduler, Transfer as CTransfer
    except ImportError:
        return None
    return CTransfer, CScheduler


needs_c = pytest.mark.skipif(_c_twins() is None, reason="the C accelerator was not built")
TWINS = [pytest.param((PythonTransfer, PythonScheduler), id="python"),
         pytest.param(_c_twins(), id="c", marks=needs_c)]


def drive(twins, capacity, batches):
    """Add each batch of (start after `now`, duration, usage) transfers, then take one round of
    completions; then run the rest to the end. Returns everything either twin can be seen to do: each
    round's instant and the keys of the transfers that ended then, in the order returned, and every
    field of every transfer, as exact reprs."""
    transfer_type, scheduler_type = twins
    scheduler = scheduler_type(list(capacity))
    made, rounds = [], []
    for batch in batches:
        for offset, duration, usage in batch:
            transfer = transfer_type(scheduler.now + offset, duration, usage, None, None, (len(made),))
            made.append(transfer)
            scheduler.add(transfer)
        rounds.append((scheduler.now, [t.key for t in scheduler.next_completions()]))
    while done := scheduler.next_completions():
        rounds.append((scheduler.now, [t.key for t in done]))
    fields = [(t.start, t.end, t.left, t.speed, t.since, t.version, t.seq) for t in made]
    return repr((rounds, fields, list(scheduler.load), scheduler.count))


@st.composite
def transfer_sets(draw):
    """Links of mixed capacities (equal and tiny ones to make ties and heavy sharing, some above 2**53
    where a share needs the exact division), and batches of transfers whose starts and durations often
    coincide (simultaneous starts and ends), some starting before `now` (moved to `now`)."""
    links = draw(st.integers(1, 5))
    capacity = draw(st.lists(st.sampled_from([1, 3, 10**9, 25 * 10**9, 2**53 + 1]) | st.integers(1, 2**54),
                             min_size=links, max_size=links))
    usage = st.lists(st.tuples(st.integers(0, links - 1),
                               st.sampled_from([0, 1, 2, 10**9, 25 * 10**9]) | st.integers(0, 2**54)),
                     max_size=4).map(tuple)
    offset = st.sampled_from([-0.5, 0.0, 0.25, 0.5, 1.0]) | st.floats(0.0, 4.0)
    duration = st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0]) | st.floats(1e-9, 4.0)
    batches = draw(st.lists(st.lists(st.tuples(offset, duration, usage), max_size=6), min_size=1, max_size=8))
    return capacity, batches


@needs_c
@settings(max_examples=200, deadline=None)
@given(transfer_sets())
def test_the_c_scheduler_ends_every_transfer_as_the_python_one_to_the_bit(case):
    capacity, batches = case
    assert drive(_c_twins(), capacity, batches) == drive((PythonTransfer, PythonScheduler), capacity, batches)


@pytest.mark.parametrize("twins", TWINS)
def test_a_share_of_a_link_wanted_beyond_2_to_the_53_is_the_exactly_rounded_quotient(twins):
    # Two transfers want w = 9007271254604741 bytes/s in all (> 2**53, not a double) of a link carrying
    # c = 1062116443042877: each moves at c / w rounded once, 0.1179176704043299, where dividing the two
    # as doubles would give 0.11791767040432992.
    c, w = 1062116443042877, 9007271254604741
    assert c / w != float(c) / float(w)
    transfer_type, scheduler_type = twins
    scheduler = scheduler_type([c])
    made = [transfer_type(0.0, 1.0, ((0, rate),), None, None, (i,)) for i, rate in enumerate((2**52, w - 2**52))]
    for t in made:
        scheduler.add(t)
    assert scheduler.next_completions() == made  # both end at once, in the order they were added
    assert [t.speed for t in made] == [c / w] * 2 and [t.end for t in made] == [1.0 / (c / w)] * 2


@pytest.mark.parametrize("twins", TWINS)
def test_the_fields_the_engine_reads_and_writes(twins):
    transfer_type, scheduler_type = twins
    finish, owner = print, object()
    t = transfer_type(0.5, 2.0, ((0, 1),), finish, owner, (1, (0, 1), 3))
    assert (t.start, t.end, t.finish, t.owner, t.key, t.version) == (0.5, 2.5, finish, owner, (1, (0, 1), 3), 0)
    t.owner = None  # a message lets go of its channel and Works once finished
    assert t.owner is None


@needs_c
def test_the_c_twins_name_what_is_wrong_with_their_arguments():
    transfer_type, scheduler_type = _c_twins()
    with pytest.raises(TypeError, match=r"usage\[1\] must be \(link id, bytes/s\)"):
        transfer_type(0.0, 1.0, ((0, 1), (1, 2.5)), None, None, (0,))
    with pytest.raises(TypeError, match=r"capacity\[2\] must be a whole number"):
        scheduler_type([1, 2, -3])
    with pytest.raises(IndexError, match="link 4 of its usage is not one of the scheduler's 2 links"):
        scheduler_type([1, 2]).add(transfer_type(0.0, 1.0, ((4, 1),), None, None, (0,)))


@pytest.mark.parametrize("twins", TWINS)
def test_a_cycle_through_a_transfer_in_flight_is_collected(twins):
    """The engine holds the scheduler, which holds transfers, whose owners lead back to the engine."""
    transfer_type, scheduler_type = twins

    class Owner:
        pass

    owner = Owner()
    owner.scheduler = scheduler_type([1])
    owner.scheduler.add(transfer_type(0.0, 1.0, ((0, 1),), None, owner, (0,)))
    gone = weakref.ref(owner)
    del owner
    gc.collect()
    assert gone() is None


# ---- a split step's handover (run/split.py): one half's transfers, with their progress, to the other's scheduler

def _handover(twins, capacity, halves, rounds):
    """Run each half's transfers (on links of its own) on a scheduler of its own for `rounds` rounds of
    completions, hand the first half's unfinished ones to the second's scheduler (in flight with their
    progress, waiting as they are), set its clock to the earlier of the two, and run to the end. Returns
    each transfer's end and every round's (instant, keys)."""
    transfer_type, scheduler_type = twins
    schedulers, made, seen = [], [], []
    for half, count in zip(halves, rounds):
        scheduler = scheduler_type(list(capacity))
        for start, duration, usage in half:
            made.append(transfer_type(start, duration, usage, None, None, (len(made),)))
            scheduler.add(made[-1])
        for _ in range(count):
            seen.append((scheduler.now, [t.key for t in scheduler.next_completions()]))
        schedulers.append(scheduler)
    first, second = schedulers
    now = min(first.now, second.now)
    second.now = now
    for t in first.pending():
        copy = transfer_type(t.start, t.left, t.usage, None, None, t.key)
        if t.version == 0:
            second.add(copy)
        else:
            copy.left, copy.speed, copy.since, copy.end, copy.version = t.left, t.speed, t.since, t.end, t.version
            second.adopt(copy)
        made[t.key[0]] = copy
    while done := second.next_completions():
        seen.append((second.now, [t.key for t in done]))
    return [t.end for t in made], seen


@st.composite
def two_halves(draw):
    """Two halves of transfers on links of their own (the first half's links come first), and how many
    rounds of completions each runs alone before the handover."""
    links = [draw(st.integers(1, 3)) for _ in range(2)]
    capacity = draw(st.lists(st.sampled_from([1, 3, 10**9, 2**53 + 1]), min_size=sum(links), max_size=sum(links)))
    halves = []
    for h, base in ((0, 0), (1, links[0])):
        usage = st.lists(st.tuples(st.integers(base, base + links[h] - 1), st.sampled_from([0, 1, 2, 10**9])),
                         max_size=3).map(tuple)
        start = st.sampled_from([0.0, 0.25, 0.5, 1.0]) | st.floats(0.0, 4.0)
        duration = st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0]) | st.floats(1e-9, 4.0)
        halves.append(draw(st.lists(st.tuples(start, duration, usage), max_size=8)))
    return capacity, halves, [draw(st.integers(0, 10)) for _ in range(2)]


@pytest.mark.parametrize("twins", TWINS)
@settings(max_examples=150, deadline=None)
@given(case=two_halves())
def test_a_handover_between_schedulers_ends_every_transfer_as_one_scheduler_does(twins, case):
    """Links of one half carry nothing of the other's, so each half's transfers end as on one scheduler
    wherever each half stopped: the handover keeps every end to the bit."""
    capacity, halves, rounds = case
    ends, _ = _handover(twins, capacity, halves, rounds)
    together, _ = _handover(twins, capacity, [[], halves[0] + halves[1]], [0, 0])
    assert ends == together


@needs_c
@settings(max_examples=100, deadline=None)
@given(case=two_halves())
def test_the_c_scheduler_hands_over_as_the_python_one(case):
    assert repr(_handover(_c_twins(), *case)) == repr(_handover((PythonTransfer, PythonScheduler), *case))


# ---- a split step's parting (run/split_parting.py): completions never past a horizon nor onto barred links

def _paused(twins, capacity, transfers, pauses):
    """Add `transfers`, then for each (offset, barred links) of `pauses` take completions up to `now` +
    offset with those links barred, each until it returns nothing; then run to the end. Returns each
    transfer's fields and every round's (instant, keys)."""
    transfer_type, scheduler_type = twins
    scheduler = scheduler_type(list(capacity))
    made = [transfer_type(start, duration, usage, None, None, (n,)) for n, (start, duration, usage) in
            enumerate(transfers)]
    for transfer in made:
        scheduler.add(transfer)
    seen = []
    for offset, links in pauses:
        barred = bytes(1 if link in links else 0 for link in range(len(capacity))) if links else b""
        horizon = scheduler.now + offset
        while done := scheduler.completions_until(horizon, barred):
            assert scheduler.now <= horizon
            seen.append((scheduler.now, [t.key for t in done]))
        assert scheduler.now <= horizon
    while done := scheduler.next_completions():
        seen.append((scheduler.now, [t.key for t in done]))
    return [(t.start, t.end, t.left, t.speed, t.since, t.version) for t in made], seen


@st.composite
def paused_runs(draw):
    capacity, halves, _ = draw(two_halves())
    pauses = st.tuples(st.sampled_from([0.0, 0.25, 1.0, float("inf")]) | st.floats(0.0, 4.0),
                       st.sets(st.integers(0, len(capacity) - 1), max_size=2))
    return capacity, halves[0] + halves[1], draw(st.lists(pauses, max_size=4))


@pytest.mark.parametrize("twins", TWINS)
@settings(max_examples=150, deadline=None)
@given(case=paused_runs())
def test_completions_paused_at_a_horizon_or_a_barred_link_end_every_transfer_as_without(twins, case):
    """Stopping at a horizon or before a start on a barred link only pauses the run: every end, and every
    batch of ends, is the run's without pauses."""
    capacity, transfers, pauses = case
    assert _paused(twins, capacity, transfers, pauses) == _paused(twins, capacity, transfers, [])


@needs_c
@settings(max_examples=100, deadline=None)
@given(case=paused_runs())
def test_the_c_scheduler_pauses_as_the_python_one(case):
    assert repr(_paused(_c_twins(), *case)) == repr(_paused((PythonTransfer, PythonScheduler), *case))


@pytest.mark.parametrize("twins", TWINS)
def test_completions_until_names_a_barred_mask_of_the_wrong_length(twins):
    _, scheduler_type = twins
    with pytest.raises(ValueError, match="barred has 1 bytes for 2 links"):
        scheduler_type([1, 1]).completions_until(1.0, b"\x01")
