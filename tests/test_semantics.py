"""Virtual-time semantics: streams, overlap, rendezvous, groups, determinism (DESIGN.md, "Semantics")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dist_lib import Cluster, Workload, simulate

from dist_lib.costs import compute as costs

from dist_lib.costs import network
from dist_lib.hardware.devices import DEVICES, IB_HDR, NVLINK_3

A100 = DEVICES["A100-80GB"]
TOY = Workload.parse("toy:layers=1")
F = costs.forward_time(A100, TOY, 0, 1)  # one layer, one sample
B = costs.backward_time(A100, TOY, 0, 1)
L = costs.loss_time(A100, TOY, 1)
AR = network.all_reduce_time(TOY.layer_params(0) * 2, 2, NVLINK_3)  # 16-bit gradient of the layer


def run(train, cluster="2xA100-80GB", batch=2, **kw):
    return simulate(train, cluster, TOY, batch, check=False, **kw)


def grad_of_sample(model, sample):
    """Forward, loss and backward of the single layer for one sample: F + L + B of compute."""
    w, _ = model.load_weights(0)
    x = model.get_input_activation([sample])
    grad = model.loss(model.forward(0, x, w))
    weight_grad, _ = model.backward(0, x, grad, w)
    return weight_grad


def busy(model, n):
    """n forwards that keep nothing: n * F of compute."""
    w, _ = model.load_weights(0)
    for _ in range(n):
        model.forward(0, model.get_input_activation([0]), w, stash=False)


def test_blocking_collective_serialises_compute_and_communication():
    async def train(model):
        await model.all_reduce(grad_of_sample(model, model.rank))
        busy(model, 1)

    assert run(train).time_s == pytest.approx(F + L + B + AR + F)


def test_overlapped_collective_hides_behind_compute():
    async def train(model):
        work = model.all_reduce(grad_of_sample(model, model.rank))
        busy(model, 20)  # 20 forwards take longer than the all-reduce
        await work

    assert 20 * F > AR
    assert run(train).time_s == pytest.approx(F + L + B + 20 * F)


def test_collective_starts_when_the_last_member_issues():
    async def train(model):
        weight_grad = grad_of_sample(model, model.rank)
        if model.rank == 1:  # rank 1 is three forwards late
            busy(model, 3)
        await model.all_reduce(weight_grad)

    result = run(train)
    starts = [e.start for e in result.events if e.op == "all_reduce"]
    assert starts == [pytest.approx(F + L + B + 3 * F)] * 2
    assert result.rank_times == [pytest.approx(F + L + B + 3 * F + AR)] * 2


def test_collectives_on_one_rank_run_in_issue_order():
    async def train(model):
        first = model.all_reduce(grad_of_sample(model, model.rank))
        second = model.all_reduce(grad_of_sample(model, model.rank + 2))
        await second
        await first

    # two nodes joined by a slow 1 GB/s network, so the first all-reduce outlasts the second gradient
    result = run(train, cluster="2x1xA100-80GB:inter=1", batch=4)
    ar = network.all_reduce_time(TOY.layer_params(0) * 2, 2, replace(IB_HDR, bandwidth=1e9))
    first, second = sorted({(e.start, e.end) for e in result.events if e.op == "all_reduce"})
    assert first == (pytest.approx(F + L + B), pytest.approx(F + L + B + ar))
    assert ar > F + L + B  # the second gradient is ready before the stream is free ...
    assert second[0] == pytest.approx(first[1])  # ... so it starts when the first all-reduce ends


def test_collectives_of_different_groups_overlap():
    # 2 nodes of 2 on a 1 GB/s network: the data-parallel groups {0, 2} and {1, 3} cross it, the
    # tensor-parallel-like groups {0, 1} and {2, 3} stay on NVLink. Each group is its own communicator
    # with its own stream, so the in-node all-reduce of the second gradient does not queue behind the
    # slow cross-node all-reduce of the first.
    async def train(model):
        slow = model.all_reduce(grad_of_sample(model, model.rank), group=[model.rank % 2, model.rank % 2 + 2])
        node = model.rank - model.rank % 2
        fast = model.all_reduce(grad_of_sample(model, model.rank + 4), group=[node, node + 1])
        await fast
        await slow

    result = run(train, cluster="2x2xA100-80GB:inter=1", batch=8)
    slow_ar = network.all_reduce_time(TOY.layer_params(0) * 2, 2, replace(IB_HDR, bandwidth=1e9))
    assert slow_ar > F + L + B  # the second gradient is ready while the first all-reduce runs
    spans = {e.peers: (e.start, e.end) for e in result.events if e.op == "all_reduce"}
    for group in ((0, 2), (1, 3)):
        assert spans[group] == (pytest.approx(F + L + B), pytest.approx(F + L + B + slow_ar))
    for group in ((0, 1), (2, 3)):  # starts when issued, inside the slow one's span
        assert spans[group] == (pytest.approx(2 * (F + L + B)), pytest.approx(2 * (F + L + B) + AR))
    assert result.time_s == pytest.approx(F + L + B + slow_ar)


def test_a_completed_send_frees_its_tensor_even_while_its_work_is_held():
    # rank 0 sends a one-sample activation at t=0 and keeps only the Work; rank 1 has its recv posted
    # at t=0, so the message takes p2p = alpha + ACT/B on NVLink and the sender's stream lets go of the
    # tensor at its end, while rank 0 waits for a reply
    held = {}

    async def train(model):
        if model.rank == 0:
            held["work"] = model.send(model.get_input_activation([0]), 1)
            await model.recv(1)
        else:
            await model.recv(0)
            busy(model, 1)
            await model.send(model.get_input_activation([1]), 0)

    result = run(train)
    act = TOY.activation_bytes()
    p2p = network.p2p_time(act, NVLINK_3)
    assert held["work"].done and held["work"].input is None
    timeline = result.memory_timeline(0)
    assert timeline[:2] == [(0.0, act), (pytest.approx(p2p), 0)]


NIC = replace(IB_HDR, bandwidth=1.25e9)  # one 10 Gb/s NIC per node, each way
SHARED_NIC = "2x2xA100-80GB:nics=1x1.25"


def sends_across_nodes(delay_second: int | None):
    """Ranks 0 and 1 (node 0) each send an activation to ranks 2 and 3 (node 1): both cross node 0's one
    NIC out and node 1's one NIC in. Rank 1 sends after `delay_second` forwards, or not at all."""
    async def train(model):
        if model.rank == 0 or (model.rank == 1 and delay_second is not None):
            if model.rank == 1:
                busy(model, delay_second)
            await model.send(model.get_input_activation([model.rank]), model.rank + 2)
        elif model.rank >= 2 and (model.rank == 2 or delay_second is not None):
            await model.recv(model.rank - 2)

    result = run(train, cluster=SHARED_NIC)
    return sorted((e.start, e.end) for e in result.events if e.op == "send")


def test_one_transfer_through_a_node_nic_takes_the_single_time():
    alone = network.p2p_time(TOY.activation_bytes(), NIC)
    assert sends_across_nodes(None) == [(0.0, pytest.approx(alone))]


def test_two_concurrent_transfers_through_one_nic_each_take_twice_as_long():
    alone = network.p2p_time(TOY.activation_bytes(), NIC)
    assert sends_across_nodes(0) == [(0.0, pytest.approx(2 * alone))] * 2


def test_a_transfer_speeds_up_when_the_one_sharing_its_nic_ends():
    # the first runs alone until the second starts at s, then both at half speed: the first has D - s
    # left and ends at s + 2(D - s) = 2D - s; the second has done D - s by then and ends alone s later
    d = network.p2p_time(TOY.activation_bytes(), NIC)
    s = F
    assert s < d
    assert sends_across_nodes(1) == [(0.0, pytest.approx(2 * d - s)), (pytest.approx(s), pytest.approx(2 * d))]


def test_send_and_recv_rendezvous():
    async def train(model):
        if model.rank == 0:
            w, _ = model.load_weights(0)
            x = model.forward(0, model.get_input_activation([0]), w, stash=False)
            await model.send(x, 1)
        else:
            x = await model.recv(0)  # posted at t=0, completes when the data arrives
            assert (x.layer, x.samples, x.rank) == (1, 0b1, 1)

    result = run(train)
    p2p = network.p2p_time(TOY.activation_bytes(), NVLINK_3)
    assert result.rank_times == [pytest.approx(F + p2p)] * 2
    send, recv = [e for e in result.events if e.stream == "p2p"]
    assert (send.op, recv.op) == ("send", "recv") and send.op_id == recv.op_id


def test_messages_match_in_order_per_pair():
    async def train(model):
        if model.rank == 0:
            for sample in (0, 1):
                model.send(model.get_input_activation([sample]), 1)
        else:
            first, second = await model.recv(0), await model.recv(0)
            assert (first.samples, second.samples) == (0b01, 0b10)

    run(train)


def test_point_to_point_does_not_wait_for_the_collective_stream():
    async def train(model):
        work = model.all_reduce(grad_of_sample(model, model.rank))  # busy for AR
        if model.rank == 0:
            await model.send(model.get_input_activation([0]), 1)
        else:
            await model.recv(0)
        await work

    result = run(train)
    send = next(e for e in result.events if e.op == "send")
    assert send.start == pytest.approx(F + L + B)  # not after the all-reduce


def test_subgroups_match_independently():
    async def train(model):
        wg = grad_of_sample(model, model.rank)
        pair = model.group([model.rank - model.rank % 2, model.rank - model.rank % 2 + 1])
        reduced = await model.all_reduce(wg, group=pair)
        assert reduced.samples == 0b11 << (model.rank - model.rank % 2)

    result = run(train, cluster="4xA100-80GB", batch=4)
    groups = {e.peers for e in result.events if e.op == "all_reduce"}
    assert groups == {(0, 1), (2, 3)}


def test_a_rank_step_ends_with_its_last_op_even_one_never_awaited():
    async def train(model):
        wg = grad_of_sample(model, model.rank)  # F + L + B
        if model.rank == 0:
            model.send(wg, 1)  # issued, matched, never awaited
        else:
            model.all_reduce(wg, group=[1])  # a collective of one, never awaited
            model.recv(0)

    result = run(train)
    ends = [max(e.end for e in result.events if e.rank == rank) for rank in range(2)]
    send = network.p2p_time(TOY.layer_params(0) * 2, NVLINK_3)
    assert result.rank_times == ends == [pytest.approx(F + L + B + send)] * 2


@pytest.mark.parametrize("strategy", ["ddp", "zero", "one_f_one_b", "hybrid"])
def test_each_rank_time_is_the_end_of_its_last_event(strategy):
    result = simulate(f"strategies/{strategy}.py", "2x2xA100-80GB", "toy:layers=4", 16, microbatch_size=2)
    # (a folded step logs its representatives' events: a rank's time is its representative's last end)
    reps = result.representatives or range(4)
    assert result.rank_times == [max(e.end for e in result.events if e.rank == reps[r]) for r in range(4)]


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_results_do_not_depend_on_start_order(seed):
    def summary(result):
        return sorted(result.raw_events), result.memory_bytes, result.time_s

    baseline = simulate("strategies/ddp.py", "1x4xA100-80GB+1x4xV100-32GB", "toy:layers=4", 16, microbatch_size=1)
    shuffled = simulate("strategies/ddp.py", "1x4xA100-80GB+1x4xV100-32GB", "toy:layers=4", 16, microbatch_size=1,
                        start_order_seed=seed)
    assert summary(shuffled) == summary(baseline)
    timelines = [shuffled.memory_timeline(r) == baseline.memory_timeline(r) for r in range(8)]
    assert all(timelines)


INSTANT = '''
async def train(model):
    weight, _ = model.load_weights(0)
    x = model.get_input_activation(range(model.rank, model.rank + 1))
    grad, _ = model.backward(0, x, model.loss(model.forward(0, x, weight)), weight)
    peer = model.rank ^ 1
    await (model.send(x, peer) if model.rank % 2 == 0 else model.recv(peer))
    # at the message's end: two all-reduces over the rank alone, each of zero duration, one after the other
    first, second = model.all_reduce(grad, [model.rank]), model.all_reduce(grad, [model.rank])
    await first
    await second
'''


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_op_ids_follow_ends_and_groups_whatever_order_the_ranks_ran_in(tmp_path, seed):
    """Collectives of one rank take no time: the engine ends each alone, at its start, in the order the
    ranks issued them, which depends on the order they ran in. Op ids number ops by end, then those of no
    duration after the others, then collectives before messages, then group or channel, then order on
    it: the two messages end first (1, 2), then at the same instant the two all-reduces of rank 0 (3, 4),
    of rank 1 (5, 6), ..."""
    path = tmp_path / "instant.py"
    path.write_text(INSTANT)
    result = simulate(path, "1x4xA100-80GB", "toy:layers=1", 4, check=False, start_order_seed=seed)
    ids = {(e.rank, e.op, e.op_id) for e in result.events if e.stream != "compute"}
    messages = {(r, "send" if r % 2 == 0 else "recv", 1 + r // 2) for r in range(4)}
    reduces = {(r, "all_reduce", 3 + 2 * r + i) for r in range(4) for i in range(2)}
    assert ids == messages | reduces


def test_a_ring_slowed_by_a_slower_node_wants_only_its_rate_of_a_faster_node_nic():
    # node 0: four V100 behind one 1.25 GB/s NIC; nodes 1 and 2: four T4 behind one 6.25 GB/s NIC each.
    # At t=0 ranks 0 and 4 all-gather a weight (a ring held to 1.25 GB/s by node 0) and rank 5 sends an
    # activation to rank 9 at 6.25 GB/s. Node 1's NIC is asked for 1.25 + 6.25 = 7.5 GB/s of its 6.25,
    # so both move at 5/6 while they overlap; the message ends first, at 6/5 of its time alone, and the
    # gather then runs alone: Dg - Dp of it is left, so it ends at 6/5 Dp + (Dg - Dp) = Dg + Dp / 5.
    async def train(model):
        if model.rank in (0, 4):
            shard, _ = model.load_weights(0, shard=model.rank // 4, num_shards=2)
            await model.all_gather(shard, group=[0, 4])
        elif model.rank == 5:
            await model.send(model.get_input_activation([0]), 9)
        elif model.rank == 9:
            await model.recv(5)

    cluster = Cluster.parse("1x4xV100-16GB:nics=1x1.25+2x4xT4:nics=1x6.25")
    result = run(train, cluster=cluster)
    gather = network.all_gather_time(TOY.layer_params(0) * 2, 2, replace(IB_HDR, bandwidth=1.25e9))  # 14 us
    message = network.p2p_time(TOY.activation_bytes(), replace(IB_HDR, bandwidth=6.25e9))
    ends = {e.op: e.end for e in result.events if e.rank in (0, 5)}
    assert ends == {"all_gather": pytest.approx(gather + message / 5), "send": pytest.approx(6 / 5 * message)}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_shared_links_give_the_same_times_whatever_the_start_order(seed):
    # a hybrid pipeline on nodes whose one NIC carries every stage's messages and gradient all-reduce
    def summary(result):
        return sorted(result.raw_events), result.memory_bytes, result.time_s

    args = ("strategies/hybrid.py", "4x2xA100-80GB:nics=1x1.25", "toy:layers=8", 16)
    options = dict(microbatch_size=2, tp=2, pp=2)
    baseline = simulate(*args, **options)
    shuffled = simulate(*args, **options, start_order_seed=seed)
    assert summary(shuffled) == summary(baseline)
    assert all(shuffled.memory_timeline(r) == baseline.memory_timeline(r) for r in range(8))


def test_a_long_virtual_wait_sleeps_no_real_time(monkeypatch):
    import asyncio
    import time

    def no_sleep(*args, **kwargs):
        raise AssertionError("the simulator slept in real time")

    monkeypatch.setattr(time, "sleep", no_sleep)
    real_sleep = asyncio.sleep
    monkeypatch.setattr(asyncio, "sleep", lambda delay, *a, **k: no_sleep() if delay else real_sleep(0))

    async def train(model):
        if model.rank == 0:
            busy(model, 1000)
            model.send(model.get_input_activation([0]), 1)
        else:
            await model.recv(0)

    result = run(train)
    # rank 1 waited 1000 forwards of virtual time for the message, without sleeping
    assert result.rank_times[1] == pytest.approx(1000 * F + network.p2p_time(TOY.activation_bytes(), NVLINK_3))
