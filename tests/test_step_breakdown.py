"""benchmarks/step_breakdown.py splits a simulated step into kinds of work that add up to the step."""

from __future__ import annotations

import pytest

from benchmarks.step_breakdown import KINDS, breakdown, head_split, layer_split
from dist_lib import Workload, simulate
from dist_lib.costs import compute as costs
from dist_lib.hardware.devices import DEVICES

A100 = DEVICES["A100-80GB"]
SMALL = Workload.parse("gpt-125m:layers=4,vocab=8192")


def test_the_kinds_add_up_to_the_simulated_step():
    result = simulate("strategies/hybrid.py", "1x4xA100-80GB", SMALL, 8, pp=2, tp=2, microbatch_size=2,
                      sequence_parallel=True, selective_recompute=True)
    parts = breakdown(result, A100, SMALL, 2, 2, True, "selective")
    assert set(parts) == set(KINDS)
    assert sum(parts.values()) == pytest.approx(result.time_s)
    assert all(v >= 0 for v in parts.values())


def test_a_layer_split_is_the_cost_model_s_own_pass_times():
    split = layer_split(A100, SMALL, 2, 1, False, "none")
    passes = (costs.forward_time(A100, SMALL, 0, 2) + costs.backward_time(A100, SMALL, 0, 2))
    assert sum(split.values()) == pytest.approx(passes)  # no host-time floor on gpt-125m
    head = head_split(A100, SMALL, 2, 1)
    assert sum(head.values()) == pytest.approx(costs.loss_time(A100, SMALL, 2, 1))
