"""Frameworks as named behaviours (`hybrid`'s `framework` option, `strategies/_frameworks.py`): a record of
option defaults, each the framework's own; an option the run sets differently wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from dist_lib import StrategyError, Workload, simulate

HYBRID = str(Path(__file__).resolve().parent.parent / "strategies" / "hybrid.py")
RUN = ("1x8xH100-80GB", "gpt-1.3b:layers=8", 16)


def test_a_framework_is_its_options():
    named = simulate(HYBRID, *RUN, dp=4, pp=1, tp=2, sequence_parallel=True, framework="megatron-core-2024")
    spelled = simulate(HYBRID, *RUN, dp=4, pp=1, tp=2, sequence_parallel=True, distributed_optimizer=True,
                       overlap_param_gather=True)
    assert named.correct and named.time_s == spelled.time_s and named.memory_bytes == spelled.memory_bytes
    old = simulate(HYBRID, *RUN, dp=4, pp=1, tp=2, framework="megatron-lm-2021")
    assert old.time_s == simulate(HYBRID, *RUN, dp=4, pp=1, tp=2, overlap_grad_reduce=False,
                                  async_tp_allreduce=False).time_s


def test_an_option_the_run_sets_wins_over_the_framework():
    mine = simulate(HYBRID, *RUN, dp=8, pp=1, tp=1, framework="torchtitan", reshard_after_forward=False)
    assert mine.time_s == simulate(HYBRID, *RUN, dp=8, pp=1, tp=1, fsdp=True, reshard_after_forward=False).time_s


def test_an_unknown_framework_names_the_known_ones():
    with pytest.raises(StrategyError, match="framework must be one of megatron-lm-2021, megatron-core-2024"):
        simulate(HYBRID, *RUN, dp=8, pp=1, tp=1, framework="jax")


def test_an_option_passed_at_hybrids_own_default_still_wins():
    """megatron-lm-2021 turns overlap_grad_reduce off; passed as True (hybrid's own default) it stays on, so the
    run is the plain one with only the framework's other differing option (the late TP all-reduce)."""
    mine = simulate(HYBRID, *RUN, dp=4, pp=1, tp=2, framework="megatron-lm-2021", overlap_grad_reduce=True)
    assert mine.time_s == simulate(HYBRID, *RUN, dp=4, pp=1, tp=2, async_tp_allreduce=False).time_s
    assert mine.time_s != simulate(HYBRID, *RUN, dp=4, pp=1, tp=2, framework="megatron-lm-2021").time_s


def test_distributed_optimizer_passed_off_keeps_the_optimizer_state_whole():
    """megatron-core-2024 with distributed_optimizer=False (and so overlap_param_gather=False): every rank keeps
    all 12 bytes of fp32 master weight and Adam moments a parameter of its TP slice, where the framework's
    default keeps 1/dp of them: the peak differs by 12 x (1 - 1/4) bytes a parameter of the rank's slice."""
    named = simulate(HYBRID, *RUN, dp=4, pp=1, tp=2, framework="megatron-core-2024")
    whole = simulate(HYBRID, *RUN, dp=4, pp=1, tp=2, framework="megatron-core-2024", distributed_optimizer=False,
                     overlap_param_gather=False)
    assert whole.correct and whole.time_s == simulate(HYBRID, *RUN, dp=4, pp=1, tp=2).time_s
    model = Workload.parse(RUN[1])
    slice_params = sum(model.layer_params(layer) for layer in range(model.num_layers)) / 2
    assert max(whole.memory_bytes) - max(named.memory_bytes) == 12 * 0.75 * slice_params


def test_none_is_not_given_and_a_wrong_type_is_named():
    assert simulate(HYBRID, *RUN, dp=8, pp=1, tp=1, fsdp=None).time_s == simulate(HYBRID, *RUN, dp=8, pp=1).time_s
    with pytest.raises(StrategyError, match="overlap_grad_reduce must be True or False .* got 'yes'"):
        simulate(HYBRID, *RUN, dp=8, pp=1, tp=1, overlap_grad_reduce="yes")
