"""torchtitan's published H100 set (benchmarks/fidelity_torchtitan.py): the rows' arithmetic, the plans they run,
and the device they run on."""

from __future__ import annotations

import pytest

from benchmarks.fidelity_torchtitan import DEVICE, TORCHTITAN, plan, predict, torchtitan_split, workload
from dist_lib.hardware.devices import DEVICES, GB

ROWS = {run.name: run for run in TORCHTITAN}


def test_split_is_torchtitans_generated_split():
    # 126 layers over 8 stages: 15 each, the 6 left over to stages 1-6, the last takes the rest (15)
    assert torchtitan_split(126, 8) == [15, 16, 16, 16, 16, 16, 16, 15]
    # over 16 (interleaved, two a rank): 7 each, 14 left over to stages 1-14, the last 7
    assert torchtitan_split(126, 16) == [7] + [8] * 14 + [7]
    assert torchtitan_split(32, 8) == [4] * 8


def test_measured_step_is_the_steps_tokens_over_the_published_rate():
    run = ROWS["T4 70B 2D"]  # 32 FSDP ranks x local batch 16 x 8192 tokens, 829 tokens/s on each of 256 GPUs
    assert run.measured_s == pytest.approx(32 * 16 * 8192 / (829 * 256))
    cp = ROWS["T2 8B cp2"]  # the CP ranks share a sequence: 4 FSDP ranks x 1 x 65536 tokens over 8 GPUs
    assert cp.measured_s == pytest.approx(4 * 65536 / (2540 * 8))


def test_pipelined_rows_run_stages_microbatches_of_torchtitans_split():
    options = plan(ROWS["T5 405B interleaved"])
    assert options["microbatch_size"] == 4 and options["chunks"] == 2  # 32 local samples in 8 microbatches
    assert options["partition"] == torchtitan_split(126, 16)
    flat = plan(ROWS["T4 70B 2D+asyncTP"])
    assert flat["microbatch_size"] == 16 and flat["tp_comm_overlap"] and flat["recompute"]
    assert flat["framework"] == "torchtitan" and "partition" not in flat


def test_context_parallel_rows_run_fsdp_over_dp_x_cp_with_pytorchs_context_parallel_sdpa():
    """Table 2's FSDP x CP rows: dp = 8 / cp FSDP ranks, each replica's cp ranks sharing its sequences, PyTorch's
    context-parallel SDPA with K/V all-gathered (torchtitan's default rotate method); Table 6's the same with TP 8,
    PP 8 and async TP."""
    options = plan(ROWS["T2 8B cp4"])
    assert (options["dp"], options["cp"], options["kv_exchange"], options["fp8"]) == (2, 4, "torch_all_gather",
                                                                                      "tensorwise")
    assert "cp" not in plan(ROWS["T2 8B cp1"])
    table6 = plan(ROWS["T6 405B cp4"])
    assert (table6["dp"], table6["cp"], table6["tp"], table6["pp"], table6["tp_comm_overlap"]) == (2, 4, 8, 8, True)


def test_eager_rows_run_eager_kernels_and_rowwise_rows_the_rowwise_recipe():
    """Rows without torch.compile (Tables 1 and 3's plain rows, August 2024's bf16 row) run eager PyTorch's kernels
    (`kernels=eager`); the June 2025 rowwise rows torchao's rowwise recipe; the compiled rows neither."""
    for name in ("T1 8B FSDP", "T3 8B FSDP", "A24 405B bf16"):
        assert workload(ROWS[name]).endswith(",kernels=eager")
    assert "kernels" not in workload(ROWS["T1 8B +compile"])
    assert plan(ROWS["J25 8B rowwise asyncTP"])["fp8"] == "rowwise" and plan(ROWS["J25 70B rowwise"])["fp8"] == "rowwise"


def test_per_op_rows_run_torchtitans_per_op_checkpointing():
    """Table 1's and 3's rows and the June 2025 8B rows checkpoint per op (`recompute="op"`)."""
    for name in ("T1 8B FSDP", "T1 8B +compile", "T3 8B +compile+fp8", "J25 8B bf16 asyncTP", "J25 8B rowwise"):
        assert plan(ROWS[name])["recompute"] == "op"
    assert plan(ROWS["T4 70B 2D"])["recompute"] is True


def test_the_grand_teton_h100_is_the_sxm_with_its_hbm2e():
    device, sxm = DEVICES[DEVICE], DEVICES["H100-80GB"]
    assert device.hbm_bandwidth == 2400 * GB and device.memory_bytes == 96 * 2**30
    assert (device.peak_flops, device.fp8_flops, device.sms, device.max_efficiency) == \
        (sxm.peak_flops, sxm.fp8_flops, sxm.sms, sxm.max_efficiency)


@pytest.mark.slow
def test_a_pipelined_fsdp_tp_fp8_row_runs_correct():
    run = ROWS["T5 405B interleaved"]
    options = plan(run)
    from dist_lib import simulate
    from benchmarks.fidelity_torchtitan import HYBRID
    result = simulate(HYBRID, f"{run.gpus // 8}x8x{DEVICE}", workload(run), run.fsdp * run.local_batch,
                      check=True, enforce_memory=False, **options)
    assert result.correct
    assert predict(run).time_s == pytest.approx(result.time_s)


def test_the_h200_row_is_t3s_run_on_a_700_w_part():
    """Trainy's H200 run (torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md, 4 hosts): 8B, local
    batch 2 of 8,192 tokens, 10,938 tokens/s per GPU, so a step of 2 x 8192 / 10938 = 1.498 s; the same plan as
    T3's compiled Float8 row, on the catalog's H200 at its data-sheet clock."""
    run, t3 = ROWS["W25 8B H200 fp8"], ROWS["T3 8B +compile+fp8"]
    assert run.device == "H200-141GB" and DEVICES[run.device].sustained_clock == 1.0
    assert run.measured_s == pytest.approx(2 * 8192 / 10938)
    assert plan(run) == {**plan(t3), "dp": 32} and workload(run) == workload(t3)
