"""hybrid's `moe_dispatcher` (and strategies/moe.py's): the hierarchical token dispatch of Megatron-Core's flex dispatcher (DeepEP,
HybridEP; DeepSeek-V3 sec. 3.2.2), each token sent once to each other node holding its experts and forwarded
there over NVLink, against the flat all-to-all: hand-derived bytes and times on two nodes of four H100s,
the same correct step, replayed with its dispatcher, and refused by name where it does not apply."""

from __future__ import annotations

import math

import pytest

from dist_lib import Cluster, simulate
from dist_lib.costs.hierarchical_dispatch import relay_of, relayed_all_to_all_cost, relayed_flows
from dist_lib.costs.other_collectives import all_to_all_cost
from dist_lib.errors import CollectiveMismatchError, StrategyError, TensorError
from dist_lib.run.recording import record
from dist_lib.run.replay import replay
from dist_lib.workload.moe import MoE
from dist_lib.workload.routing import expert_loads, tokens_reaching

HYBRID = "strategies/hybrid.py"
CLUSTER = "2x4xH100-80GB"  # NVLink 450 GB/s x 0.8 = 360 GB/s a port, 3.4 us; a 50 GB/s NDR NIC per GPU, 14 us
# top-2 of 8 experts, one expert a rank with ep=8: each rank's 1024 tokens give each expert 1024 x 2 / 8 = 256
TOY = "toy:layers=2,hidden=256,heads=4,seq=1024,experts=8,top_k=2,expert_ffn_hidden=512,routing={routing}"
TOKEN = 256 * 2  # bytes of one token's hidden state, 16-bit
NVLINK, NIC, NVLINK_LATENCY, NIC_LATENCY = 360e9, 50e9, 3.4e-6, 14e-6


def test_tokens_reaching_a_node_under_uniform_routing_are_hypergeometric():
    moe = MoE(experts=8, top_k=2, expert_ffn_hidden=512)
    loads = expert_loads(moe, 0, 0, 1024)
    assert loads == (256,) * 8
    # a token misses the 4 experts of the other node with probability C(4,2)/C(8,2) = 6/28: 1024 x 22/28 = 804.57
    assert tokens_reaching(moe, loads, range(4, 8), 1024) == 805
    assert tokens_reaching(moe, loads, range(8), 1024) == 1024  # every token reaches all experts' union
    assert tokens_reaching(moe, loads, [3], 1024) == 256  # one expert: its load
    # DeepSeek-V3's shape over two nodes: top-8 of 256 on 2 x 128 experts: nearly every token needs both
    big = MoE(experts=256, top_k=8, expert_ffn_hidden=2048)
    miss = math.comb(128, 8) / math.comb(256, 8)
    assert tokens_reaching(big, expert_loads(big, 0, 0, 4096), range(128, 256), 4096) == round(4096 * (1 - miss))


def test_tokens_reaching_under_measured_routing_take_each_expert_independently():
    moe = MoE(experts=4, top_k=2, expert_ffn_hidden=64, routing="measured:4/2/1/1")
    loads = expert_loads(moe, 0, 0, 100)
    assert loads == (100, 50, 25, 25)
    # experts 2 and 3 missed with probability (1 - 0.25)^2 = 0.5625: 43.75 -> 44 tokens
    assert tokens_reaching(moe, loads, [2, 3], 100) == 44
    assert tokens_reaching(moe, loads, [0, 3], 100) == 100  # expert 0 takes every token


def _sizes(piece: int, members: int = 8) -> list[list[int]]:
    return [[0 if i == j else piece for j in range(members)] for i in range(members)]


def test_flat_and_hierarchical_cross_node_bytes_of_the_dispatch():
    """Rank 0 of 8 sends 256 tokens to each expert rank. Flat: 4 pieces across to ranks 4-7, 4 x 256 tokens.
    Hierarchical: its 805 distinct tokens for node 1 once, to rank 4 (same in-node index), which forwards
    256 to each of ranks 5-7 over NVLink."""
    cluster = Cluster.parse(CLUSTER)
    ranks, piece = list(range(8)), 256 * TOKEN
    crossing = {(i, 1 - i // 4): (805 * TOKEN, True) for i in range(8)}
    flows = relayed_flows(cluster, ranks, _sizes(piece), crossing)
    across = [(s, d, n) for s, d, n in flows if s // 4 != d // 4]
    assert sorted(across) == [(i, i + 4 if i < 4 else i - 4, 805 * TOKEN) for i in range(8)]
    assert sum(n for s, _, n in across if s == 0) == 805 * TOKEN  # flat: 4 x 256 x TOKEN
    # rank 4 sends ranks 5-7 its own piece and forwards rank 0's tokens for their experts
    assert sorted((d, n) for s, d, n in flows if s == 4 and d // 4 == 1) == [(5, piece)] * 2 + [(6, piece)] * 2 + \
        [(7, piece)] * 2
    assert len(flows) == 8 * 3 + 8 + 8 * 3  # direct in-node pieces, one crossing each, the forwards
    assert relay_of(cluster, ranks, 6, 0) == 2


def test_flat_and_hierarchical_all_to_all_times_by_hand():
    cluster = Cluster.parse(CLUSTER)
    ranks, piece = list(range(8)), 256 * TOKEN
    flat, flat_usage = all_to_all_cost(cluster, ranks, _sizes(piece))
    # flat: each NIC carries 4 pieces each way, 524,288 B / 50 GB/s; 3 NVLink peers and 4 NIC peers of latency
    assert flat == pytest.approx(4 * piece / NIC + 3 * NVLINK_LATENCY + 4 * NIC_LATENCY)
    crossing = {(i, 1 - i // 4): (805 * TOKEN, True) for i in range(8)}
    hier, usage = relayed_all_to_all_cost(cluster, ranks, _sizes(piece), crossing)
    # hierarchical: a NIC carries 805 tokens each way (412,160 B); a NVLink port 3 direct pieces and 3
    # forwarded ones each way (786,432 B at 360 GB/s, less); latency 3 NVLink peers and 1 other node
    assert hier == pytest.approx(805 * TOKEN / NIC + 3 * NVLINK_LATENCY + NIC_LATENCY)
    seconds = 805 * TOKEN / NIC
    links = dict(usage)
    assert links[2] == round(805 * TOKEN / seconds) == 50_000_000_000  # rank 0's NIC out, at its capacity
    assert links[0] == round(6 * piece / seconds)  # rank 0's NVLink port out: 6 pieces in that time
    assert dict(flat_usage)[0] == round(3 * piece / (4 * piece / NIC))


def test_combine_is_the_dispatch_mirrored():
    cluster = Cluster.parse(CLUSTER)
    ranks, piece = list(range(8)), 256 * TOKEN
    out = relayed_all_to_all_cost(cluster, ranks, _sizes(piece), {(i, 1 - i // 4): (805 * TOKEN, True)
                                                                  for i in range(8)})
    back = relayed_all_to_all_cost(cluster, ranks, _sizes(piece), {(i, 1 - i // 4): (805 * TOKEN, False)
                                                                   for i in range(8)})
    assert back[0] == pytest.approx(out[0])
    flows = relayed_flows(cluster, ranks, _sizes(piece), {(0, 1): (805 * TOKEN, False)})
    assert (4, 0, 805 * TOKEN) in flows and (5, 4, piece) in flows and (5, 0, piece) not in flows


def _all_to_alls(result, rank: int = 0) -> list[float]:
    return [e.end - e.start for e in result.events if e.op == "all_to_all" and e.rank == rank]


@pytest.mark.parametrize("dispatcher", ["deepep", "hybridep"])
def test_hybrid_with_the_hierarchical_dispatcher_is_correct_and_each_exchange_takes_the_hand_time(dispatcher):
    workload = TOY.format(routing="uniform")
    flat = simulate(HYBRID, CLUSTER, workload, 8, pp=1, ep=8)
    hier = simulate(HYBRID, CLUSTER, workload, 8, pp=1, ep=8, moe_dispatcher=dispatcher)
    assert flat.correct and hier.correct, hier.problems
    # one MoE layer each (layers 0 and 1), one microbatch: dispatch, combine, output and input gradients; the flat
    # dispatcher's dispatch and input-gradient exchanges followed by the routing probabilities' all-to-all (one
    # 2-byte probability a token copy), which the hierarchical dispatchers carry in their own exchange
    tokens = 4 * 256 * TOKEN / NIC + 3 * NVLINK_LATENCY + 4 * NIC_LATENCY
    probs = 4 * 256 * 2 / NIC + 3 * NVLINK_LATENCY + 4 * NIC_LATENCY
    assert _all_to_alls(flat) == pytest.approx([tokens + probs, tokens] * 2 + [tokens, tokens + probs] * 2)
    assert _all_to_alls(hier) == pytest.approx([805 * TOKEN / NIC + 3 * NVLINK_LATENCY + NIC_LATENCY] * 8)
    assert hier.time_s < flat.time_s
    assert {e.nbytes for e in hier.events if e.op == "all_to_all"} == {e.nbytes for e in flat.events
                                                                       if e.op == "all_to_all"}


def test_the_textbook_strategy_takes_the_dispatcher_too():
    """strategies/moe.py with ep=8 over the same ranks sends the same pieces: the same hand times."""
    workload = TOY.format(routing="uniform")
    hier = simulate("strategies/moe.py", CLUSTER, workload, 8, ep=8, moe_dispatcher="hybridep")
    assert hier.correct, hier.problems
    assert _all_to_alls(hier) == pytest.approx([805 * TOKEN / NIC + 3 * NVLINK_LATENCY + NIC_LATENCY] * 8)
    with pytest.raises(StrategyError, match=r"moe_dispatcher must be one of 'alltoall', 'deepep', 'hybridep'"):
        simulate("strategies/moe.py", CLUSTER, workload, 8, ep=8, moe_dispatcher="flex")


def test_within_one_node_the_dispatchers_move_tokens_alike_and_only_the_flat_one_sends_the_probabilities_apart():
    workload = TOY.format(routing="zipf:1.2")
    flat = simulate(HYBRID, "1x8xH100-80GB", workload, 8, pp=1, ep=8)
    hier = simulate(HYBRID, "1x8xH100-80GB", workload, 8, pp=1, ep=8, moe_dispatcher="deepep")
    assert hier.correct and hier.memory_bytes == flat.memory_bytes and hier.time_s < flat.time_s
    for rank in range(8):  # combine and output gradients alike; dispatch and input gradients longer by the probs'
        a, b = _all_to_alls(flat, rank), _all_to_alls(hier, rank)
        assert [a[i] for i in (1, 3, 4, 6)] == pytest.approx([b[i] for i in (1, 3, 4, 6)])
        assert all(a[i] > b[i] for i in (0, 2, 5, 7))


def test_a_recorded_program_replays_with_its_dispatcher():
    workload = TOY.format(routing="zipf:1.2")
    direct = simulate(HYBRID, CLUSTER, workload, 8, pp=1, ep=8, moe_dispatcher="deepep")
    recorded, programs = record(HYBRID, CLUSTER, workload, 8, pp=1, ep=8, moe_dispatcher="deepep")
    again = replay(programs, CLUSTER, workload, 8)
    for r in (recorded, again):
        assert (r.time_s, r.rank_times, r.memory_bytes, r.correct) == \
            (direct.time_s, direct.rank_times, direct.memory_bytes, direct.correct)
    assert again.time_s != simulate(HYBRID, CLUSTER, workload, 8, pp=1, ep=8).time_s


@pytest.mark.parametrize("workload, options, message", [
    (TOY.format(routing="uniform"), {"pp": 1, "ep": 8, "moe_dispatcher": "flex"},
     r"moe_dispatcher must be one of 'alltoall', 'deepep', 'hybridep' .* got 'flex'"),
    (TOY.format(routing="uniform") + ",capacity_factor=1.5", {"pp": 1, "ep": 8, "moe_dispatcher": "deepep"},
     r"moe_dispatcher='deepep' is dropless.*capacity_factor is 1.5"),
    ("toy:layers=4", {"pp": 2, "moe_dispatcher": "deepep"}, r"moe_dispatcher='deepep' .* has no experts"),
])
def test_wrong_dispatcher_options_are_refused_by_name(workload, options, message):
    with pytest.raises(StrategyError, match=message):
        simulate(HYBRID, CLUSTER, workload, 8, **options)


MIXED = '''
from strategies import moe


class OneRankDeepEP:
    """The model, but its all-to-alls name the DeepEP dispatcher."""

    def __init__(self, model):
        self._model = model

    def __getattr__(self, name):
        return getattr(self._model, name)

    def all_to_all(self, *args, **kwargs):
        return self._model.all_to_all(*args, dispatcher="deepep", **kwargs)


async def train(model, **options):
    await moe.train(OneRankDeepEP(model) if model.rank == 0 else model, **options)
'''


def test_members_naming_different_dispatchers_are_a_mismatch_naming_both(tmp_path):
    path = tmp_path / "mixed.py"
    path.write_text(MIXED)
    with pytest.raises(CollectiveMismatchError, match=r"rank 0 dispatches with 'deepep' but rank 1 with 'alltoall'"):
        simulate(str(path), CLUSTER, TOY.format(routing="uniform"), 8, ep=8)


@pytest.mark.parametrize("options", [dict(tp=2, sequence_parallel=True, ep=4, etp=2),
                                     dict(tp=2, sequence_parallel=True, ep=8, etp=1)])
def test_with_tensor_and_expert_tensor_parallelism_across_nodes_the_step_is_correct_and_shorter(options):
    """The exchange group spans both nodes (ep x etp = 8 ranks); each sequence part's tokens cross once per
    node, forwarded to every expert-TP shard there."""
    workload = TOY.format(routing="zipf:1.2") + ",shared_experts=1"
    flat = simulate(HYBRID, CLUSTER, workload, 16, pp=1, **options)
    hier = simulate(HYBRID, CLUSTER, workload, 16, pp=1, moe_dispatcher="hybridep", **options)
    assert flat.correct and hier.correct, hier.problems
    assert hier.time_s < flat.time_s


BAD_OP = '''
async def train(model, dispatcher="deepep"):
    x = model.get_input_activation(range(model.rank, model.rank + 1))
    await model.all_to_all([x] + [None] * (model.world_size - 1), dispatcher=dispatcher)
'''


@pytest.mark.parametrize("dispatcher, message", [
    ("deepep", r"rank \d all_to_all: dispatcher='deepep' moves the token pieces of an MoE layer \(Tokens\), not "),
    ("nccl", r"rank \d all_to_all: dispatcher must be one of 'alltoall', 'deepep', 'hybridep', got 'nccl'"),
])
def test_the_op_refuses_a_dispatcher_for_other_tensors_or_an_unknown_one(tmp_path, dispatcher, message):
    path = tmp_path / "bad.py"
    path.write_text(BAD_OP)
    with pytest.raises(TensorError, match=message):
        simulate(str(path), "2x2xH100-80GB", TOY.format(routing="uniform"), 4, dispatcher=dispatcher)
