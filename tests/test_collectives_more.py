"""Broadcast, reduce, barrier and all-to-all (uneven): what they do to tensors, their hand-derived times on a
2x4 cluster, their memory, their errors, link sharing, determinism, and recording and replay."""

from __future__ import annotations

import json

import pytest

from dist_lib import Workload, simulate
from dist_lib.errors import CollectiveMismatchError, DeadlockError, TensorError
from dist_lib.hardware.devices import IB_HDR, NVLINK_3
from dist_lib.run.recording import record
from dist_lib.run.replay import replay

TOY = Workload.parse("toy:layers=1")
ACT = TOY.activation_bytes()  # one sample's hidden states: 2 MiB
GRAD = TOY.layer_params(0) * 2  # the layer's 16-bit gradient
CLUSTER = "2x4xA100-80GB"  # ranks 0-3 on node 0, 4-7 on node 1; NVLink 3 inside, a 25 GB/s IB HDR NIC per GPU
NV, IB = NVLINK_3.achieved_bandwidth, IB_HDR.achieved_bandwidth  # 240 and 25 GB/s
A_NV, A_IB = NVLINK_3.latency, IB_HDR.latency


def run(train, batch=8, cluster=CLUSTER, **kw):
    return simulate(train, cluster, TOY, batch, check=False, **kw)


def spans(result, op):
    """The (start, end) of `op` on its members: one span for all of them."""
    found = {(e.start, e.end) for e in result.events if e.op == op}
    assert len(found) == 1, found
    return found.pop()


# ---- broadcast ---------------------------------------------------------------------------------------------

def test_broadcast_copies_the_roots_tensor_to_every_member_in_n_over_b_of_the_ring():
    got = {}

    async def train(model):
        x = model.get_input_activation(range(0, 4)) if model.rank == 2 else None
        before = model.memory_bytes
        work = model.broadcast(x, root=2)
        issued = model.memory_bytes
        out = await work
        got[model.rank] = (out.samples, out.rank, out.nbytes, before, issued, model.memory_bytes)

    result = run(train)
    n = 4 * ACT
    # NCCL's ring broadcast, bus bandwidth = algorithm bandwidth (factor 1): n over the ring's bandwidth,
    # min(NVLink, 4 NICs side by side) = 100 GB/s, plus 7 pipeline steps, one of which crosses the nodes
    ring = min(NV, 4 * IB)
    assert spans(result, "broadcast") == (0.0, pytest.approx(n / ring + 6 * A_NV + A_IB))
    for rank, (samples, where, nbytes, before, issued, after) in got.items():
        assert (samples, where, nbytes) == (0b1111, rank, n)
        if rank == 2:  # the root keeps its own tensor
            assert before == issued == after == n
        else:  # a receiver's copy is allocated when the broadcast ends, as a received message is
            assert (before, issued, after) == (0, 0, n)


def test_broadcast_is_checked_at_the_op():
    async def two_roots(model):
        await model.broadcast(model.get_input_activation([model.rank]), root=0)

    with pytest.raises(TensorError, match=r"rank 1 broadcast\(root 0\): only the root \(rank 0\) gives a tensor"):
        run(two_roots)

    async def outside(model):
        await model.broadcast(None if model.rank else model.get_input_activation([0]), root=5, group=[0, 1])

    with pytest.raises(TensorError, match=r"root must be a member of group \[0, 1\]"):
        run(outside)


def test_members_naming_different_roots_are_a_mismatch():
    async def train(model):
        if model.rank < 2:
            x = model.get_input_activation([0])
            await model.broadcast(x, root=model.rank, group=[0, 1])

    with pytest.raises(CollectiveMismatchError, match=r"broadcast roots differ: rank 0 named root 0, rank 1 named "
                                                      r"root 1"):
        run(train)


# ---- reduce ------------------------------------------------------------------------------------------------

def grad_of(model, samples):
    w, _ = model.load_weights(0)
    x = model.get_input_activation(samples)
    return model.backward(0, x, model.loss(model.forward(0, x, w)), w)[0]


def test_reduce_sums_disjoint_gradients_onto_the_root_only():
    got = {}

    async def train(model):
        grad = grad_of(model, [model.rank])
        start = model.time
        got[model.rank] = (start, await model.reduce(grad, root=5))

    result = run(train)
    ring = min(NV, 4 * IB)
    start = max(s for s, _ in got.values())
    assert spans(result, "reduce") == (start, pytest.approx(start + GRAD / ring + 6 * A_NV + A_IB))
    assert got[5][1].samples == 0xFF and got[5][1].nbytes == GRAD
    assert sorted(r for r, (_, out) in got.items() if out is None) == [0, 1, 2, 3, 4, 6, 7]


def test_reduce_of_a_sample_twice_is_refused():
    async def train(model):
        await model.reduce(grad_of(model, [0]), root=0, group=[0, 1]) if model.rank < 2 else None

    with pytest.raises(CollectiveMismatchError, match=r"ranks 0 and 1 both hold samples 0"):
        run(train)

    async def weights(model):
        await model.reduce(model.load_weights(0)[0], root=0)

    with pytest.raises(TensorError, match=r"rank \d reduce\(root 0\): reduce sums gradients"):
        run(weights)


# ---- barrier -----------------------------------------------------------------------------------------------

def test_barrier_ends_when_the_last_member_issued_it_and_costs_a_one_float_all_reduce():
    async def train(model):
        for _ in range(model.rank):  # rank r computes r forwards first
            model.forward(0, model.get_input_activation([0]), model.load_weights(0)[0], stash=False)
        assert await model.barrier() is None

    result = run(train)
    last = max(e.end for e in result.events if e.op == "forward")
    # the all-reduce of 4 bytes: a flat ring (12 NVLink steps, 2 crossing) or hierarchical (reduce-scatter and
    # all-gather in each node, 3 NVLink steps each, and a 2-member all-reduce across: 2 IB steps), the faster
    flat = 2 * 7 / 8 * 4 / min(NV, 4 * IB) + 12 * A_NV + 2 * A_IB
    hierarchical = 2 * (3 / 4 * 4 / NV + 3 * A_NV) + (1 / 2 * 2 * 1 / IB + 2 * A_IB)
    assert spans(result, "barrier") == (last, pytest.approx(last + min(flat, hierarchical)))


def test_a_member_that_never_reaches_the_barrier_is_a_deadlock_naming_it():
    async def train(model):
        if model.rank != 6:
            await model.barrier()

    with pytest.raises(DeadlockError, match=r"barrier #0 on group \[0, 1, 2, 3, 4, 5, 6, 7\].*ranks \[6\] have not "
                                             r"issued it"):
        run(train)


# ---- all-to-all --------------------------------------------------------------------------------------------

def test_even_all_to_all_costs_p_minus_1_over_p_of_n_on_its_slowest_link():
    async def train(model):
        x = model.get_input_activation(range(8 * model.rank, 8 * model.rank + 8))
        pieces = [model.split_samples(x, [8 * model.rank + j]) for j in range(8)]
        got = await model.all_to_all(pieces)
        assert [t.samples for t in got] == [1 << (8 * j + model.rank) for j in range(8)]

    result = run(train, batch=64)
    n = 8 * ACT  # each member's n bytes, in 8 pieces: 3 cross its NVLink port, 4 its NIC
    start = max(e.end for e in result.events if e.op == "split_samples")
    alone = max(3 / 8 * n / round(NV), 4 / 8 * n / round(IB)) + 3 * A_NV + 4 * A_IB
    assert spans(result, "all_to_all") == (start, pytest.approx(start + alone))


def uneven(model):
    """Rank 0 sends samples 0-2 to rank 5 and sample 3 to rank 1; every other rank r sends its sample to
    rank r + 1 (mod 8) and keeps nothing. Returns (pieces, expect)."""
    r = model.rank
    pieces, expect = [None] * 8, [None] * 8
    if r == 0:
        x = model.get_input_activation(range(0, 4))
        pieces[5], pieces[1] = model.split_samples(x, range(0, 3)), model.split_samples(x, [3])
    else:
        pieces[(r + 1) % 8] = model.get_input_activation([r + 3])
    if r == 5:
        expect[0], expect[4] = range(0, 3), [7]
    elif r == 1:
        expect[0] = [3]
    elif r != 0:
        expect[r - 1] = [r + 2]
    else:
        expect[7] = [10]
    return pieces, expect


def test_uneven_all_to_all_delivers_what_was_addressed_and_its_busiest_link_sets_the_pace():
    got = {}

    async def train(model):
        pieces, expect = uneven(model)
        start = model.time
        work = model.all_to_all(pieces, expect=expect)
        before = model.memory_bytes
        out = await work
        got[model.rank] = (start, [None if t is None else (t.samples, t.rank) for t in out],
                           model.memory_bytes - before)

    result = run(train, batch=16)
    assert got[5][1] == [(0b111, 5), None, None, None, (1 << 7, 5), None, None, None]
    assert got[1][1][0] == (1 << 3, 1) and got[0][1][7] == (1 << 10, 0)
    # the received pieces are allocated on their receivers at the end
    assert {r: grown for r, (_, _, grown) in got.items()} == {0: ACT, 1: ACT, 2: ACT, 3: ACT, 4: ACT, 5: 4 * ACT,
                                                              6: ACT, 7: ACT}
    # rank 0's NIC out and rank 5's NIC in carry 3 samples, the busiest links; rank 0 exchanges with 3 peers
    # (2 across the nodes: 5 and 7); rank 4 with 3 and 5 (one across); rank 5 with 0, 4 and 6 (one across)
    start = max(s for s, _, _ in got.values())
    alone = 3 * ACT / round(IB) + A_NV + 2 * A_IB
    assert spans(result, "all_to_all") == (start, pytest.approx(start + alone))


def test_a_piece_addressed_to_the_wrong_member_is_caught_at_the_op():
    async def train(model):
        pieces, expect = uneven(model)
        if model.rank == 0:
            pieces[4], pieces[5] = pieces[5], None  # samples 0-2 go to rank 4 instead of 5
        await model.all_to_all(pieces, expect=expect)

    with pytest.raises(CollectiveMismatchError, match=r"all_to_all #0 on group .*: rank 4 expects samples none from "
                                                      r"rank 0, but rank 0 addressed Activation\(layer 0, samples "
                                                      r"0-2, rank 0\) \(samples 0-2\) to it"):
        run(train, batch=16)


def test_pieces_of_other_samples_than_expected_are_caught_at_the_op():
    async def train(model):
        pieces, expect = uneven(model)
        if model.rank == 5:
            expect[0] = range(0, 2)  # expects two samples, rank 0 sends three
        await model.all_to_all(pieces, expect=expect)

    with pytest.raises(CollectiveMismatchError, match=r"rank 5 expects samples 0-1 from rank 0, but rank 0 "
                                                      r"addressed .*samples 0-2"):
        run(train, batch=16)


def test_all_to_all_inputs_are_checked_at_the_op():
    async def short(model):
        await model.all_to_all([None] * 3)

    with pytest.raises(TensorError, match=r"rank \d all_to_all: give a list of 8 pieces"):
        run(short)

    async def mixed(model):
        x = model.get_input_activation([model.rank])
        await model.all_to_all([x] + [None] * 6 + [model.load_weights(0)[0]])

    with pytest.raises(TensorError, match=r"pieces .* differ in kind or layer"):
        run(mixed)

    async def across(model):  # members agree on nothing: rank 0 sends activations, rank 1 weights
        x = model.get_input_activation([0]) if model.rank == 0 else model.load_weights(0)[0]
        await model.all_to_all([x, None], group=[0, 1]) if model.rank < 2 else None

    with pytest.raises(CollectiveMismatchError, match=r"members give pieces of different kinds or layers"):
        run(across)


def test_concurrent_all_to_alls_share_a_node_nic():
    # one 25 GB/s NIC per node, shared by its 4 GPUs: the exchanges [0, 4] and [1, 5] each want all of
    # both nodes' NICs, so while both run each moves at half speed: both end at twice their time alone
    async def train(model):
        if model.rank in (0, 1, 4, 5):
            group = [model.rank % 4, model.rank % 4 + 4]
            x = model.get_input_activation([model.rank])
            mine = 0 if model.rank < 4 else 1
            pieces = [None, None]
            pieces[1 - mine] = x
            await model.all_to_all(pieces, group=group)

    result = run(train, cluster="2x4xA100-80GB:nics=1x25")
    alone = ACT / round(IB) + A_IB
    assert spans(result, "all_to_all") == (0.0, pytest.approx(2 * alone))


# ---- determinism, the trace, recording and replay ------------------------------------------------------------

EVERY_OP = '''
async def train(model):
    r = model.rank
    w, opt = model.load_weights(0)
    x = model.get_input_activation([r, r + 8])
    pieces, expect = [None] * 8, [None] * 8
    pieces[(r + 3) % 8] = model.split_samples(x, [r])
    pieces[(r + 5) % 8] = model.split_samples(x, [r + 8])
    expect[(r - 3) % 8], expect[(r - 5) % 8] = [(r - 3) % 8], [(r - 5) % 8 + 8]
    work = model.all_to_all(pieces, expect=expect)
    del pieces
    got = await work
    joined = model.join_samples([t for t in got if t is not None])
    del got
    seen = await model.broadcast(joined if r == 3 else None, root=3, group=[0, 3, 4, 7]) if r in (0, 3, 4, 7) else None
    grad, _ = model.backward(0, x, model.loss(model.forward(0, x, w)), w)
    total = await model.reduce(grad, root=0)
    await model.barrier([0, 1, 2, 3]) if r < 4 else None
    full = await model.broadcast(total if r == 0 else None, root=0)
    model.set_final_weight(0, model.update(0, full, w, opt)[0])
'''


@pytest.fixture
def every_op(tmp_path):
    path = tmp_path / "every_op.py"
    path.write_text(EVERY_OP)
    return path


def summary(result):
    return sorted(result.raw_events), result.memory_bytes, result.time_s


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_results_do_not_depend_on_the_order_ranks_start_in(every_op, seed):
    baseline = simulate(every_op, CLUSTER, TOY, 16)
    shuffled = simulate(every_op, CLUSTER, TOY, 16, start_order_seed=seed)
    assert summary(shuffled) == summary(baseline)
    assert all(shuffled.memory_timeline(r) == baseline.memory_timeline(r) for r in range(8))


def test_the_new_ops_are_slices_on_their_groups_threads(every_op, tmp_path):
    path = simulate(every_op, CLUSTER, TOY, 16).write_chrome_trace(tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    slices = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in
              ("all_to_all", "broadcast", "reduce", "barrier")]
    counts = {}
    for e in slices:
        counts[e["cat"]] = counts.get(e["cat"], 0) + 1
    assert counts == {"all_to_all": 8, "broadcast": 4 + 8, "reduce": 8, "barrier": 4}
    threads = {(e["cat"], tuple(e["args"]["group"])) for e in slices}
    assert ("barrier", (0, 1, 2, 3)) in threads and ("broadcast", (0, 3, 4, 7)) in threads


def test_a_recorded_program_with_the_new_ops_replays_to_the_same_result(every_op):
    recorded, programs = record(every_op, CLUSTER, TOY, 16)
    replayed = replay(programs, CLUSTER, TOY, 16)
    assert summary(replayed) == summary(recorded)
    assert all(replayed.memory_timeline(r) == recorded.memory_timeline(r) for r in range(8))


# ---- edges: memory, a group of one, a step in two processes ---------------------------------------------------

def test_a_broadcast_copy_that_does_not_fit_is_an_out_of_memory_error_naming_the_op():
    from dist_lib.errors import OutOfMemoryError

    async def train(model):
        await model.broadcast(model.get_input_activation(range(9000)) if model.rank == 0 else None, root=0)

    with pytest.raises(OutOfMemoryError, match=r"rank 1 \(T4, .*in broadcast\(layer 0\) allocating 17.58 GiB"):
        simulate(train, "1xA100-80GB+1xT4", TOY, 9000, check=False)


def test_the_ops_over_a_group_of_one_take_no_time():
    async def train(model):
        x = model.get_input_activation([model.rank])
        got = await model.all_to_all([x], [model.rank])
        assert got[0].samples == x.samples and got[0] is not x
        assert await model.broadcast(x, model.rank, [model.rank]) is x
        await model.barrier([model.rank])
        assert model.time == 0.0

    run(train, batch=2, cluster="2xA100-80GB")


GROUPS_IN_A_NODE = '''
async def train(model):
    group = [r for r in range(8) if r // 4 == model.rank // 4]
    x = model.get_input_activation([model.rank])
    got = await model.all_to_all([model.split_samples(x, [model.rank]) if j % 2 == 0 else None for j in range(4)],
                                 group)
    copy = await model.broadcast(x if model.rank == group[0] else None, group[0], group)
    await model.barrier(group)
    await (model.send(copy, model.rank + 4) if model.rank < 4 else model.recv(model.rank - 4))
    if model.rank == 0:
        await model.barrier([0, 4])
'''


def test_in_two_processes_the_ops_within_a_half_give_the_same_result_and_across_them_one_error(tmp_path):
    path = tmp_path / "groups.py"
    path.write_text(GROUPS_IN_A_NODE.replace("    if model.rank == 0:\n        await model.barrier([0, 4])\n", ""))
    one, two = (simulate(path, CLUSTER, TOY, 8, check=False, workers=w) for w in (1, 2))
    assert summary(two) == summary(one)
    path.write_text(GROUPS_IN_A_NODE)
    with pytest.raises(TensorError, match=r"rank 0 barrier on group \[0, 4\]: a barrier across the two processes "
                                          r"of a split step is not supported; run it with workers=1"):
        simulate(path, CLUSTER, TOY, 8, check=False, workers=2)
