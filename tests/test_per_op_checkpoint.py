"""torchtitan's per-op selective activation checkpointing (`workload.per_op_checkpoint`, `Model.forward(
selective_recompute="op")`, hybrid's `recompute="op"`): the bytes a layer keeps and the FLOPs its backward
runs again, derived by hand for one small Llama-style layer, and hybrid runs with FSDP and TP under it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dist_lib import StrategyError, TensorError, Workload, simulate
from dist_lib.costs import compute as costs
from dist_lib.hardware.devices import DEVICES
from dist_lib.run.recording import record
from dist_lib.run.replay import replay

HYBRID = str(Path(__file__).resolve().parent.parent / "strategies" / "hybrid.py")
# a Llama block as torchtitan builds it: h 256, 4 query heads of 64 (q 256), 2 key/value heads (kv 128),
# SwiGLU of width f 512, sequence 128
LLAMA = Workload("tiny-llama", 2, 256, 4, 128, 0, kv_heads=2, ffn_hidden=512, mlp="swiglu", norm="rmsnorm",
                 position="rotary", tied_embeddings=False, bias=False, dropout=False, attention="flash2")
A100 = DEVICES["A100-80GB"]


def test_kept_bytes_are_the_saved_matmul_and_attention_outputs():
    """Per token at t = 1: wq's output 2q = 512, wv's 2kv = 256, w1's 2f = 1024, SDPA's output 2q = 512 and its
    fp32 log-sum-exp 4 x 4 heads = 16: 2320 bytes, 296,960 for 128 tokens (wk, wo, w3 and w2's outputs not kept).
    At t = 2 with sequence parallelism: (512 + 256 + 1024 + 512) / 2 + 16 / 2 + the attention's reduce-scatter
    output 2h / 2 = 256: 1416 bytes, less the half of the 2h-byte input the strategy's whole copy holds beyond the
    checkpoint's shard (256): 1160 a token, 148,480."""
    assert LLAMA.stash_bytes(0, recompute="op") == 296_960
    assert LLAMA.stash_bytes(0, 2, recompute="op", sequence_parallel=True) == 148_480
    # between keeping everything and keeping nothing
    assert LLAMA.stash_bytes(0, recompute="full") < LLAMA.stash_bytes(0, recompute="op") < LLAMA.stash_bytes(0)


def test_recompute_flops_are_the_unsaved_gemms():
    """Per sample at t = 1, wk 2 x 128 x 128 x 256 = 8,388,608, w3 2 x 128 x 512 x 256 = 33,554,432 and wo
    2 x 128 x 256 x 256 = 16,777,216: 58,720,256. With t = 2 and sequence parallelism the saved reduce-scatter
    output stands in for wo: (8,388,608 + 33,554,432) / 2 = 20,971,520."""
    plain = costs.compute_flops(LLAMA, "backward", 0, 1)
    assert costs.compute_flops(LLAMA, "backward", 0, 1, recompute="op") - plain == 58_720_256
    plain2 = costs.compute_flops(LLAMA, "backward", 0, 1, 2)
    assert costs.compute_flops(LLAMA, "backward", 0, 1, 2, recompute="op", sequence_parallel=True) - plain2 \
        == 20_971_520


def test_recompute_time_is_the_unsaved_gemms_and_memory_bound_kernels():
    """The GEMMs by shape (tokens x N x K: wk 128 x 128 x 256, w3 128 x 512 x 256, wo 128 x 256 x 256) and the
    forward's memory-bound traffic but the last residual add's: two RMSNorms 8h and one residual add 6h
    replicated (14 x 256 = 3584), SwiGLU 6f = 3072, the contiguous copy 4q = 1024 and the rotary 4(q + kv) = 1536
    (5632): 9216 bytes a token, 1,179,648 for the sample."""
    gemms = sum(costs.gemm_time(A100, m, n, k) for m, n, k in ((128, 128, 256), (128, 512, 256), (128, 256, 256)))
    expected = gemms + 1_179_648 / A100.hbm_bandwidth
    assert costs.recompute_time(A100, LLAMA, 0, 1, recompute="op") == pytest.approx(expected)


def test_model_forward_keeps_the_saved_bytes_and_backward_reruns_the_rest():
    seen = {}

    async def train(model):
        w, _ = model.load_weights(0)
        x = model.get_input_activation([0])
        before = model.memory_bytes
        y = model.forward(0, x, w, selective_recompute="op")
        seen["stash"] = model.memory_bytes - before - LLAMA.activation_bytes()  # minus the output
        w1, _ = model.load_weights(1)
        _, grad = model.backward(1, y, model.loss(model.forward(1, y, w1)), w1)
        model.backward(0, x, grad, w)

    result = simulate(train, "1xA100-80GB", LLAMA, 1, check=False)
    assert seen["stash"] == 296_960
    back = next(e for e in result.events if e.op == "backward" and e.layer == 0)
    assert back.detail == "per-op"
    assert back.end - back.start == pytest.approx(costs.backward_time(A100, LLAMA, 0, 1)
                                                  + costs.recompute_time(A100, LLAMA, 0, 1, recompute="op"))
    assert back.flops == pytest.approx(costs.compute_flops(LLAMA, "backward", 0, 1) + 58_720_256)


@pytest.mark.parametrize("options", [dict(dp=4, tp=1, fsdp=True), dict(dp=2, tp=2, fsdp=True, sequence_parallel=True),
                                     dict(dp=2, tp=2, framework="torchtitan", fp8="tensorwise")])
def test_hybrid_runs_correct_between_no_and_full_recompute(options):
    """With FSDP, and with TP and sequence parallelism (FP8 tensorwise as torchtitan runs it): correct, and its
    peak memory and step time lie between keeping everything and recomputing every layer."""
    cluster, work = "1x4xH100-80GB", Workload.load("llama-3-8b:layers=2,seq=1024,vocab=4096")
    runs = {r: simulate(HYBRID, cluster, work, 8, pp=1, recompute=r, **options) for r in (False, "op", True)}
    assert all(result.correct for result in runs.values()), [r.problems for r in runs.values()]
    assert runs[True].peak_memory_bytes < runs["op"].peak_memory_bytes < runs[False].peak_memory_bytes
    assert runs[False].time_s < runs["op"].time_s < runs[True].time_s
    if options["tp"] > 1:  # the recompute's two all-gathers of b*s*h per layer and microbatch
        gathers = {r: sum(e.op == "all_gather" and e.rank == 0 for e in runs[r].events) for r in (False, "op")}
        # 2 all-gathers x 2 layers x 4 microbatches (4 samples a replica, 1 a microbatch) on rank 0 (the replicas
        # fold: the events are the representatives')
        assert gathers["op"] - gathers[False] == 2 * 2 * 4
    _, programs = record(HYBRID, cluster, work, 8, pp=1, recompute="op", **options)
    replayed = replay(programs, cluster, work, 8)
    assert replayed.correct and replayed.time_s == runs["op"].time_s


def test_what_is_not_modelled_is_refused_by_name():
    cluster, llama = "1x4xH100-80GB", "llama-3-8b:layers=2,seq=1024,vocab=4096"
    with pytest.raises(StrategyError, match="tp=2 needs sequence_parallel=True"):
        simulate(HYBRID, cluster, llama, 8, dp=2, pp=1, tp=2, recompute="op")
    with pytest.raises(StrategyError, match="mlp is 'gelu'"):
        simulate(HYBRID, cluster, "gpt-125m:layers=2,vocab=4096", 8, dp=4, pp=1, recompute="op")
    with pytest.raises(StrategyError, match="without context parallelism"):
        simulate(HYBRID, cluster, llama, 8, dp=2, pp=1, cp=2, kv_exchange="all_gather", recompute="op")
    with pytest.raises(StrategyError, match="exclude each other"):
        simulate(HYBRID, cluster, llama, 8, dp=4, pp=1, recompute="op", selective_recompute=True)
    with pytest.raises(StrategyError, match="recompute must be True, False or 'op'"):
        simulate(HYBRID, cluster, llama, 8, dp=4, pp=1, recompute="selective")

    async def train(model):
        w, _ = model.load_weights(0)
        model.forward(0, model.get_input_activation([0]), w, selective_recompute="op")

    with pytest.raises(TensorError, match=r"forward\(layer 0\): selective_recompute='op' .* mlp is 'gelu'"):
        simulate(train, "1xA100-80GB", "toy", 1, check=False)
