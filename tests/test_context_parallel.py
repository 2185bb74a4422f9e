"""Context parallelism: hybrid's `cp` option runs correct, ring attention's exchanges overlap its blocks as
hand-derived, activations and stash shrink by cp, a skipped CP gradient reduction is refused, and the
results do not depend on the order the ranks start in."""

from __future__ import annotations

import pytest

from dist_lib import simulate
from dist_lib.costs import context as cp_costs
from dist_lib.costs import network
from dist_lib.errors import CollectiveMismatchError, StrategyError, TensorError
from dist_lib.hardware.cluster import Cluster
from dist_lib.workload.transformer import Workload

H100 = "1x8xH100-80GB"
LLAMA2 = "llama-3-8b:layers=2"
TOY = "toy:layers=2"


def hybrid(cluster: str = H100, workload: str = LLAMA2, batch: int = 8, **options):
    return simulate("strategies/hybrid.py", cluster, workload, batch, **options)


@pytest.mark.parametrize("kv_exchange", ["ring", "all_gather"])
def test_llama_3_8b_layers_2_with_cp_2_tp_2_runs_correct(kv_exchange):
    result = hybrid(tp=2, pp=1, cp=2, kv_exchange=kv_exchange)
    assert result.correct
    assert result.model_flops == pytest.approx(hybrid(tp=2, pp=1).model_flops)  # the same model's FLOPs


def test_cp_with_pipeline_stages_runs_correct():
    assert hybrid(tp=2, pp=2, cp=2).correct


def _forward_only(cp: int):
    """Layer 0's forward of one sample on each rank: whole (cp 1) or its sequence part of cp."""
    async def train(model, **_):
        weight, _ = model.load_weights(0)
        if cp == 1:
            x = model.get_input_activation(range(1))
            out = model.forward(0, x, weight)
        else:
            x = model.context_input(range(1), model.rank, cp)
            out = await model.context_forward(0, x, weight, range(cp))
        del x, out  # (alive until here: the peak)
    return train


def test_activations_and_stash_per_rank_shrink_by_cp():
    """The stash is Korthikanti's Table 2 over cp (exactly: s/cp tokens, and the s^2 terms as cp blocks of
    (s/cp)^2); the input and output hidden states are s/cp tokens each."""
    workload = Workload.parse(LLAMA2)
    plain = simulate(_forward_only(1), "1x1xH100-80GB", workload, 1, check=False).memory_by_kind[0]
    for cp in (2, 4):
        context = simulate(_forward_only(cp), f"1x{cp}xH100-80GB", workload, 1, check=False).memory_by_kind[0]
        assert context["stash"] * cp == plain["stash"] > 0
        assert plain["activation"] == 2 * workload.activation_bytes()
        assert context["activation"] == 2 * workload.activation_bytes() // cp


def _one_layer(kv_exchange: str):
    """Each rank of a CP group of 2 runs layer 0's forward over its sequence part and nothing else."""
    async def train(model, **_):
        if model.rank >= 2:
            return
        weight, _ = model.load_weights(0)
        x = model.context_input(range(1), model.rank, 2)
        await model.context_forward(0, x, weight, [0, 1], kv_exchange=kv_exchange)
    return train


def test_ring_exchange_overlaps_the_attention_block_as_hand_derived():
    """cp = 2: rank r computes everything but the attention (`rest`), then posts the send of its K/V block to
    its peer and the receive of the peer's, runs the attention of its own block, waits for the exchange, and
    runs the attention of the peer's block: rest + max(block, exchange) + block. The exchange is one message of
    2 x s/2 x kv_heads x head_dim x 2 bytes over NVLink (`network.p2p_time`), the two directions each on
    their own side of the link."""
    cluster, workload = Cluster.parse("1x2xH100-80GB"), Workload.parse(LLAMA2)
    result = simulate(_one_layer("ring"), cluster, workload, 1, check=False)
    device = cluster.device_of(0)
    rest, block = cp_costs.layer_times(device, workload, 0, 1, 1, 2)
    nbytes = cp_costs.kv_block_bytes(workload, 1, 1, 2)
    assert nbytes == 2 * 4096 * 8 * 128 * 2  # llama-3-8b: 8 key/value heads of 128, 8192 tokens / 2
    exchange = network.p2p_time(nbytes, cluster.p2p_link(0, 1))
    assert result.time_s == pytest.approx(rest + max(block, exchange) + block, rel=1e-9)
    assert block > exchange  # with GQA the exchange hides behind the block's attention
    blocks = [e for e in result.events if e.rank == 0 and e.detail.startswith("attention block")]
    assert [e.duration for e in blocks] == pytest.approx([block, block])


def test_all_gather_exchange_runs_before_the_blocks():
    cluster, workload = Cluster.parse("1x2xH100-80GB"), Workload.parse(LLAMA2)
    result = simulate(_one_layer("all_gather"), cluster, workload, 1, check=False)
    rest, block = cp_costs.layer_times(cluster.device_of(0), workload, 0, 1, 1, 2)
    nbytes = 2 * cp_costs.kv_block_bytes(workload, 1, 1, 2)  # the gathered blocks
    gather = network.collective_time("all_gather", nbytes, cluster.topology((0, 1)))
    assert result.time_s == pytest.approx(rest + gather + 2 * block, rel=1e-9)


def test_a_strategy_that_skips_the_cp_gradient_reduction_is_refused():
    """Reducing over the data-parallel ranks only leaves each rank a gradient of its sequence part: `update`
    refuses it, naming the parts and the dp x cp group."""
    from strategies import _plan
    from strategies._context import run_context_stage
    from strategies.one_f_one_b import schedule

    async def train(model, **_):
        plan = _plan.build_plan(model, schedule, microbatch_size=1, pp=1, tp=2, cp=2)
        dp_only = [r for r in plan.dp_group(0) if r % 4 // 2 == plan.cp_rank]  # same CP rank, every replica
        plan.dp_group = lambda layer: dp_only
        await run_context_stage(model, plan)

    with pytest.raises(TensorError, match=r"sequence parts 0 of 2.*dp x cp"):
        simulate(train, H100, LLAMA2, 4)


def test_a_sequence_part_counted_twice_is_refused():
    async def train(model, **_):
        weight, _ = model.load_weights(0)
        x = model.context_input(range(1), 0, 2)  # both ranks claim part 0
        out = await model.context_forward(0, x, weight, [model.rank], kv_exchange="ring")
    with pytest.raises(TensorError, match="not this activation's CP group"):
        simulate(train, "1x2xH100-80GB", LLAMA2, 1)


def test_cp_gradients_of_one_part_do_not_sum():
    from dist_lib.tensors import ContextWeightGrad

    async def train(model, **_):
        grad = ContextWeightGrad(model._mem, 8, model.rank, 0, 1, 1, 1, 0, 1, 1, 2)  # both: part 0 of sample 0
        await model.all_reduce(grad, [0, 1])
    with pytest.raises(CollectiveMismatchError, match="counted twice"):
        simulate(train, "1x2xH100-80GB", LLAMA2, 1)


def test_deterministic_under_shuffled_rank_order():
    base = hybrid(tp=2, pp=2, cp=2)
    for seed in (1, 2):
        other = hybrid(tp=2, pp=2, cp=2, start_order_seed=seed)
        assert other.time_s == base.time_s
        assert other.memory_bytes == base.memory_bytes
        assert len(other.raw_events) == len(base.raw_events)


def test_cp_options_are_checked():
    with pytest.raises(StrategyError, match="cp must be a whole number"):
        hybrid(tp=2, pp=1, cp=0)
    with pytest.raises(StrategyError, match="kv_exchange"):
        hybrid(tp=2, pp=1, cp=2, kv_exchange="allgather")
    with pytest.raises(StrategyError, match="2 x cp"):
        hybrid(workload="llama-3-8b:layers=2,seq=8190", tp=2, pp=1, cp=2)
    with pytest.raises(StrategyError, match="cp=2 runs with schedule gpipe, 1f1b or interleaved, not 'deepspeed'"):
        hybrid(tp=2, pp=1, cp=2, schedule="deepspeed")


def test_llama_3_8b_on_one_h100_node_with_cp_2_tp_2_runs_correct_within_memory():
    result = hybrid(workload="llama-3-8b", tp=2, pp=1, cp=2)
    assert result.correct
    assert max(result.memory_bytes) < Cluster.parse(H100).device_of(0).memory_bytes


def test_cp_with_the_interleaved_schedule_runs_correct():
    assert hybrid(workload="llama-3-8b:layers=4", tp=2, pp=2, cp=2, schedule="interleaved").correct
