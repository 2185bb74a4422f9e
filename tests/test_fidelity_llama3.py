"""The Llama 3 405B set (benchmarks/fidelity_llama3.py): Table 4's layouts as the paper states them, the step a
row implies, and that the 8,192-GPU layout folds to one replica and runs correct."""

from __future__ import annotations

from benchmarks.fidelity_llama3 import HYBRID, LLAMA3_TABLE4, TOKENS_PER_BATCH
from dist_lib import simulate

ROWS = {run.name: run for run in LLAMA3_TABLE4}


def test_layouts_are_table_4s():
    """TP 8 x PP 16 everywhere; DP 64 and 128 without CP, 8 with CP 16; 16M tokens a batch: 32, 16 and 16
    sequences a data-parallel group."""
    assert [(r.gpus, r.dp, r.cp, r.sequences // r.dp) for r in LLAMA3_TABLE4] == \
        [(8192, 64, 1, 32), (16384, 128, 1, 16), (16384, 8, 16, 16)]
    for run in LLAMA3_TABLE4:
        assert run.tp * run.pp * run.cp * run.dp == run.gpus and run.sequences * run.seq == TOKENS_PER_BATCH
        options = run.options()
        # one layer fewer on the first and last stages, two virtual stages a rank: 3 + 30 x 4 + 3 = 126 layers
        assert len(options["partition"]) == run.pp * options["chunks"] and sum(options["partition"]) == 126
        assert options["fsdp"] and options["reshard_after_forward"] is False
        assert run.workload.grad_bytes_per_element == 4 and run.workload.seq_len == run.seq
        # the paper's context parallelism all-gathers the keys and values (sec. 3.3.2)
        assert options.get("kv_exchange") == ("all_gather" if run.cp > 1 else None)


def test_the_measured_step_is_the_batch_flops_over_the_published_rate():
    run = ROWS["8192 GPUs cp1"]
    flops = run.workload.model_flops_per_sample()
    assert run.measured_s == 2048 * flops / (8192 * 430e12)
    # about 6 x 405e9 x 8192 FLOPs a sequence plus attention: a step of 12-13 s at 430 TFLOP/s
    assert 6 * 405e9 * 8192 < flops < 1.2 * 6 * 405e9 * 8192 and 12.0 < run.measured_s < 13.0


def test_the_8192_gpu_layout_folds_and_is_correct_on_a_cut():
    """The same options on a cut of the model (8 layers, 2 stages, 4 replicas): the replicas fold and the step
    is a correct one."""
    run = ROWS["8192 GPUs cp1"]
    options = dict(run.options(), pp=2, dp=4, partition=[1, 2, 2, 3])
    result = simulate(HYBRID, "8x8xH100-80GB", "llama-3-405b:layers=8,seq=1024", 16, **options)
    assert result.correct and result.representatives is not None
