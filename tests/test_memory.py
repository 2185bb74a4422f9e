"""Lifetime-based memory: bytes count from creation until the last reference dies."""

from __future__ import annotations

import pytest

from dist_lib import Workload, simulate

TOY = Workload.parse("toy:layers=2")
P = TOY.layer_params(0)  # 12*1024^2 + 13*1024
ACT = TOY.activation_bytes()  # 1024 * 1024 * 2
STASH = TOY.stash_bytes(0)  # 1024*1024*114 - ACT


def run(train, cluster="1xA100-80GB", batch=4):
    return simulate(train, cluster, TOY, batch, check=False)


def test_live_bytes_follow_references():
    seen = {}

    async def train(model):
        w, o = model.load_weights(0)
        seen["loaded"] = model.memory_bytes
        x = model.get_input_activation(range(2))
        seen["input"] = model.memory_bytes
        y = model.forward(0, x, w)
        seen["forward"] = model.memory_bytes
        del y
        seen["output dropped"] = model.memory_bytes
        x = None  # the stash goes with the activation that carries it
        seen["input dropped"] = model.memory_bytes

    result = run(train)
    base = 2 * P + 12 * P
    assert seen == {"loaded": base, "input": base + 2 * ACT, "forward": base + 2 * ACT + 2 * STASH + 2 * ACT,
                    "output dropped": base + 2 * ACT + 2 * STASH, "input dropped": base}
    assert result.peak_memory_bytes == base + 4 * ACT + 2 * STASH
    assert result.memory_by_kind[0]["stash"] == 2 * STASH


def test_backward_consumes_the_stash_and_checkpointing_keeps_only_the_input():
    seen = {}

    async def train(model):
        w0, o0 = model.load_weights(0)
        w1, o1 = model.load_weights(1)
        x = model.get_input_activation([0])
        h = model.forward(0, x, w0, stash=False)  # checkpointed: x stays, no stash
        seen["checkpointed"] = model.memory_bytes
        grad = model.loss(model.forward(1, h, w1))
        wg1, grad = model.backward(1, h, grad, w1)
        seen["after backward 1"] = model.memory_bytes
        model.forward(0, x, w0)  # recompute, output dropped at once
        wg0, grad = model.backward(0, x, grad, w0)
        seen["after backward 0"] = model.memory_bytes

    result = run(train, batch=1)
    weights = 14 * P * 2
    assert seen["checkpointed"] == weights + 2 * ACT  # x and h, no stash
    # after layer 1's backward: x, h, the input gradient of layer 1 and layer 1's weight gradient
    assert seen["after backward 1"] == weights + 3 * ACT + 2 * P
    assert seen["after backward 0"] == weights + 3 * ACT + 2 * 2 * P
    recomputes = [e for e in result.events if e.detail == "recompute"]
    assert [(e.op, e.layer) for e in recomputes] == [("forward", 0)]
    assert result.hfu > result.mfu


def test_selective_recompute_keeps_a_smaller_stash_and_backward_reruns_the_attention_core():
    from dist_lib.costs import compute as costs
    from dist_lib.hardware.devices import DEVICES
    seen = {}

    async def train(model):
        w, _ = model.load_weights(0)
        x = model.get_input_activation([0])
        before = model.memory_bytes
        y = model.forward(0, x, w, selective_recompute=True)
        seen["stash"] = model.memory_bytes - before - ACT  # minus the output activation
        w1, _ = model.load_weights(1)
        _, grad = model.backward(1, y, model.loss(model.forward(1, y, w1)), w1)
        model.backward(0, x, grad, w)

    result = run(train, batch=1)
    # Korthikanti et al. 2022, Table 2: selective recompute drops the 5as/(ht) * sh = 5 a s^2 bytes of
    # softmax, its dropout mask and output (toy: 16 heads, sequence 1024)
    assert seen["stash"] == STASH - 5 * 16 * 1024 * 1024
    back = next(e for e in result.events if e.op == "backward" and e.layer == 0)
    a100 = DEVICES["A100-80GB"]
    assert back.detail == "selective"
    assert back.end - back.start == pytest.approx(
        costs.backward_time(a100, TOY, 0, 1) + costs.recompute_time(a100, TOY, 0, 1, recompute="selective"))
    assert back.flops == pytest.approx(costs.compute_flops(TOY, "backward", 0, 1) + TOY.attention_core_flops())


def test_selective_recompute_must_be_a_bool():
    from dist_lib import TensorError

    async def train(model):
        w, _ = model.load_weights(0)
        model.forward(0, model.get_input_activation([0]), w, selective_recompute="yes")

    with pytest.raises(TensorError, match=r"rank 0 forward\(layer 0\): selective_recompute must be True or False"):
        run(train, batch=1)


def test_in_place_all_reduce_adds_no_memory_and_gather_allocates_at_issue():
    seen = {}

    async def train(model):
        w0, o0 = model.load_weights(0, shard=model.rank, num_shards=2)
        before = model.memory_bytes
        work = model.all_gather(w0)
        seen.setdefault("gather issued", model.memory_bytes - before)
        full = await work
        seen.setdefault("full", full.nbytes)

    run(train, cluster="2xA100-80GB", batch=2)
    assert seen == {"gather issued": 2 * P, "full": 2 * P}


def test_a_work_keeps_its_input_until_awaited_in_any_order():
    seen = {}

    async def train(model):
        shards = [model.load_weights(layer, shard=model.rank, num_shards=2)[0] for layer in range(2)]
        first, second = model.all_gather(shards[0]), model.all_gather(shards[1])
        held = model.memory_bytes
        shards.clear()  # the works still hold their inputs, as a stream keeps its buffers
        freed = [held - model.memory_bytes]
        full = await second  # awaited out of issue order: its input goes
        freed.append(held - model.memory_bytes)
        again = await second
        await first
        freed.append(held - model.memory_bytes)
        if model.rank == 0:
            seen.update(freed=freed, same=again is full)

    run(train, cluster="2xA100-80GB", batch=2)
    assert seen == {"freed": [0, P, 2 * P], "same": True}  # a shard is half a layer's 2-byte weights


def test_an_all_reduced_gradient_is_its_input_buffer_with_every_member_samples():
    seen = {}

    async def train(model):
        w0, _ = model.load_weights(0)
        w1, _ = model.load_weights(1)
        h = model.forward(0, model.get_input_activation([model.rank]), w0)
        grad, _ = model.backward(1, h, model.loss(model.forward(1, h, w1)), w1)
        held = model.memory_bytes
        work = model.all_reduce(grad)
        reduced = await work
        again = await work
        if model.rank == 1:
            seen.update(samples=reduced.samples, same=again is reduced, view_of_input=reduced._base is grad,
                        grew=model.memory_bytes - held)

    run(train, cluster="2xA100-80GB", batch=2)
    assert seen == {"samples": 0b11, "same": True, "view_of_input": True, "grew": 0}


def test_gradient_accumulation_reuses_the_buffer():
    seen = {}

    async def train(model):
        w0, _ = model.load_weights(0)
        w1, _ = model.load_weights(1)
        total = None
        for sample in range(2):
            x = model.get_input_activation([sample])
            h = model.forward(0, x, w0)
            wg1, grad = model.backward(1, h, model.loss(model.forward(1, h, w1)), w1)
            total = wg1 if total is None else total + wg1
            del wg1, grad, h, x
            seen[sample] = model.memory_bytes
        assert total.samples == 0b11

    run(train, batch=2)
    assert seen[0] == seen[1]  # the second microbatch's gradient was added in place


def test_timeline_starts_at_zero_and_peaks_where_reported():
    result = simulate("strategies/ddp.py", "2xA100-80GB", "toy:layers=4", 8, microbatch_size=2)
    for rank in range(2):
        timeline = result.memory_timeline(rank)
        assert max(v for _, v in timeline) == result.memory_bytes[rank]
        assert all(b[0] >= a[0] for a, b in zip(timeline, timeline[1:]))  # stamped in time order


def test_peak_is_per_rank_and_names_the_rank():
    async def train(model):
        keep = [model.load_weights(0) for _ in range(model.rank + 1)]
        del keep

    result = run(train, cluster="3xA100-80GB", batch=3)
    assert result.memory_bytes == [14 * P, 28 * P, 42 * P]
    assert (result.peak_memory_rank, result.peak_memory_bytes) == (2, 42 * P)


def test_a_finished_step_leaves_no_cyclic_garbage():
    """The step's tensors and rank states are freed by reference counting as soon as `simulate` returns;
    none is left for a (slow, whole-heap) pass of the cycle collector."""
    import gc

    from dist_lib.engine.rank_state import RankState
    from dist_lib.tensors import Weight

    def leftovers() -> int:
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            return sum(isinstance(o, (Weight, RankState)) for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()

    gc.collect()  # what earlier tests left
    simulate("strategies/ddp.py", "2x4xA100-80GB", "toy:layers=4", 16, microbatch_size=2)
    assert leftovers() == 0


def test_a_received_tensor_counts_from_its_arrival_not_from_its_await():
    """A message no rank waits on lands in a buffer on its receiver when it ends: rank 1 leaves its first
    recv (4 samples) unawaited while it awaits a second one (1 sample) and makes and drops 4 samples of
    its own; the first message's 4 samples count throughout, so the peak is 4 + 4 samples, not 4 (else a
    message parked unawaited would hold its bytes on no rank: the sender lets go of them at its end)."""
    seen = {}

    async def train(model):
        if model.rank == 0:
            await model.send(model.get_input_activation(range(4)), 1)
            await model.send(model.get_input_activation(range(1)), 1)
            return
        first = model.recv(0)
        second = await model.recv(0)
        seen["landed"] = model.memory_bytes
        del second
        mine = model.get_input_activation(range(4, 8))
        seen["own"] = model.memory_bytes
        del mine
        x = await first
        seen["awaited"] = model.memory_bytes
        assert x.samples == 0b1111

    result = run(train, cluster="1x2xA100-80GB", batch=8)
    assert seen == {"landed": 5 * ACT, "own": 8 * ACT, "awaited": 4 * ACT}
    assert result.memory_bytes[1] == 8 * ACT


def test_split_backward_frees_at_the_input_pass_all_the_weight_pass_does_not_need():
    one = Workload.parse("toy:layers=1")  # s = h = 1024, 16 heads, 16-bit
    sh = 1024 * 1024
    # Korthikanti et al. 2022, sec. 4.1, bytes per token: the forward keeps 34h + 5as = (34 + 80)h, of
    # which the layer input (2h) is its own Activation: the stash is 112 s*h bytes a sample.
    stash = 112 * sh
    # costs.weight_pass_bytes: W keeps the linear layers' inputs (14h) and output gradients (18h), 32h a
    # token; less the layer input and output gradient backward_weight takes as tensors (2h each): 28 s*h.
    kept = 28 * sh
    assert one.stash_bytes(0) == stash
    seen = {}

    async def train(model):
        w, _ = model.load_weights(0)
        x = model.get_input_activation([0])
        grad = model.loss(model.forward(0, x, w))
        seen["before"] = model.memory_bytes
        gx = model.backward_input(0, x, grad, w)
        seen["after input"] = model.memory_bytes
        del gx
        wg = model.backward_weight(0, x, grad, w)
        seen["after weight"] = model.memory_bytes
        seen["has stash"] = x.has_stash
        del wg

    result = simulate(train, "1xA100-80GB", one, 1, check=False)
    p = one.layer_params(0)
    held = 14 * p + 2 * ACT  # weights, optimizer state, x and its output gradient
    assert seen == {"before": held + stash, "after input": held + kept + ACT, "after weight": held + 2 * p,
                    "has stash": False}
    deltas, _, kinds = result.memory_log[0]
    stash_entries = [d for d, k in zip(deltas, kinds) if k == 5]  # memory.STASH
    assert stash_entries == [stash, -stash, kept, -kept]  # forward; input pass: the rest goes; weight pass
    assert result.peak_memory_bytes == held + stash + ACT  # the forward's output, dropped after the loss


def test_split_backward_keeps_the_same_whatever_the_forward_dropped():
    from dist_lib.costs import compute as costs
    one = Workload.parse("toy:layers=1")
    sh = 1024 * 1024
    # selective recompute keeps 32 s*h bytes (no attention core); W needs the same 28 s*h as without it
    seen = {}

    async def train(model):
        w, _ = model.load_weights(0)
        x = model.get_input_activation([0])
        grad = model.loss(model.forward(0, x, w, selective_recompute=True))
        before = model.memory_bytes
        model.backward_input(0, x, grad, w)
        seen["shrunk by"] = before - model.memory_bytes

    simulate(train, "1xA100-80GB", one, 1, check=False)
    assert seen == {"shrunk by": (32 - 28) * sh}
    # with t TP ranks: (8 + 24/t) s*h bytes, sequence-parallel (4 + 28/t) s*h, less the 4 s*h W takes
    assert costs.split_stash_bytes(one, 2) == (8 + 12 - 4) * sh
    assert costs.split_stash_bytes(one, 4, sequence_parallel=True) == (4 + 7 - 4) * sh
    assert costs.weight_pass_bytes(one, 1, sequence_parallel=True) == 32 * sh


def test_a_message_dropped_unawaited_lands_and_is_freed_at_its_arrival():
    """Rank 1 drops its first recv (1 sample) and awaits a second: the first message lands at its end and,
    held by no one, is freed at that same instant, not at the receiver's earlier clock (the timeline of a
    rank never goes back in time)."""
    async def train(model):
        if model.rank == 0:
            x = model.get_input_activation(range(1))
            a, b = model.send(x, 1), model.send(x, 1)
            await a
            await b
            return
        model.recv(0)  # dropped
        await model.recv(0)

    result = run(train, cluster="1x2xA100-80GB", batch=2)
    timeline = result.memory_timeline(1)
    times = [t for t, _ in timeline]
    assert times == sorted(times)
    landed = [i for i in range(1, len(timeline)) if timeline[i][1] - timeline[i - 1][1] == ACT]
    first = landed[0]  # the first message: its bytes come and go at its end
    assert timeline[first][0] > 0
    assert timeline[first + 1] == (timeline[first][0], timeline[first - 1][1])
