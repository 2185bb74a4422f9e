"""Frameworks as named behaviours (`hybrid`'s `framework` option, `strategies/_frameworks.py`): a record of
option defaults, each the framework's own; an option the run sets differently wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from dist_lib import StrategyError, simulate

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
