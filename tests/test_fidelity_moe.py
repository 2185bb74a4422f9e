"""The Megatron-Bridge MoE fidelity set (benchmarks/fidelity_moe.py): its rows as published, the options each
becomes, and which rows hybrid can express (decided on a small probe; the full runs are the benchmark's)."""

import pytest

from benchmarks.fidelity_moe import (ROWS, BridgeRow, expressible, options, partition, refusal, run)
from dist_lib.errors import StrategyError


def _row(container, model):
    return next(r for r in ROWS if r.container == container and r.model == model)


def test_the_published_rows_and_the_step_time_they_imply():
    gpt_oss = _row("26.04.01", "gpt-oss-120b")
    assert (gpt_oss.gpus, gpt_oss.gbs, gpt_oss.pp, gpt_oss.ep, gpt_oss.dp) == (64, 1280, 4, 8, 16)
    assert gpt_oss.measured_s == pytest.approx(1280 * 4096 / (5824 * 64))  # 14.07 s
    qwen = _row("26.04.01", "qwen3-235b-a22b")
    assert (qwen.tp, qwen.pp, qwen.vp, qwen.ep, qwen.dp) == (2, 8, 4, 32, 16)
    assert {r.container for r in ROWS} == {"26.04.01", "26.02"} and len(ROWS) == 6


def test_options_follow_the_row():
    plan = options(_row("26.04.01", "qwen3-235b-a22b"))
    assert plan["schedule"] == "interleaved" and plan["chunks"] == 4 and plan["fp8"] == "tensorwise"
    assert plan["sequence_parallel"] and plan["distributed_optimizer"] and plan["overlap_param_gather"]
    assert plan["etp"] == 1  # the recipe's expert_tensor_parallel_size: EP 32 over the dp x tp = 32 ranks of a stage
    # 94 layers + embedding + loss = 96 places of 3 over 32 blocks (account_for_*_in_pipeline_split)
    assert plan["partition"] == [2] + [3] * 30 + [2] and sum(plan["partition"]) == 94
    gpt_oss = options(_row("26.04.01", "gpt-oss-120b"))
    assert gpt_oss["schedule"] == "1f1b" and "fp8" not in gpt_oss and "partition" not in gpt_oss
    assert partition(_row("26.04.01", "qwen3-30b-a3b"), 48) is None
    # the Qwen3-30B recipes' flex dispatcher with its HybridEP backend; the others' all-to-all
    assert options(_row("26.04.01", "qwen3-30b-a3b"))["moe_dispatcher"] == "hybridep"
    assert "moe_dispatcher" not in gpt_oss


def test_refusal_reads_the_strategys_reason_and_nothing_else():
    refused = StrategyError("rank 0: ValueError: ep=3 must divide dp (at _expert_stage.py:50 in build)")
    assert refusal(refused) == "ep=3 must divide dp"
    assert refusal(StrategyError("rank 0: KeyError: 'x' (at a.py:1 in f)")) is None


def test_a_row_hybrid_cannot_lay_out_is_listed_with_its_reason():
    odd = BridgeRow("test", "qwen3-30b-a3b", 16, "BF16", 64, 1, 4096, 1, 1, None, 3, 1000.0, 1.0)
    outcome = run(odd)
    assert outcome.time_s is None and "ep=3" in outcome.refused


def test_gpt_oss_runs_as_published_or_with_a_stated_substitution_only():
    published = options(_row("26.04.01", "gpt-oss-120b"))
    plan, refused, substituted = expressible(_row("26.04.01", "gpt-oss-120b"))
    assert plan is not None
    if substituted is None:
        assert refused is None and plan == published
    else:  # only the optimizer's settings differ, and the refusal named the one substituted
        label = {"parameter all-gather after the step": "overlap_param_gather",
                 "DDP for the distributed optimizer": "distributed_optimizer"}[substituted]
        assert label in refused
        changed = {k for k in published if plan[k] != published[k]}
        assert changed <= {"distributed_optimizer", "overlap_param_gather"} and changed


def test_an_fp8_row_is_run_as_published_or_refused_with_hybrids_reason():
    plan, refused, substituted = expressible(_row("26.04.01", "qwen3-30b-a3b"))
    if plan is None:
        assert refused and substituted is None
    else:
        assert plan.get("fp8") == "tensorwise"


def test_gpt_oss_rows_recompute_the_recipes_modules_and_the_qwen3_rows_none():
    # Megatron-Bridge perf_recipes/gpt_oss/h100/gpt_oss.py: recompute_modules = ["layernorm", "moe_act"]
    assert options(_row("26.04.01", "gpt-oss-120b"))["recompute_modules"] == ["layernorm", "moe_act"]
    assert "recompute_modules" not in options(_row("26.04.01", "qwen3-30b-a3b"))
