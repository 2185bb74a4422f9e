"""`hybrid`'s data-parallel sharding inside the 3D layout: Megatron's distributed optimizer (ZeRO-1, with and
without --overlap-param-gather) and FSDP/HSDP with TP and PP (`strategies/_sharded.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dist_lib import StrategyError, TensorError, Workload, simulate
from dist_lib.costs import compute as costs
from dist_lib.hardware.devices import DEVICES
from dist_lib.memory.tracker import OPTIMIZER, OPTIMIZER_BYTES, WEIGHT_BYTES

HYBRID = str(Path(__file__).resolve().parent.parent / "strategies" / "hybrid.py")
SMALL = Workload.parse("gpt-125m:layers=4,vocab=8192")
A100 = DEVICES["A100-80GB"]


def run(**options):
    return simulate(HYBRID, "1x8xA100-80GB", SMALL, 16, **options)


def ops(result, op, rank=0):
    return [e for e in result.events if e.op == op and e.rank == rank]


def stage_params(result, rank, layers, tp):
    return sum(SMALL.layer_params(l) for l in layers) / tp


@pytest.mark.parametrize("overlap", [False, True])
def test_distributed_optimizer_shards_the_optimizer_state_and_steps_a_shard(overlap):
    """dp 2 x pp 2 x tp 2: each rank keeps 12 bytes of optimizer state per parameter of its 1/dp shard, the
    16-bit weights whole, and steps only its shard (update time of params / (tp * dp))."""
    plain = run(dp=2, pp=2, tp=2)
    sharded = run(dp=2, pp=2, tp=2, distributed_optimizer=True, overlap_param_gather=overlap)
    assert sharded.correct and plain.correct
    for rank in range(8):
        layers = range(0, 2) if rank < 4 else range(2, 4)
        params = stage_params(sharded, rank, layers, 2)
        assert sharded.memory_by_kind[rank]["optimizer"] == pytest.approx(params / 2 * OPTIMIZER_BYTES, abs=8)
        assert plain.memory_by_kind[rank]["optimizer"] == pytest.approx(params * OPTIMIZER_BYTES, abs=8)
        assert sharded.memory_by_kind[rank]["weight"] == pytest.approx(params * WEIGHT_BYTES, abs=8)
    updates = ops(sharded, "update")
    assert [e.duration for e in updates] == [
        pytest.approx(costs.update_time(A100, SMALL.layer_params(l) / 4)) for l in (1, 0)]
    # gradients reduce-scattered over the DP group (ranks 0 and 2), never all-reduced there
    assert {e.peers for e in ops(sharded, "reduce_scatter")} == {(0, 2)}
    assert not [e for e in ops(sharded, "all_reduce") if e.peers == (0, 2)]
    gathers = ops(sharded, "all_gather")
    weight_gathers = [e for e in gathers if e.peers == (0, 2)]
    assert len(weight_gathers) == 2
    first_forward = min(e.start for e in ops(sharded, "forward"))
    last_update = max(e.end for e in updates)
    if overlap:  # the step starts from shards: each layer gathered before its first forward
        assert all(e.start <= first_forward for e in weight_gathers[:1])
        assert all(e.end <= last_update for e in weight_gathers)
    else:  # the updated shards gathered after the optimizer step
        assert all(e.start >= updates[0].end for e in weight_gathers)


def test_fsdp_with_tp_and_pp_keeps_shards_and_gathers_each_layer_once_with_pipelining():
    """torchtitan's default with PP: no reshard after forward, so each layer is all-gathered once a step,
    before its first forward, and its gradient reduce-scattered once; the optimizer state and the 16-bit
    weights between steps are 1/dp."""
    result = run(dp=2, pp=2, tp=2, fsdp=True)
    assert result.correct
    gathers = [e for e in ops(result, "all_gather") if e.peers == (0, 2)]
    assert sorted(e.layer for e in gathers) == [0, 1]
    assert sorted(e.layer for e in ops(result, "reduce_scatter")) == [0, 1]
    params = stage_params(result, 0, range(2), 2)
    assert result.memory_by_kind[0]["optimizer"] == pytest.approx(params / 2 * OPTIMIZER_BYTES, abs=8)
    final = {w for w in result.final_weights}
    assert final  # shards handed in, and the step checked correct over them


def test_fsdp_without_pipelining_reshards_after_forward_and_gathers_again_in_backward():
    """pp 1: torchtitan reshards after forward, so each microbatch gathers every layer twice (forward and
    backward) and the whole weights do not all stay: peak weight bytes below the whole stage's."""
    result = run(dp=4, pp=1, tp=2, fsdp=True, microbatch_size=2)
    kept = run(dp=4, pp=1, tp=2, fsdp=True, microbatch_size=2, reshard_after_forward=False)
    assert result.correct and kept.correct
    microbatches = 16 // 4 // 2
    gathers = [e for e in ops(result, "all_gather") if len(e.peers) == 4]
    assert len(gathers) == 2 * SMALL.num_layers * microbatches
    assert len([e for e in ops(kept, "all_gather") if len(e.peers) == 4]) == SMALL.num_layers
    whole = sum(SMALL.layer_params(l) for l in range(4)) / 2 * WEIGHT_BYTES
    assert result.memory_by_kind[result.peak_memory_rank]["weight"] < whole


def test_hsdp_shards_within_a_replicate_group_and_all_reduces_across():
    result = run(dp=4, pp=1, tp=2, fsdp=True, replicate=2)
    assert result.correct
    # ranks 0, 2, 4, 6 are rank 0's DP group: shards over (0, 2), gradients all-reduced over (0, 4)
    assert {e.peers for e in ops(result, "reduce_scatter")} == {(0, 2)}
    assert {e.peers for e in ops(result, "all_reduce") if len(e.peers) == 2 and e.peers != (0, 1)} == {(0, 4)}


@pytest.mark.parametrize("options, message", [
    ({"distributed_optimizer": True, "fsdp": True}, "exclude each other"),
    ({"overlap_param_gather": True}, "needs distributed_optimizer=True"),
    ({"replicate": 2}, "FSDP's options: set fsdp=True"),
    ({"fsdp": True, "replicate": 3, "dp": 4, "pp": 1, "tp": 2}, "replicate=3 does not divide the 4"),
])
def test_sharding_options_that_contradict_name_the_option(options, message):
    with pytest.raises(StrategyError, match=message):
        run(**{"dp": 2, "pp": 2, "tp": 2, **options})


def _most_optimizer_state(result, rank):
    """The most optimizer-state bytes the rank held at any moment of the step (its memory log, in order)."""
    held = most = 0
    signed, _, kinds = result.memory_log[rank]
    for nbytes, kind in zip(signed, kinds):
        if kind == OPTIMIZER:
            held += nbytes
            most = max(most, held)
    return most


def test_the_distributed_optimizer_never_holds_a_whole_layers_optimizer_state():
    """Loading a layer for the distributed optimizer gives its 16-bit weights whole and one shard of its state
    (`Model.load_sharded_state`): at no moment does a rank hold more optimizer state than its 1/dp shards, 12
    bytes a parameter of its stage over tp x dp (a whole layer's state taken and dropped would show here)."""
    sharded = run(dp=2, pp=2, tp=2, distributed_optimizer=True)
    for rank in range(8):
        layers = range(0, 2) if rank < 4 else range(2, 4)
        assert _most_optimizer_state(sharded, rank) == pytest.approx(
            stage_params(sharded, rank, layers, 2) / 2 * OPTIMIZER_BYTES, abs=8)


def test_zero_1_holds_only_its_shard_of_the_optimizer_state():
    zero = simulate(str(Path(HYBRID).parent / "zero.py"), "1x4xA100-80GB", SMALL, 16, stage=1)
    total = sum(SMALL.layer_params(layer) for layer in range(SMALL.num_layers))
    for rank in range(4):
        assert _most_optimizer_state(zero, rank) == pytest.approx(total / 4 * OPTIMIZER_BYTES, abs=8 * 4)


def test_a_recorded_distributed_optimizer_step_replays_to_the_same_result():
    from dist_lib.run.recording import record
    from dist_lib.run.replay import replay

    options = dict(dp=2, pp=2, tp=2, distributed_optimizer=True)
    recorded, programs = record(HYBRID, "1x8xA100-80GB", SMALL, 16, **options)
    again = replay(programs, "1x8xA100-80GB", SMALL, 16)
    assert again.correct and again.time_s == recorded.time_s == run(**options).time_s
    assert again.memory_bytes == recorded.memory_bytes


def test_a_bad_sharded_state_load_names_its_op_and_argument(tmp_path):
    strategy = tmp_path / "bad_load.py"
    strategy.write_text("async def train(model, **options):\n"
                        "    model.load_sharded_state(0, shard=4, num_shards=4)\n")
    with pytest.raises(TensorError) as caught:
        simulate(str(strategy), "1x4xA100-80GB", SMALL, 16)
    assert "load_sharded_state(layer 0): shard must be in 0..3, got 4" in str(caught.value)
