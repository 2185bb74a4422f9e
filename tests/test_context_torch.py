"""PyTorch's context-parallel SDPA (`kv_exchange="torch_all_gather"`, `costs.torch_context`): the traffic of its
merges and fp32 accumulations counted by hand from torch/distributed/tensor/experimental/_attention.py's ops, the
keys and values gathered at the query heads beside step 0's kernel, and the fp32 dk, dv passed around the ring in
backward, as hand-derived."""

from __future__ import annotations

import pytest

from dist_lib import simulate
from dist_lib.costs import context as cp_costs
from dist_lib.costs import network
from dist_lib.costs import torch_context as torch_costs
from dist_lib.errors import StrategyError
from dist_lib.hardware.cluster import Cluster
from dist_lib.workload.transformer import Workload

LLAMA = "llama-3-8b:layers=1"
# llama-3-8b at 8192 tokens over cp = 2: 4096 tokens x 32 query heads x 128 on a rank
E2 = 4096 * 32 * 128


def test_elements_and_exchanged_bytes_are_at_the_query_heads():
    """torchtitan calls SDPA after repeat_kv: K and V have the 32 query heads, not the 8 key/value heads, so the
    gathered block is 4x Megatron-Core's; dk, dv travel in fp32, twice that again."""
    w = Workload.parse(LLAMA)
    assert torch_costs.elements(w, 1, 1, 2) == E2
    assert torch_costs.kv_bytes(w, 1, 1, 2) == 2 * E2 * 2 == 4 * cp_costs.kv_block_bytes(w, 1, 1, 2)
    assert torch_costs.dkv_bytes(w, 1, 1, 2) == 2 * E2 * 4
    assert torch_costs.elements(w, 3, 2, 4) == 3 * 2048 * 16 * 128  # samples x s/cp x heads/t x head_dim


def test_fused_forward_traffic_by_hand():
    """Compiled, cp = 2: K and V made contiguous and concatenated (read + write 2E in 16 bits, twice: 16E); step
    0's kernel writes the first output, its upcast folded into step 1's merge; step 1 merges in one kernel (read
    the fp32 output 4, the new 16-bit one 2, write fp32 4: 10 per element). Rank 0's step 1 is a half-query step
    (1 > rank 0): it merges E/2 and copies the fp32 output's other half (8 x E/2); rank 1's covers all queries."""
    w = Workload.parse(LLAMA)
    assert torch_costs.forward_bytes(w, 1, 1, 2, 0) == torch_costs.RingBytes(16 * E2, (0, 5 * E2 + 4 * E2), 0)
    assert torch_costs.forward_bytes(w, 1, 1, 2, 1) == torch_costs.RingBytes(16 * E2, (0, 10 * E2), 0)


def test_eager_forward_traffic_by_hand():
    """Eager, cp = 4, rank 0 (E = 2048 x 32 x 128): every step after 0 is a half-query step. Step 0 upcasts its
    output (6E); each later step upcasts E/2 (6), subtracts (12), multiplies (8) and subtracts (12): 38 x E/2, then
    torch.cat rebuilds the fp32 output (8E), and steps 1 and 2 also concatenate K and V for a send that never
    happens (8E); the result is cast back (6E)."""
    w = Workload.parse(LLAMA + ",kernels=eager")
    e = 2048 * 32 * 128
    merge = 19 * e + 8 * e
    assert torch_costs.forward_bytes(w, 1, 1, 4, 0) == torch_costs.RingBytes(
        16 * e, (6 * e, merge + 8 * e, merge + 8 * e, merge), 6 * e)


def test_fused_backward_traffic_by_hand():
    """Compiled, cp = 2. Step 0: dk, dv from the 16-bit grads into a fp32 buffer (read 4E, write 8E), dq
    likewise (2E + 4E). Step 1 on rank 0 (half queries, all keys): the received fp32 dk, dv read (8E) with the new
    16-bit ones (4E) and written (8E); dq's half added (10 x E/2) and its other half copied (8 x E/2). On rank 1
    (all queries, the first half of the keys): the new dk, dv are half size (2E); dq added over all (10E). At the
    end dq (4E read, 2E written) and dk, dv (8E, 4E) are cast to 16 bits."""
    w = Workload.parse(LLAMA)
    prologue, epilogue = 16 * E2, 18 * E2
    assert torch_costs.backward_bytes(w, 1, 1, 2, 0) == torch_costs.RingBytes(
        prologue, (12 * E2 + 6 * E2, 20 * E2 + 9 * E2), epilogue)
    assert torch_costs.backward_bytes(w, 1, 1, 2, 1) == torch_costs.RingBytes(
        prologue, (12 * E2 + 6 * E2, 18 * E2 + 10 * E2), epilogue)


def test_eager_backward_traffic_by_hand():
    """Eager, cp = 2: three zero-filled fp32 accumulators (12E) before the K/V copies (16E). Step 0: dk, dv and
    dq += (10E each), dk, dv concatenated for the next rank (16E). Rank 1's step 1: dk, dv's half added (5E each)
    and rebuilt by torch.cat (8E each), concatenated (16E), dq += (10E)."""
    w = Workload.parse(LLAMA + ",kernels=eager")
    assert torch_costs.backward_bytes(w, 1, 1, 2, 1) == torch_costs.RingBytes(
        28 * E2, (46 * E2, 26 * E2 + 16 * E2 + 10 * E2), 18 * E2)


def test_one_rank_has_no_ring():
    w = Workload.parse(LLAMA)
    assert torch_costs.forward_bytes(w, 1, 1, 1, 0).total() == torch_costs.backward_bytes(w, 1, 1, 1, 0).total() == 0


async def _forward_backward(model, **_):
    """Ranks 0 and 1: layer 0's forward over their sequence part, the loss, layer 0's backward."""
    if model.rank >= 2:
        return
    weight, _ = model.load_weights(0)
    x = model.context_input(range(1), model.rank, 2)
    y = await model.context_forward(0, x, weight, [0, 1], kv_exchange="torch_all_gather")
    grad = model.context_loss(y)
    del y
    await model.context_backward(0, x, grad, weight, [0, 1], kv_exchange="torch_all_gather")


@pytest.mark.parametrize("spec, hidden", [("1x2xH100-80GB", True), ("2x1xH100-80GB", False)])
def test_forward_gathers_beside_step_0_and_merges_after_each_step(spec, hidden):
    """cp = 2, rank r: everything but the attention (`rest`), the K/V copies, then the gather of both ranks' K/V
    (2 x 4E bytes) beside step 0's kernel, waited for before step 1; step 1's kernel and its merge. Rank 1's
    merge covers all queries (10E) where rank 0's covers half (9E): rank 1 ends the forward later by E / HBM.
    Over NVLink the gather hides behind step 0's kernel; between two hosts it does not."""
    cluster, workload = Cluster.parse(spec), Workload.parse(LLAMA)
    device = cluster.device_of(0)
    result = simulate(_forward_backward, cluster, workload, 1, check=False)
    rest, block = cp_costs.layer_times(device, workload, 0, 1, 1, 2)
    gather = network.collective_time("all_gather", 2 * torch_costs.kv_bytes(workload, 1, 1, 2),
                                     cluster.topology((0, 1)))
    assert (gather < block) == hidden
    hbm = device.hbm_bandwidth
    for rank, merge in ((0, 9 * E2), (1, 10 * E2)):
        computes = [e for e in result.events if e.rank == rank and e.stream == "compute" and e.op == "forward"]
        assert [e.detail for e in computes] == ["context-parallel", "context-parallel K/V copies",
                                                "attention block 1 of 2", "attention block 2 of 2",
                                                "attention merge 2 of 2"]
        start = rest + 16 * E2 / hbm
        assert computes[-1].end == pytest.approx(start + max(block, gather) + block + merge / hbm, rel=1e-9)
    gathers = [e for e in result.events if e.rank == 0 and e.op == "all_gather"]
    assert [e.nbytes for e in gathers] == [2 * 4 * E2] * 2  # the forward's and the backward's


def test_backward_passes_fp32_dk_dv_around_the_ring():
    """Each rank sends its running fp32 dk, dv (8E bytes) to the next rank after each of its cp = 2 steps, the
    keys and values are all-gathered again, and the accumulations are charged at their hand-counted traffic."""
    cluster, workload = Cluster.parse("1x2xH100-80GB"), Workload.parse(LLAMA)
    result = simulate(_forward_backward, cluster, workload, 1, check=False)
    hbm = cluster.device_of(0).hbm_bandwidth
    for rank, last in ((0, 29 * E2), (1, 28 * E2)):
        sends = [e for e in result.events if e.rank == rank and e.op == "send" and e.layer == 0]
        assert [e.nbytes for e in sends] == [8 * E2, 8 * E2]
        extras = [e for e in result.events if e.rank == rank and e.op == "backward" and e.flops == 0
                  and e.detail != "context-parallel"]
        assert [e.detail for e in extras] == ["context-parallel K/V copies", "gradient accumulation 1 of 2",
                                              "gradient accumulation 2 of 2", "context-parallel gradient casts"]
        assert [e.duration for e in extras] == pytest.approx([16 * E2 / hbm, 18 * E2 / hbm, last / hbm, 18 * E2 / hbm])


@pytest.mark.parametrize("options", [dict(tp=2, pp=1, cp=2), dict(tp=1, pp=2, cp=2, recompute=True),
                                     dict(tp=2, pp=1, cp=2, selective_recompute=True, sequence_parallel=True)])
def test_hybrid_with_pytorchs_context_parallel_runs_correct(options):
    result = simulate("strategies/hybrid.py", "1x8xH100-80GB", "llama-3-8b:layers=2", 8,
                      kv_exchange="torch_all_gather", **options)
    assert result.correct


def test_pytorchs_context_parallel_costs_more_than_llama_3s_all_gather():
    """The same gather, but at the query heads, and with the merges and the fp32 gradient ring on top."""
    times = {exchange: simulate("strategies/hybrid.py", "1x8xH100-80GB", "llama-3-8b:layers=2", 8, tp=1, pp=1, cp=8,
                                kv_exchange=exchange).time_s for exchange in ("all_gather", "torch_all_gather")}
    assert times["torch_all_gather"] > times["all_gather"]


def test_an_unknown_exchange_names_the_known_ones():
    with pytest.raises(StrategyError, match="'ring', 'all_gather', 'torch_all_gather', got 'torch'"):
        simulate("strategies/hybrid.py", "1x8xH100-80GB", "llama-3-8b:layers=2", 8, tp=2, pp=1, cp=2,
                 kv_exchange="torch")
