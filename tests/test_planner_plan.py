"""Plans as data and the strategy that runs them: per-stage (dp, tp), uneven layer blocks and shares,
activations re-split by samples between stages of different widths."""

from __future__ import annotations

import pytest

from dist_lib import Cluster, SpecError, TensorError, Workload, simulate
from dist_lib.planner import Plan, Stage

CLUSTER, WORKLOAD = "1x2xA100-80GB+1x2xV100-32GB", "toy:layers=4"
# stage 0: one replica of tp 2 on the A100s; stage 1: two replicas of tp 1 on the V100s
RESPLIT = Plan((Stage((0, 1), 2, ((0, 1),), (4,)), Stage((2, 3), 1, ((1, 4),), (2, 2))), 4, 2)


def run(plan: Plan, cluster: str = CLUSTER, batch: int = 8, **kw):
    return simulate("strategies/planned.py", cluster, WORKLOAD, batch, plan=plan, **kw)


def events(result, op):
    return [e for e in result.events if e.op == op]


def test_a_stage_of_other_width_splits_and_joins_by_samples():
    result = run(RESPLIT)
    assert result.correct
    # forward: tensor rank 0 of stage 0 cuts each of the 2 microbatches for the 2 receiving replicas
    # (tensor rank 1's copy is not needed: the receivers have tp 1); backward: both tensor ranks of
    # stage 0 join the two gradient pieces of each microbatch
    assert sorted(e.rank for e in events(result, "split_samples")) == [0] * 4
    assert sorted(e.rank for e in events(result, "join_samples")) == [0, 0, 1, 1]
    act = Workload.load(WORKLOAD).activation_bytes()
    device = Cluster.load(CLUSTER).device_of(0)
    for e in events(result, "split_samples") + events(result, "join_samples"):
        samples = 2 if e.op == "split_samples" else 4
        assert e.duration == pytest.approx(2 * samples * act / device.hbm_bandwidth)


@pytest.mark.parametrize("schedule,recompute,zero", [("1f1b", "none", 0), ("gpipe", "full", 1),
                                                     ("zero-bubble", "selective", 0), ("1f1b", "selective", 1)])
def test_every_schedule_recompute_and_zero_stage_runs_correctly(schedule, recompute, zero):
    plan = Plan(RESPLIT.stages, 4, 2, schedule, recompute, zero)
    result = run(plan)
    assert result.correct
    recomputed = [e for e in events(result, "forward") if e.detail == "recompute"]
    assert bool(recomputed) == (recompute == "full")


def test_zero_one_shards_the_optimizer_state_over_a_stages_replicas():
    plain, sharded = run(RESPLIT), run(Plan(RESPLIT.stages, 4, 2, zero=1))
    workload = Workload.load(WORKLOAD)
    optimizer = sum(workload.layer_params(layer) for layer in range(1, 4)) * 12
    # rank 2 holds half of stage 1's optimizer state instead of all of it (stage 0 has one replica)
    assert plain.memory_by_kind[2]["optimizer"] - sharded.memory_by_kind[2]["optimizer"] == \
        pytest.approx(optimizer / 2, abs=8)
    assert plain.memory_by_kind[0]["optimizer"] == sharded.memory_by_kind[0]["optimizer"]


def test_interleaved_chunks_over_stages_of_other_widths():
    plan = Plan((Stage((0,), 1, ((0, 1), (2, 3)), (2,)), Stage((2, 3), 1, ((1, 2), (3, 4)), (1, 1))), 2, 4,
                "interleaved")
    result = run(plan)
    assert result.correct
    assert result.rank_times[1] == 0  # a rank the plan leaves idle does nothing


def test_uneven_shares_give_each_replica_its_samples():
    plan = Plan((Stage((0, 1, 2), 1, ((0, 4),), (3, 2, 1)),), 6, 2)
    result = run(plan, "1x4xA100-80GB", batch=12)
    assert result.correct
    per_rank = {r: sum(e.samples.bit_count() for e in events(result, "forward") if e.rank == r and e.layer == 0)
                for r in range(3)}
    assert per_rank == {0: 6, 1: 4, 2: 2}


def test_plan_file_round_trip(tmp_path):
    path = tmp_path / "plan.json"
    RESPLIT.save(path)
    assert Plan.load(path) == RESPLIT
    assert run(str(path)).time_s == run(RESPLIT).time_s


@pytest.mark.parametrize("change,field", [
    (lambda d: d["stages"][1].update(ranks=[1, 3]), "stages[1].ranks"),
    (lambda d: d["stages"][1].update(shares=[1, 2]), "stages[1].shares"),
    (lambda d: d["stages"][1].update(blocks=[[2, 4]]), "blocks"),
    (lambda d: d["stages"][0].update(tp=3), "stages[0]"),
    (lambda d: d.update(microbatches=3), "global batch"),
    (lambda d: d.update(schedule="pipedream"), "schedule"),
    (lambda d: d.update(extra=1), "extra"),
])
def test_a_wrong_plan_is_named_in_one_line(change, field):
    data = RESPLIT.to_dict()
    change(data)
    with pytest.raises(SpecError) as info:
        run(data)
    assert field in str(info.value) and "\n" not in str(info.value)


def test_a_tp_group_across_nodes_is_refused():
    plan = Plan((Stage((0, 1, 2, 3), 4, ((0, 4),), (8,)),), 8, 1)
    with pytest.raises(SpecError, match="spans nodes"):
        run(plan)


def test_joining_samples_twice_is_refused():
    async def train(model, **_):
        x = model.get_input_activation(range(2))
        y = model.forward(0, x, model.load_weights(0)[0], stash=False)
        part = model.split_samples(y, range(1))
        model.join_samples([part, y])

    with pytest.raises(TensorError, match="join_samples: samples 0 appear twice"):
        simulate(train, "1x1xA100-80GB", WORKLOAD, 2, check=False)


def test_a_completed_send_frees_its_tensor_so_memory_does_not_grow_with_microbatches():
    act = Workload.load("toy").activation_bytes()
    peaks = []
    for m in (4, 16):
        plan = Plan((Stage((0,), 1, ((0, 4),), (1,)), Stage((1,), 1, ((4, 8),), (1,))), 1, m)
        result = simulate("strategies/planned.py", "1x2xA100-80GB", "toy", m, plan=plan)
        peaks.append([result.memory_by_kind[r]["activation"] + result.memory_by_kind[r]["activation_grad"]
                      for r in (0, 1)])
    # 1F1B keeps two microbatches' layer inputs on stage 0 (4 layers each) and one on stage 1
    assert peaks[0] == peaks[1]
    assert peaks[0][0] >= 8 * act and peaks[0][1] >= 4 * act
