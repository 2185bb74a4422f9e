"""A forward of samples its layer has already forwarded on the rank is a recompute (`RankState.seen_before`,
whose record is a mask or the bounds of one run of samples; the C forward keeps the same record)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dist_lib import simulate
from dist_lib.engine.rank_state import RankState
from dist_lib.hardware.cluster import Cluster


def test_forwards_in_and_out_of_order_are_told_apart_from_recomputes():
    # samples of each forward of layer 0, and whether each is a repeat of samples forwarded before
    forwards = [([2, 3], False),  # the first: one run, 2..3
                ([4], False),  # the run goes on: 2..4
                ([3], True),  # inside the run
                ([0, 1], False),  # before the run: a mask from here on, 0..4
                ([1, 2], True),
                ([6, 8], False),  # two runs of their own
                ([5, 6], False),  # 6 was forwarded, 5 was not: all of them are not
                ([5, 6, 8], True)]

    async def train(model):
        weight = model.load_weights(0)[0]
        for samples, _ in forwards:
            model.forward(0, model.get_input_activation(samples), weight, stash=False)

    result = simulate(train, "1xA100-80GB", "toy:layers=1", 9, check=False)
    details = [e[11] for e in result.raw_events if e[1] == "forward"]
    assert details == ["recompute" if repeat else "" for _, repeat in forwards]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.integers(0, 70), st.integers(1, 4)).map(lambda t: range(t[0], t[0] + t[1])),
                          st.sets(st.integers(0, 75), min_size=1, max_size=5)), min_size=1, max_size=25))
def test_a_repeat_is_a_forward_of_samples_all_forwarded_before(forwards):
    state = RankState(0, Cluster.parse("1xA100-80GB"), 2, False)
    seen: set[int] = set()
    for samples in forwards:
        mask = sum(1 << i for i in set(samples))
        assert state.seen_before(0, 1, mask) == (set(samples) <= seen)
        seen |= set(samples)
    assert state.forwarded[0][0] == 0  # the other layer's record is its own
