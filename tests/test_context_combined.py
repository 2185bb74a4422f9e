"""Context parallelism with the rest of hybrid's options, as Llama 3 (TP x CP x PP x DP with FSDP) and
torchtitan (FSDP x CP with Float8) run it: the data-parallel state sharded over the dp x cp ranks, FP8 linear
layers around the 16-bit attention blocks, full and selective recompute, each checked against what the
mechanism implies."""

from __future__ import annotations

from collections import Counter

import pytest

from dist_lib import StrategyError, simulate
from dist_lib.workload.transformer import Workload

H100 = "1x8xH100-80GB"
LLAMA = "llama-3-8b:layers=2"


def hybrid(workload: str = LLAMA, batch: int = 8, **options):
    return simulate("strategies/hybrid.py", H100, workload, batch, **options)


def _slice_params(tp: int) -> float:
    workload = Workload.parse(LLAMA)
    return sum(workload.layer_params(layer) for layer in range(workload.num_layers)) / tp


def _groups(result, op: str, rank: int = 0) -> set:
    return {e.peers for e in result.events if e.rank == rank and e.op == op}


def duration(result, op: str, detail: str) -> float:
    """The one duration (to the picosecond) of layer 1's `op` events with `detail` on rank 0."""
    found = {round(e.duration, 12) for e in result.events if e.rank == 0 and e.layer == 1 and e.op == op
             and e.detail == detail}
    assert len(found) == 1, found
    return found.pop()


def test_llama_3_8b_cp_2_with_fsdp_and_fp8_shards_over_dp_x_cp():
    """tp=2, cp=2 on 8 GPUs leaves dp=2; FSDP shards each TP slice over the dp x cp = 4 ranks of rank 0's TP
    slice (0, 2, 4, 6), so rank 0 keeps 12 bytes of fp32 master weight and Adam moments for a quarter of its
    slice's parameters; gradients are reduce-scattered and weights gathered over that group."""
    result = hybrid(tp=2, pp=1, cp=2, fsdp=True, fp8="delayed")
    assert result.correct
    assert result.memory_by_kind[0]["optimizer"] == 12 * _slice_params(2) / 4
    assert _groups(result, "all_gather") == _groups(result, "reduce_scatter") == {(0, 2, 4, 6)}
    assert result.model_flops == pytest.approx(hybrid(tp=2, pp=1, cp=2).model_flops)


def test_distributed_optimizer_with_cp_shards_the_optimizer_state_over_dp_x_cp():
    """Megatron-Core's distributed optimizer with CP: the 16-bit weights whole, each layer's gradient
    reduce-scattered over dp x cp = 4 ranks, each stepping a quarter of its slice (an HBM-bound Adam step: a
    quarter of the time; sharding over dp alone would step half), and its shard gathered back over the group."""
    plain = hybrid(tp=2, pp=1, cp=2)
    sharded = hybrid(tp=2, pp=1, cp=2, distributed_optimizer=True)
    assert sharded.correct
    assert _groups(sharded, "all_gather") == _groups(sharded, "reduce_scatter") == {(0, 2, 4, 6)}

    def update(result):
        (d,) = [e.duration for e in result.events if e.rank == 0 and e.layer == 1 and e.op == "update"]
        return d

    assert update(sharded) == pytest.approx(update(plain) / 4, rel=1e-9)


def test_hsdp_with_cp_replicates_whole_replicas():
    """replicate=2 with dp=2: each replica's two CP ranks shard (rank 0 with rank 2), the replicas all-reduce."""
    result = hybrid(tp=2, pp=1, cp=2, fsdp=True, replicate=2)
    assert result.correct and _groups(result, "reduce_scatter") == {(0, 2)}
    assert result.memory_by_kind[0]["optimizer"] == 12 * _slice_params(2) / 2
    with pytest.raises(StrategyError, match="replicate=2 with cp=2: HSDP replicates whole replicas"):
        hybrid(tp=2, pp=2, cp=2, fsdp=True, replicate=2)


def test_fp8_with_cp_is_the_fp8_layer_at_s_over_cp_tokens_with_16_bit_attention_blocks():
    """A CP rank's layer pass is the plain layer's at s/cp = 4096 tokens, cut at its attention block: with FP8
    the part besides the blocks plus one block equals the FP8 layer pass of an s/cp-token model, and the
    attention blocks stay what they are in 16 bits."""
    plain, fp8 = hybrid(tp=2, pp=1, cp=2), hybrid(tp=2, pp=1, cp=2, fp8="tensorwise")
    short = hybrid("llama-3-8b:layers=2,seq=4096", tp=2, pp=1, dp=4, fp8="tensorwise", async_tp_allreduce=False)
    assert fp8.correct and fp8.model_flops == plain.model_flops

    block = "attention block 1 of 2"
    for op in ("forward", "backward"):
        assert duration(fp8, op, block) == pytest.approx(duration(plain, op, block), rel=1e-9)
        assert duration(fp8, op, "context-parallel") + duration(fp8, op, block) == pytest.approx(
            duration(short, op, "" if op == "forward" else "fp8 tensorwise"), rel=1e-9)
        assert duration(fp8, op, "context-parallel") < duration(plain, op, "context-parallel")


def test_full_recompute_with_cp_runs_the_ring_again():
    """Layer 1 of 4 microbatches on rank 0, cp=2: a forward sends its K/V block once, a backward its K/V block
    and the gradients of 2 blocks (16 sends); full recompute re-runs the forward before each backward (20)."""
    def kv_sends(result):
        return Counter(e.op for e in result.events if e.rank == 0 and e.layer == 1 and e.detail == "kv block")["send"]

    plain, again = hybrid(tp=2, pp=1, cp=2), hybrid(tp=2, pp=1, cp=2, recompute=True)
    assert again.correct and (kv_sends(plain), kv_sends(again)) == (16, 20)
    assert again.memory_by_kind[0]["stash"] < plain.memory_by_kind[0]["stash"]
    assert again.model_flops == plain.model_flops and again.hardware_flops > plain.hardware_flops


def test_selective_recompute_with_cp_reruns_each_blocks_attention_before_its_gradient():
    """Each backward block takes the plain backward block plus the forward block it re-runs; the rest of the
    layer is unchanged."""
    plain, selective = hybrid(tp=2, pp=1, cp=2), hybrid(tp=2, pp=1, cp=2, selective_recompute=True)
    assert selective.correct

    block = "attention block 2 of 2"
    assert duration(selective, "backward", block) == pytest.approx(
        duration(plain, "backward", block) + duration(plain, "forward", block), rel=1e-9)
    assert duration(selective, "backward", "context-parallel") == pytest.approx(
        duration(plain, "backward", "context-parallel"), rel=1e-9)


def _stash_of_one_forward(sequence_parallel: bool) -> int:
    """Layer 0's forward of one sample on each of 4 ranks (cp=2 x tp=2, TP fastest): the stash it keeps."""
    async def train(model, **_):
        cp_rank, tp_rank = divmod(model.rank, 2)
        weight, _ = model.load_weights(0, tp_rank=tp_rank, tp_size=2)
        x = model.context_input(range(1), cp_rank, 2)
        out = await model.context_forward(0, x, weight, [tp_rank, 2 + tp_rank], sequence_parallel=sequence_parallel)
        del x, out
    return simulate(train, "1x4xH100-80GB", LLAMA, 1, check=False).memory_by_kind[0]["stash"]


def test_sequence_parallel_with_cp_splits_the_norms_stash_over_tp():
    """Korthikanti et al. 2022, Table 2: sequence parallelism splits the replicated part of the stash t ways.
    llama-3-8b has two RMSNorms a layer and no dropout: their inputs and outputs are 8 bytes a token per h,
    of which t = 2 keeps half, over a CP rank's s/cp = 4096 tokens: 4 x 4096 x 4096 bytes less a sample."""
    workload = Workload.parse(LLAMA)
    saved = 8 * (workload.seq_len // 2) * workload.hidden // 2
    assert saved == 67_108_864
    assert _stash_of_one_forward(False) - _stash_of_one_forward(True) == saved


def test_sequence_parallel_with_cp_gathers_the_output_gradient_twice_a_layer():
    """torchtitan's layout on one node (FSDP, TP 2 with sequence parallelism, CP 2, Float8): correct, and each
    layer's backward of each of the 4 microbatches all-gathers its s/cp-token output gradient twice in the TP
    group (rank 0 with rank 1), which plain TP does not."""
    result = hybrid(tp=2, pp=1, cp=2, framework="torchtitan", fp8="tensorwise")
    assert result.correct
    assert result.time_s == hybrid(tp=2, pp=1, cp=2, fsdp=True, sequence_parallel=True, fp8="tensorwise").time_s
    gathers = [e for e in result.events if e.rank == 0 and e.layer == 1 and e.op == "all_gather"
               and e.peers == (0, 1)]
    assert len(gathers) == 2 * 4
    assert {e.nbytes for e in gathers} == {Workload.parse(LLAMA).activation_bytes() // 2}
    with pytest.raises(StrategyError, match="a CP rank's 4098 tokens do not split into 4 equal pieces"):
        hybrid("llama-3-8b:layers=2,seq=8196", tp=4, pp=1, cp=2, sequence_parallel=True)


@pytest.mark.parametrize("options", [dict(fsdp=True, fp8="delayed", recompute=True, sequence_parallel=True),
                                     dict(distributed_optimizer=True, selective_recompute=True)])
def test_a_graded_run_of_cp_with_sharding_and_modes_replays_to_itself(options):
    """The grader records the step and replays it: the forward's modes travel in its entry (`recording_context`),
    the reduce-scatter of sequence parts is an ordinary collective entry."""
    from dist_lib.run.recording import record
    from dist_lib.run.replay import replay

    result, programs = record("strategies/hybrid.py", H100, LLAMA, 8, tp=2, pp=1, cp=2, **options)
    replayed = replay(programs, H100, LLAMA, 8)
    assert replayed.correct and not replayed.problems
    assert (replayed.time_s, replayed.memory_bytes) == (result.time_s, result.memory_bytes)
    assert result.time_s == hybrid(tp=2, pp=1, cp=2, **options).time_s


def test_the_whole_llama_3_8b_with_cp_2_tp_2_fsdp_and_fp8_fits_one_h100_node():
    """All 32 layers: correct, within the 80 GB of each GPU, the optimizer state a quarter of a TP slice's."""
    result = hybrid("llama-3-8b", tp=2, pp=1, cp=2, fsdp=True, fp8="delayed")
    workload = Workload.parse("llama-3-8b")
    params = sum(workload.layer_params(layer) for layer in range(workload.num_layers))
    assert result.correct and max(result.memory_bytes) < 80e9
    assert result.memory_by_kind[0]["optimizer"] == 12 * params / 2 / 4
