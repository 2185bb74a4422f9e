"""Eager PyTorch's memory-bound kernels (`workload.eager_kernels`, a workload's `kernels=eager`): a torchtitan
Llama block's elementwise ops one by one, counted from its model code, timed at HBM bandwidth beside the same
GEMMs; refused for a layer the count is not about; simulated and replayed like any workload."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from dist_lib import Cluster, Workload, simulate
from dist_lib.costs import compute as costs
from dist_lib.errors import SpecError
from dist_lib.hardware.devices import DEVICES
from dist_lib.planner import plan
from dist_lib.planner.export import export
from dist_lib.planner.launch_import import from_torchtitan
from dist_lib.run.recording import record
from dist_lib.run.replay import replay
from dist_lib.workload import per_op_checkpoint as per_op
from dist_lib.workload.eager_kernels import eager_bytes_per_token

HYBRID = str(Path(__file__).resolve().parent.parent / "strategies" / "hybrid.py")
H100 = DEVICES["H100-80GB"]
H, Q, KV, F = 4096, 32 * 128, 8 * 128, 14336  # Llama 3 8B: hidden, query and key/value widths, SwiGLU width

# RMSNorm forward: to fp32 2+4, pow 4+4, mean 4, times rsqrt 4+4, to bf16 4+2, times weight 2+2 = 36 (x h);
# backward: dy*w 2+2, dy*y 2+2+2 and its token sum 2, to fp32 2+4, grad*rsqrt 4+4, its row-sum product 4+4+4
# and sum 4, mean's expanded gradient 4, pow's x.pow(1) 4+4, 2*that 4+4, grad*that 4+4+4, the two gradients
# added 4+4+4, to bf16 4+2 = 92 (x h). Two norms, two residual adds (6h each, or their forks' gradient adds).
FORWARD_REPLICATED = 2 * 36 * H + 2 * 6 * H
BACKWARD_REPLICATED = 2 * 92 * H + 2 * 6 * H
# rotary on Q and K: to fp32 2+4, complex product 4+4, to bf16 4+2 = 20 an element, both ways; repeat_kv's copies
# of K and V to all query heads (2kv + 2q each), or their sums back; the contiguous attention output 4q;
# SwiGLU silu 2+2 and product 2+2+2 = 10f forward, the product's two gradients 6f each and silu's 6f = 18f.
FORWARD_SPLIT = 10 * F + 4 * Q + 20 * (Q + KV) + (2 * KV + 2 * Q) * 2
BACKWARD_SPLIT = 18 * F + 4 * Q + 20 * (Q + KV) + (2 * Q + 2 * KV) * 2
# fused (`architecture.elementwise_bytes_per_token`): norms 4h, adds 6h; SwiGLU 6f, copy 4q, rotary 4(q + kv)
FUSED_FORWARD = 2 * 4 * H + 2 * 6 * H + 6 * F + 4 * Q + 4 * (Q + KV)


def test_the_eager_block_counts_each_kernel_of_the_model_code():
    eager = Workload.parse("llama-3-8b:kernels=eager")
    assert eager_bytes_per_token(eager, backward=False) == (FORWARD_REPLICATED, FORWARD_SPLIT, 0)
    assert eager_bytes_per_token(eager, backward=True) == (BACKWARD_REPLICATED, BACKWARD_SPLIT, 0)
    s = eager.seq_len
    assert eager.elementwise_bytes() == s * (FORWARD_REPLICATED + FORWARD_SPLIT)
    # TP 8 with sequence parallelism splits both parts; without it the norms and adds stay whole
    assert eager.elementwise_bytes(8, True, backward=True) == s * (BACKWARD_REPLICATED + BACKWARD_SPLIT) / 8
    assert eager.elementwise_bytes(8) == s * (FORWARD_REPLICATED + FORWARD_SPLIT / 8)
    # per-op checkpointing runs the forward's kernels again but the last residual add
    assert per_op.recomputed_elementwise_bytes_per_token(eager) == (FORWARD_REPLICATED - 6 * H, FORWARD_SPLIT)


def test_eager_adds_its_extra_traffic_at_hbm_bandwidth_and_nothing_else():
    fused, eager = Workload.parse("llama-3-8b"), Workload.parse("llama-3-8b:kernels=eager")
    assert fused.elementwise_bytes() == fused.seq_len * FUSED_FORWARD
    extra = eager.seq_len * (FORWARD_REPLICATED + FORWARD_SPLIT - FUSED_FORWARD) / H100.hbm_bandwidth
    delta = costs.forward_time(H100, eager, 0, 1) - costs.forward_time(H100, fused, 0, 1)
    assert delta == pytest.approx(extra)
    assert costs.backward_weight_time(H100, eager, 0, 1) == costs.backward_weight_time(H100, fused, 0, 1)


@pytest.mark.parametrize("spec, message", [
    ("gpt-125m:kernels=eager", "kernels 'eager' counts eager PyTorch's kernels of a Llama block .* mlp is 'gelu'"),
    ("llama-3-8b:kernels=eager,attention=unfused", "attention is 'unfused'"),
    ("mixtral-8x7b:kernels=eager", "mixture-of-experts"),
    ("llama-3-8b:kernels=jit", "kernels must be one of fused, eager"),
])
def test_a_layer_the_count_is_not_about_is_refused_in_one_line(spec, message):
    with pytest.raises(SpecError, match=message):
        Workload.parse(spec)


def test_an_eager_run_is_slower_and_the_grader_replays_it():
    cluster, spec = "1x4xH100-80GB", "llama-3-8b:layers=4,seq=1024,vocab=8192"
    options = dict(dp=2, pp=1, tp=2, recompute="op", framework="torchtitan")
    fused = simulate(HYBRID, cluster, Workload.parse(spec), 8, **options)
    eager_work = Workload.parse(spec + ",kernels=eager")
    eager = simulate(HYBRID, cluster, eager_work, 8, **options)
    assert eager.correct and eager.time_s > fused.time_s
    _, programs = record(HYBRID, cluster, eager_work, 8, **options)
    replayed = replay(programs, cluster, eager_work, 8)
    assert replayed.correct and replayed.time_s == eager.time_s


def test_torchtitan_export_says_compile_and_the_import_reads_it_back():
    """torchtitan v0.2.2's `[compile] enable` (config/job_config.py, default false): on for fused kernels, off for
    eager ones; read back as the workload's kernels, and refused off for a layer the eager count is not about."""
    cluster = Cluster.load("1x8xH100-80GB")
    for kernels in ("fused", "eager"):
        workload = Workload.load(f"llama-3-8b:layers=4,kernels={kernels}")
        best = plan(cluster, workload, 32, framework="torchtitan", top=0).best.plan
        text = export(best, "torchtitan", workload, cluster).settings
        assert tomllib.loads(text)["compile"] == {"enable": kernels == "fused", "components": ["model", "loss"]}
        assert from_torchtitan(text, Workload.load("llama-3-8b:layers=4"), 8).workload.kernels == kernels
    config = {"compile": {"enable": True, "components": ["loss"]}, "activation_checkpoint": {"mode": "none"}}
    assert from_torchtitan(config, Workload.load("llama-3-8b:layers=4"), 8).workload.kernels == "eager"
    with pytest.raises(SpecError, match="compile without the model .* workload gpt-125m: mlp is 'gelu'"):
        from_torchtitan({"compile": {"enable": False}, "activation_checkpoint": {"mode": "none"}},
                        Workload.load("gpt-125m"), 8)
