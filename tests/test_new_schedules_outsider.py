"""Schedules written from the README alone (tests/outsider_schedules/): FSDP with explicit prefetch, DDP with
gradient accumulation and buckets on the last microbatch, a V-shaped pipeline, TP inside a node with DP across,
and hybrid-sharded DP. Each figure is derived by hand from the README's cost formulas and the device catalog
(A100-80GB: 312 TFLOP/s over 108 SMs at 0.75 of an SM's peak, HBM 2039 GB/s, NVLink3 300 GB/s at NCCL's 0.8
and 3.4 us a ring step, IB-HDR 25 GB/s and 14 us), on the toy workload (8 layers, s = h = 1024, 16 heads, no
vocabulary). Then each schedule broken the way a user would break it, and the error it gets."""

from __future__ import annotations

import re

import json
from pathlib import Path

import pytest

from dist_lib import simulate, testing, validate_trace
from dist_lib.errors import (CollectiveMismatchError, DeadlockError, OutOfMemoryError, StrategyError,
                             TensorError)

HERE = Path(__file__).parent / "outsider_schedules"
S = H = 1024  # toy: sequence and hidden
HEADS, LAYERS = 16, 8
MiB = 2**20

# ---- A100-80GB by hand ---------------------------------------------------------------------------------
SM_RATE = 312e12 / 108 * 0.75  # FLOP/s of one SM's K loop
HBM = 2039e9
STORE = 256 * 128 * 2 / HBM  # one 256x128 16-bit output tile written to HBM


def kloop(k: int) -> float:
    """One 256x128 tile's K loop: 2 * 256 * 128 * K FLOPs at one SM's rate."""
    return 2 * 256 * 128 * k / SM_RATE


def wave(k: int, tiles: int) -> float:
    """One wave: every tile's K loop side by side, then their stores (at most 108 tiles a wave)."""
    return kloop(k) + min(tiles, 108) * STORE


# one sample (1024 tokens), no TP: forward Y = X W of QKV (1024 x 3072, K 1024: 12 x 8 tiles), projection
# (1024 x 1024: 4 x 8), MLP up (1024 x 4096: 16 x 8 = 128 tiles, two waves), MLP down (1024 x 1024, K 4096);
# attention core per head: scores 1024 x 1024 (K 64) x 16 heads = 512 tiles in 5 waves, mix 1024 x 64 (K 1024)
# x 16 = 64 tiles; memory-bound kernels 22 sh + 20 sh + 9 a s^2 bytes (layernorms and residual adds, GeLU and
# the attention copy, softmax and dropout)
GEMMS_F = wave(1024, 96) + wave(1024, 32) + 2 * wave(1024, 108) + wave(4096, 32)
SCORES, MIX = 5 * wave(64, 108), wave(1024, 64)
F = GEMMS_F + SCORES + MIX + (42 * S * H + 9 * HEADS * S * S) / HBM
# backward: input gradients dX = dY W^T (QKV 1024 x 1024 K 3072, projection K 1024, MLP up K 4096, MLP down
# 1024 x 4096 K 1024 in two waves), the attention core's backward (scores + 3 mixes), memory-bound backward
# 38 sh + 42 sh + 11 a s^2; weight gradients dW = X^T dY (3072 x 1024, 1024 x 1024, 4096 x 1024 twice, K 1024)
B_INPUT = wave(3072, 32) + wave(1024, 32) + wave(4096, 32) + 2 * wave(1024, 108) + SCORES + 3 * MIX \
    + (80 * S * H + 11 * HEADS * S * S) / HBM
B_WEIGHT = wave(1024, 96) + wave(1024, 32) + 2 * 2 * wave(1024, 108)
B = B_INPUT + B_WEIGHT
LOSS = 5 * 2 * S * H / HBM  # no vocabulary: the final layernorm, forward and backward
PARAMS = 12 * H * H + 13 * H  # one layer
W_BYTES = 2 * PARAMS
ACT = 2 * S * H  # one sample's hidden states
STASH = S * H * (34 + 5 * HEADS * S / H) - ACT  # Korthikanti Table 2, less the input (its own tensor)


def update(params: float) -> float:
    return 42 * params / HBM  # Adam at 42 bytes a parameter over HBM


def ring(op: str, nbytes: float, p: int, bandwidth: float = 0.8 * 300e9, alpha: float = 3.4e-6) -> float:
    factor = 2 * (p - 1) / p if op == "all_reduce" else (p - 1) / p
    return factor * nbytes / bandwidth + (2 if op == "all_reduce" else 1) * (p - 1) * alpha


def run(name: str, cluster: str, batch: int, **options):
    result = simulate(str(HERE / f"{name}.py"), cluster=cluster, workload="toy", global_batch_size=batch, **options)
    assert result.correct
    assert testing.schedule_problems(result) == []
    return result


def durations(result, op: str, rank: int = 0) -> list[float]:
    return [e.end - e.start for e in result.events if e.rank == rank and e.op == op]


def test_hand_derived_layer_times_match_the_simulated_ops():
    result = run("ddp_accum", "1x4xA100", 8)
    assert durations(result, "forward") == pytest.approx([F] * 16, rel=1e-9)
    assert durations(result, "backward") == pytest.approx([B] * 16, rel=1e-9)
    assert durations(result, "loss") == pytest.approx([LOSS] * 2, rel=1e-9)
    assert durations(result, "update") == pytest.approx([update(PARAMS)] * 8, rel=1e-9)
    assert F == pytest.approx(415.59e-6, abs=0.01e-6) and B == pytest.approx(781.38e-6, abs=0.01e-6)


def test_fsdp_with_prefetch_hides_every_gather_but_the_first_of_each_pass(tmp_path):
    result = run("fsdp_prefetch", "1x4xA100", 8)
    gather = ring("all_gather", W_BYTES, 4)
    assert gather == pytest.approx(88.9264e-6, rel=1e-9)
    assert durations(result, "all_gather") == pytest.approx([gather] * 32, rel=1e-9)
    assert durations(result, "reduce_scatter") == pytest.approx([gather] * 8, rel=1e-9)
    # two microbatches of one sample on each rank: a gather before each pass is exposed, the other 7 hide
    # behind a layer's compute; the last reduce-scatter (layer 0) is exposed, then 8 updates of a quarter layer
    expected = 4 * gather + 16 * F + 2 * LOSS + 16 * B + gather + 8 * update(PARAMS / 4)
    assert result.time_s == pytest.approx(expected, rel=1e-9)
    assert result.compute_busy() == pytest.approx([16 * F + 2 * LOSS + 16 * B + 8 * update(PARAMS / 4)] * 4)
    # peak just after the last loss: 8 quarter-layer shards (weight and 12-byte optimizer state), the first
    # microbatch's 8 full gradients, the second's 8 stashes with their inputs, its output, its loss gradient
    # and two gathered layers (the one in use and the prefetched one)
    peak = 8 * PARAMS // 4 * 14 + 8 * W_BYTES + 8 * (STASH + ACT) + ACT + ACT + 2 * W_BYTES
    assert result.memory_bytes == [peak] * 4
    path = tmp_path / "fsdp.json"
    result.write_chrome_trace(path)
    assert validate_trace(path) == []
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "thread_name" and e["pid"] == 0}
    assert names == {"compute", "group 0-3"}
    top = max(v for e in events if e["ph"] == "C" and e["pid"] == 0 for v in e["args"].values())
    assert top * 2**30 == pytest.approx(peak, rel=1e-12)


def test_ddp_accumulates_and_all_reduces_buckets_only_on_the_last_microbatch():
    result = run("ddp_accum", "1x4xA100", 8)
    reduce = ring("all_reduce", W_BYTES, 4)
    assert reduce == pytest.approx(177.853e-6, abs=1e-9)
    assert durations(result, "all_reduce") == pytest.approx([reduce] * 8, rel=1e-9)
    # layer 0's all-reduce is exposed; layer 1's runs beside layer 0's update
    assert result.time_s == pytest.approx(2 * (8 * F + LOSS + 8 * B) + reduce + 8 * update(PARAMS), rel=1e-9)
    # peak at the second loss: full weights, optimizer, 8 accumulated gradients, 8 stashes and inputs, the
    # output, the new loss gradient and the first microbatch's last input gradient still referenced
    assert result.memory_bytes == [8 * PARAMS * (2 + 12) + 8 * W_BYTES + 8 * (STASH + ACT) + ACT + 2 * ACT] * 4


def test_ddp_across_nodes_takes_the_hierarchical_all_reduce():
    result = run("ddp_accum", "2x4xA100", 8, bucket_layers=8)
    # reduce-scatter and all-gather inside each node on NVLink, then 4 all-reduces of n/4 across the nodes
    # on each GPU's IB-HDR NIC: below the flat ring at the NICs' 4 x 25 GB/s
    hierarchical = 2 * ring("reduce_scatter", W_BYTES, 4) + ring("all_reduce", W_BYTES / 4, 2, 25e9, 14e-6)
    flat = 2 * 7 / 8 * W_BYTES / 100e9 + 12 * 3.4e-6 + 2 * 14e-6
    assert hierarchical == pytest.approx(457.777e-6, abs=1e-9) and hierarchical < flat
    assert durations(result, "all_reduce") == pytest.approx([hierarchical] * 8, rel=1e-9)


def test_tp_inside_a_node_and_dp_across_by_hand():
    result = run("tp_dp", "2x2xA100", 4)
    # one TP slice of 2: QKV 1024 x 1536 (48 tiles), projection K 512, MLP up 1024 x 2048 (64 tiles), MLP down
    # K 2048; 8 heads: scores 256 tiles in 3 waves, mix 32 tiles; memory-bound 22 sh replicated, 20 sh / 2 and
    # 9 a s^2 / 2. Backward: input gradients 1024 x 1024 (K 1536), 1024 x 512 (16 tiles), 1024 x 1024 (K 2048),
    # 1024 x 2048 (64 tiles); weight gradients 1024 x 1536, 512 x 1024 (16 tiles), 1024 x 2048, 2048 x 1024
    scores, mix = 3 * wave(64, 108), wave(1024, 32)
    f = wave(1024, 48) + wave(512, 32) + wave(1024, 64) + wave(2048, 32) + scores + mix \
        + (32 * S * H + 4.5 * HEADS * S * S) / HBM
    b_input = wave(1536, 32) + wave(1024, 16) + wave(2048, 32) + wave(1024, 64) + scores + 3 * mix \
        + (38 * S * H + 21 * S * H + 5.5 * HEADS * S * S) / HBM
    b_weight = wave(1024, 48) + wave(1024, 16) + wave(1024, 64) + wave(1024, 64)
    assert durations(result, "forward") == pytest.approx([f] * 16, rel=1e-9)
    assert durations(result, "backward") == pytest.approx([b_input + b_weight] * 16, rel=1e-9)
    # one all_reduce of a TP pass's partial sums is charged as Megatron-LM's two (attention and MLP); the
    # loss's input gradient as one
    tp_reduce = ring("all_reduce", ACT, 2)
    assert tp_reduce == pytest.approx(15.538e-6, abs=1e-9)
    tp = [e.end - e.start for e in result.events if e.rank == 0 and e.op == "all_reduce" and e.peers == (0, 1)]
    assert tp == pytest.approx(([2 * tp_reduce] * 8 + [tp_reduce] + [2 * tp_reduce] * 8) * 2, rel=1e-9)
    # the weight gradients (half a layer) go between the nodes on IB-HDR, one after the other with the updates
    dp_reduce = ring("all_reduce", W_BYTES / 2, 2, 25e9, 14e-6)
    assert dp_reduce == pytest.approx(531.849e-6, abs=1e-9)
    per_microbatch = 8 * (f + 2 * tp_reduce) + LOSS + tp_reduce + 8 * (b_input + b_weight + 2 * tp_reduce)
    assert result.time_s == pytest.approx(2 * per_microbatch + 8 * (dp_reduce + update(PARAMS / 2)), rel=1e-9)
    tp_stash = S * H * (10 + 24 / 2 + 5 * HEADS * S / (H * 2)) - ACT
    assert result.memory_bytes == [8 * PARAMS // 2 * 16 + 8 * (tp_stash + ACT) + ACT + 2 * ACT] * 4


def test_hybrid_sharded_dp_by_hand():
    result = run("hsdp", "2x4xA100", 16)
    gather = ring("all_gather", W_BYTES, 4)
    cross = ring("all_reduce", W_BYTES / 4, 2, 25e9, 14e-6)
    assert durations(result, "all_reduce") == pytest.approx([cross] * 8, rel=1e-9)
    # each microbatch: the gathers before each pass and the last reduce-scatter are exposed; then the 8
    # cross-node all-reduces of a quarter layer one after another, and the updates
    per_microbatch = 2 * gather + 8 * F + LOSS + 8 * B + gather
    assert result.time_s == pytest.approx(2 * per_microbatch + 8 * cross + 8 * update(PARAMS / 4), rel=1e-9)


def test_v_shaped_pipeline_busy_times_messages_and_memory():
    result = run("vshape", "1x4xA100", 4)
    message = 3.4e-6 + ACT / (0.8 * 300e9)
    # rank 1 sends 4 activations and 4 gradients each way (stages 1 and 6), never two at once
    assert durations(result, "send", 1) == pytest.approx([message] * 16, rel=1e-9)
    # each rank runs two layers (one stage at each end of the V) for the 4 microbatches; rank 0 the losses
    busy = [4 * 2 * (F + B) + 2 * update(PARAMS)] * 4
    busy[0] += 4 * LOSS
    assert result.compute_busy() == pytest.approx(busy, rel=1e-9)
    # a lower bound: one microbatch's way down and back up the 8 stages (12 messages between ranks: stages 3
    # and 4 are both on rank 3), then rank 0's updates; GPipe's order leaves more bubble than that
    assert result.time_s > 8 * F + LOSS + 8 * B + 12 * message + 2 * update(PARAMS)
    assert result.time_s >= max(busy)
    # rank 0's peak after its last forward: both layers' weights and optimizer, the 8 stashes and inputs of
    # its two stages, the 4 loss gradients kept for the backward, and the last output
    assert result.memory_bytes[0] == 2 * PARAMS * (2 + 12) + 8 * (STASH + ACT) + 4 * ACT + ACT
    # whatever order the ranks start in
    shuffled = simulate(str(HERE / "vshape.py"), cluster="1x4xA100", workload="toy", global_batch_size=4,
                        start_order_seed=3)
    assert (shuffled.time_s, shuffled.memory_bytes) == (result.time_s, result.memory_bytes)


def test_bidirectional_pipeline_two_copies_in_opposite_directions():
    """Copy A down the ranks, copy B up, the pair holding a stage all-reducing its gradients. Rank 0 awaits
    its sends through an asyncio.gather while its neighbours await their receives one by one: the step the
    engine once failed as a hang."""
    result = run("bidir", "1x4xA100", 8)
    # each rank: its A stage and its B stage (2 layers each) for 4 microbatches each, 4 layers' updates;
    # ranks 0 and 3 hold a last stage (B's and A's), and its 4 losses
    busy = [16 * (F + B) + 4 * update(PARAMS)] * 4
    busy[0] += 4 * LOSS
    busy[3] += 4 * LOSS
    assert result.compute_busy() == pytest.approx(busy, rel=1e-9)
    pair = ring("all_reduce", W_BYTES, 2)
    assert durations(result, "all_reduce") == pytest.approx([pair] * 4, rel=1e-9)
    assert result.time_s >= max(busy) + pair
    shuffled = simulate(str(HERE / "bidir.py"), cluster="1x4xA100", workload="toy", global_batch_size=8,
                        start_order_seed=5)
    assert (shuffled.time_s, shuffled.memory_bytes) == (result.time_s, result.memory_bytes)


# ---- the same schedules broken -----------------------------------------------------------------------

def broken(tmp_path: Path, name: str, old: str, new: str) -> str:
    source = (HERE / f"{name}.py").read_text()
    assert old in source
    path = tmp_path / f"{name}_broken.py"
    path.write_text(source.replace(old, new))
    return str(path)


BREAKS = [
    ("ddp_accum", "total = await works[layer]", "total = grads[layer]", 8, TensorError,
     "rank 0 update(layer 0): the gradient covers samples 0-1 but not 2-7"),
    ("ddp_accum", "range(start, start + microbatch_size)", "range(start, start + microbatch_size + (r == 0))", 8,
     TensorError, "rank 0 WeightGrad + WeightGrad (layer 7): samples 1 would be counted twice"),
    ("ddp_accum", "if last and layer % bucket_layers == 0:",
     "if last and layer % bucket_layers == 0 and not (r == 2 and layer == 4):", 8, CollectiveMismatchError,
     "all_reduce tensors differ: rank 0 gave WeightGrad(layer 4"),
    ("fsdp_prefetch", "x = model.forward(layer, x, w)",
     "x = model.forward(layer, x, shards[layer][0] if layer == 3 else w)", 8, TensorError,
     "forward(layer 3): Weight(layer 3, step 0, shards 2 of 4, rank 2) holds only ZeRO shards 2 of 4; all_gather"),
    # reduce_scatter leaves member i shard i: a rank that loaded another shard cannot update with it
    ("fsdp_prefetch", "model.load_weights(layer, r, p)", "model.load_weights(layer, (r + 1) % p, p)", 8,
     TensorError, "update(layer 0): grad WeightGrad(layer 0, samples 0-7, shards 3 of 4, rank 3) does not hold the "
     "shard(s) the optimizer state OptState(layer 0, step 0, shards 0 of 4, rank 3) updates"),
    ("tp_dp", "x = await model.all_reduce(model.forward(l, x, weights[l][0]), group=tp_group)",
     "x = model.forward(l, x, weights[l][0])", 4, TensorError,
     "forward(layer 1): Activation(layer 1, samples 0, partial 0 of 2, rank 0) is a tensor-parallel partial sum"),
    ("tp_dp", "x = await model.all_reduce(model.forward(l, x, weights[l][0]), group=tp_group)",
     "x = await model.all_reduce(await model.all_reduce(model.forward(l, x, weights[l][0]), group=tp_group), "
     "group=tp_group)", 4, TensorError, "is complete; only tensor-parallel partial sums need all_reduce"),
    ("tp_dp", "group=dp_group", "group=tp_group", 4, CollectiveMismatchError,
     "members hold different tensor-parallel slices"),
    ("vshape", "assert L % stages == 0", "assert L % stages == 1", 4, StrategyError,
     "rank 0: AssertionError: 8 layers do not split into 8 stages (at vshape_broken.py:15 in train)"),
]


@pytest.mark.parametrize("name, old, new, batch, error, message", BREAKS,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BREAKS)])
def test_a_broken_schedule_names_the_rank_op_and_layer(tmp_path, name, old, new, batch, error, message):
    cluster = "2x2xA100" if name == "tp_dp" else "1x4xA100"
    with pytest.raises(error) as info:
        simulate(broken(tmp_path, name, old, new), cluster=cluster, workload="toy", global_batch_size=batch)
    assert message in str(info.value)


def test_a_pipeline_deadlock_names_each_rank_the_op_and_the_line_it_waits_at(tmp_path):
    # rank 1 runs its backwards in the wrong order: it waits for a gradient its neighbour sends later
    path = broken(tmp_path, "vshape", '(10**6 + (stages - 1 - s) + k, "B", s, k)',
                  '(10**6 + (-(stages - 1 - s) if r == 1 else (stages - 1 - s)) + k, "B", s, k)')
    line = next(i for i, text in enumerate(Path(path).read_text().splitlines(), 1)
                if "g = await model.recv(owner(s + 1, p))" in text)
    with pytest.raises(DeadlockError) as info:
        simulate(path, cluster="1x4xA100", workload="toy", global_batch_size=4)
    lines = str(info.value).splitlines()
    assert lines[0] == "deadlock: every unfinished rank waits on communication no rank will complete"
    at = f"(at vshape_broken.py:{line} in train)"
    # (the clocks are where each rank stopped: what matters here is the rank, the op and the line)
    shown = [re.sub(r"\(t=[\d.]+ ms\)", "(t=...)", text) for text in lines[1:]]
    assert shown == [f"  rank 0 (t=...) waits on recv from rank 1: rank 1 has not sent to rank 0 {at}",
                     f"  rank 1 (t=...) waits on recv from rank 2: rank 2 has not sent to rank 1 {at}",
                     f"  rank 2 (t=...) waits on recv from rank 1: rank 1 has not sent to rank 2 {at}",
                     f"  rank 3 (t=...) waits on recv from rank 2: rank 2 has not sent to rank 3 {at}"]


def test_a_send_nobody_receives_names_the_rank_and_line(tmp_path):
    path = broken(tmp_path, "vshape", "    for work in pending:\n",
                  "    if r == 1:\n        pending.append(model.send(model.get_input_activation([0]), 2))\n"
                  "    for work in pending:\n")
    with pytest.raises(DeadlockError) as info:
        simulate(path, cluster="1x4xA100", workload="toy", global_batch_size=4)
    assert re.search(r"rank 1 \(t=[\d.]+ ms\) waits on send to rank 2 \(activation layer 0\): rank 2 has not "
                     r"posted a matching recv\(1\) \(at vshape_broken\.py:\d+ in train\)", str(info.value))


def test_ddp_out_of_memory_names_rank_device_op_and_kinds():
    with pytest.raises(OutOfMemoryError) as info:
        simulate(str(HERE / "ddp_accum.py"), cluster="1x4xV100-16GB", workload="gpt-1.3b", global_batch_size=8)
    assert str(info.value).startswith("rank 0 (V100-16GB, 16.00 GiB): out of memory at t=0.000 ms in "
                                      "load_weights(layer 22) allocating 576.30 MiB of optimizer")


def test_group_takes_a_list_of_ranks_as_the_readme_says(tmp_path):
    """`group=` takes a communicator or the list of its ranks: the TP x DP schedule with lists instead of
    `model.group(...)` runs the same step."""
    path = broken(tmp_path, "tp_dp", "tp_group = model.group(range(dp_rank * tp, dp_rank * tp + tp))",
                  "tp_group = list(range(dp_rank * tp, dp_rank * tp + tp))")
    listed = simulate(path, cluster="2x2xA100", workload="toy", global_batch_size=4)
    grouped = run("tp_dp", "2x2xA100", 4)
    assert listed.correct and (listed.time_s, listed.memory_bytes) == (grouped.time_s, grouped.memory_bytes)
