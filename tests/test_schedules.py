"""Schedule-correctness suite: every bundled strategy on random valid configurations (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from dist_lib import testing

STRATEGIES = ["ddp", "zero", "gpipe", "one_f_one_b", "deepspeed_1f1b", "interleaved", "zero_bubble", "hybrid",
              "hetero", "planned"]


@pytest.mark.parametrize("name", STRATEGIES)
def test_random_valid_configurations_are_correct_and_sound(name):
    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(testing.setups(name))
    def check(setup):
        result = testing.run(setup)  # raises on an incorrect step, a deadlock or a malformed trace
        assert result.correct
        assert testing.schedule_problems(result) == [], setup

    check()


# nodes of different sizes and devices, and nodes whose GPUs share one NIC
UNEVEN = ("1x2xA100-80GB+2x1xT4", "2x2xT4:nics=1x1.25", "1x4xV100-32GB:nics=1x1.25+1x2xA10")


@pytest.mark.parametrize("name", ["hybrid", "hetero", "planned"])
def test_random_configurations_on_uneven_clusters_are_correct_and_sound(name):
    @settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(testing.setups(name, clusters=UNEVEN))
    def check(setup):
        result = testing.run(setup)
        assert result.correct
        assert testing.schedule_problems(result) == [], setup

    check()


def test_invariant_checker_catches_a_backward_before_its_forward_order():
    """A hand-broken log: swap one rank's forward and backward times; the checker must notice."""
    result = testing.run(testing.Setup("one_f_one_b", "1x2xA100-80GB", "toy:layers=2", 2, {"pp": 2}))
    events = list(result.raw_events)
    i = next(k for k, e in enumerate(events) if e[1] == "forward" and e[0] == 0)
    j = next(k for k, e in enumerate(events) if e[1] == "backward" and e[0] == 0)
    fwd, bwd = events[i], events[j]
    events[i] = fwd[:3] + (bwd[3] + 1.0, bwd[4] + 1.0) + fwd[5:]  # the forward now runs after its backward
    result.raw_events, result._events = events, None
    problems = testing.schedule_problems(result)
    assert any("before its forward" in p for p in problems)


def test_a_backward_joining_samples_follows_every_backward_of_the_next_layer_for_them():
    """Rank 0 runs layer 0 on both samples of a microbatch; ranks 1 and 2 run layer 1 on one each. Layer 0's
    backward follows both of layer 1's (sound), and the checker says so once either ends later."""
    stages = [{"ranks": [0], "tp": 1, "blocks": [[0, 1]], "shares": [2]},
              {"ranks": [1, 2], "tp": 1, "blocks": [[1, 2]], "shares": [1, 1]}]
    plan = {"stages": stages, "microbatch_size": 2, "microbatches": 1, "schedule": "gpipe"}
    result = testing.run(testing.Setup("planned", "2x2xA100-80GB", "toy:layers=2", 2, {"plan": plan}))
    assert testing.schedule_problems(result) == []
    events = list(result.raw_events)
    joined = next(e for e in events if e[1] == "backward" and e[0] == 0)
    assert joined[6] == 0b11
    k = next(k for k, e in enumerate(events) if e[1] == "backward" and e[0] == 2)
    assert events[k][6] == 0b10
    late = events[k]
    events[k] = late[:3] + (joined[3] + 1e-3, joined[3] + 2e-3) + late[5:]  # rank 2's now ends after rank 0's starts
    result.raw_events, result._events = events, None
    assert "rank 0: backward(layer 0) before the backward of layer 1 for all its samples" in \
        testing.schedule_problems(result)


def test_invariant_checker_catches_overlapping_compute():
    result = testing.run(testing.Setup("ddp", "1x2xA100-80GB", "toy:layers=2", 2, {"microbatch_size": 1}))
    events = list(result.raw_events)
    k = next(k for k, e in enumerate(events) if e[1] == "backward" and e[0] == 1)
    e = events[k]
    events[k] = e[:3] + (e[3] - 1e-3,) + e[4:]  # start 1 ms earlier: overlaps the op before it
    result.raw_events, result._events = events, None
    assert any("overlap" in p for p in testing.schedule_problems(result))
