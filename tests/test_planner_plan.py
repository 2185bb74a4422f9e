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


def test_a_plan_file_that_does_not_fit_the_run_is_named(tmp_path):
    path = tmp_path / "plan.json"
    RESPLIT.save(path)
    with pytest.raises(SpecError) as info:
        run(str(path), batch=12)
    assert str(info.value) == (f"plan file {path}: microbatch_size 4 x microbatches 2 = 8, but the global batch "
                               f"is 12")


@pytest.mark.parametrize("zero", [True, 1.0])
def test_a_zero_stage_that_is_not_a_whole_number_is_refused(zero):
    data = {**RESPLIT.to_dict(), "zero": zero}
    with pytest.raises(SpecError, match=rf"^<plan>: zero must be a whole number >= 0, got {zero!r}$"):
        run(data)
    with pytest.raises(SpecError, match=rf"^plan: zero must be 0, 1 or 3, got {zero!r}$"):
        run(Plan(RESPLIT.stages, 4, 2, zero=zero))


@pytest.mark.parametrize("stage,message", [
    (Stage((2, 3), 1, ((1, 4),), (0, 4)), "plan: stages[1].shares must be a whole number >= 1, got 0"),
    (Stage((2, 3), 1, ((1, 4),), (5, -1)), "plan: stages[1].shares must be a whole number >= 1, got -1"),
    (Stage((2, 3), "1", ((1, 4),), (2, 2)), "plan: stages[1].tp must be a whole number >= 1, got '1'"),
    (Stage((2, 3), 1, ((1, 4.0),), (2, 2)), "plan: stages[1].blocks must be a whole number >= 0, got 4.0"),
    (Stage((2, 3), 1, (1, 4), (2, 2)), "plan: stages[1].blocks must list (start, stop) layer ranges, got (1, 4)"),
])
def test_a_plan_built_in_python_is_checked_as_a_file_is(stage, message):
    # before: a share of 0 ran into "get_input_activation: no samples" on a rank, a tp of "1" a TypeError
    with pytest.raises(SpecError) as info:
        run(Plan((RESPLIT.stages[0], stage), 4, 2))
    assert str(info.value) == message


@pytest.mark.parametrize("plan,shown", [(3, "3"), (2.5, "2.5"), ([1, 2], "[1, 2]"),
                                        ([RESPLIT.to_dict()], "[{'stages': [{'ranks': [0, 1], 'tp': ..."),
                                        ("", None), (" ", None)])
def test_a_plan_that_is_neither_plan_dict_nor_path_is_refused(plan, shown):
    # before: a TypeError from pathlib, and "" read the current folder ("cannot be read (Is a directory)")
    with pytest.raises(SpecError) as info:
        Plan.load(plan)
    assert str(info.value) == (f"plan must be a Plan, its dict or the path of a plan file, got {shown}" if shown else
                               "plan: empty; give the path of a plan file (python -m grader plan --out writes one)")


@pytest.mark.parametrize("content,message", [
    (b'{"stages": "\xff"}', "not UTF-8 text (byte 12)"),
    (b"[" * 100_000 + b"]" * 100_000, "not a plan (lists or objects nested too deep)"),
    # json reads it through int(), whose ValueError once ended the grader with a traceback
    (b'{"microbatch_size": 1' + b"0" * 5000 + b"}", "not a plan (a whole number of more than 4300 digits)"),
])
def test_a_plan_file_that_is_not_readable_json_is_named(tmp_path, content, message):
    path = tmp_path / "plan.json"
    path.write_bytes(content)
    with pytest.raises(SpecError) as info:
        run(str(path))
    assert str(info.value) == f"plan file {path}: {message}"


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


# two nodes of two A100s: stage 0 is one TP-2 replica on node 0, stage 1 one TP-2 replica on node 1
TP_CLUSTER = "2x2xA100-80GB"
TP_PIPELINE = Plan((Stage((0, 1), 2, ((0, 2),), (1,)), Stage((2, 3), 2, ((2, 4),), (1,))), 1, 4)
SAMPLE = 2 * 1024 * 1024  # one sample's hidden states of the toy workload (s 1024, h 1024, 2 bytes)


def test_stages_of_one_tp_degree_send_tp_pieces_and_gather_them_as_hybrid_does():
    result = run(TP_PIPELINE, TP_CLUSTER, batch=4)
    assert result.correct, result.problems
    cluster = Cluster.load(TP_CLUSTER)
    # 4 microbatches x 2 TP ranks x (an activation forward + a gradient backward), each n/2 bytes
    sends = events(result, "send")
    assert len(sends) == 16 and {e.nbytes for e in sends} == {SAMPLE // 2}
    nic = cluster.p2p_link(0, 2)  # the two TP ranks send through their own NICs at once
    first = min((e for e in sends if e.rank == 0), key=lambda e: e.start)
    assert first.duration == pytest.approx(nic.latency + SAMPLE / 2 / nic.achieved_bandwidth)
    # one all-gather per message on every receiving rank: stage 1 the activations, stage 0 the gradients;
    # a ring over 2 ranks on NVLink: (p-1)/p * n/B + (p-1) * alpha
    gathers = events(result, "all_gather")
    assert {r: sum(e.rank == r for e in gathers) for r in range(4)} == {0: 4, 1: 4, 2: 4, 3: 4}
    nvlink = cluster.ring_link((0, 1))
    assert {e.nbytes for e in gathers} == {SAMPLE}
    gather = SAMPLE / 2 / nvlink.achieved_bandwidth + nvlink.latency
    assert [e.duration for e in gathers] == [pytest.approx(gather)] * 16
    # the same layout as `hybrid` runs it, message for message: the same step
    hybrid = simulate("strategies/hybrid.py", TP_CLUSTER, WORKLOAD, 4, pp=2, tp=2, microbatch_size=1)
    whole = simulate("strategies/hybrid.py", TP_CLUSTER, WORKLOAD, 4, pp=2, tp=2, microbatch_size=1,
                     scatter_gather=False)
    assert result.time_s == pytest.approx(hybrid.time_s, rel=1e-12) and result.time_s < whole.time_s


def test_tp_pieces_between_replicas_of_other_widths_are_gathered_before_the_join():
    # stage 0: two TP-2 replicas of one sample each; stage 1: one TP-2 replica of both samples
    plan = Plan((Stage((0, 1, 2, 3), 2, ((0, 2),), (1, 1)), Stage((4, 5), 2, ((2, 4),), (2,))), 2, 2)
    result = run(plan, "2x4xA100-80GB", batch=4)
    assert result.correct, result.problems
    # every message is a sample's TP piece: rank j of each stage-0 replica to rank j of stage 1 (4 + 4
    # ranks x 2 microbatches), and back after stage 1's rank j cut its gradient by samples
    sends = events(result, "send")
    assert len(sends) == 16 and {e.nbytes for e in sends} == {SAMPLE // 2}
    gathers = events(result, "all_gather")
    assert {r: sum(e.rank == r for e in gathers) for r in range(6)} == {0: 2, 1: 2, 2: 2, 3: 2, 4: 4, 5: 4}
    assert {e.nbytes for e in gathers} == {SAMPLE}
    assert sorted(e.rank for e in events(result, "join_samples")) == [4, 4, 5, 5]


def test_stages_of_other_tp_degrees_send_whole_messages():
    result = run(RESPLIT)  # tp 2 -> tp 1: tensor rank 0 sends each receiving replica its 2 samples
    assert result.correct
    assert {e.nbytes for e in events(result, "send")} == {2 * SAMPLE}
    assert not events(result, "all_gather")


def test_a_plan_whose_tp_does_not_split_the_heads_is_refused_by_field():
    cluster, workload = Cluster.load("1x4xA100-80GB"), Workload.load("gpt-1.3b:hidden=1600,heads=25,layers=4")
    given = Plan((Stage((0, 1, 2, 3), 2, ((0, 4),), (1, 1)),), 2, 4, "1f1b")
    given.check(4, 4, 8, cluster)  # without the workload, only the world and batch are checked
    with pytest.raises(SpecError) as caught:
        given.check(4, 4, 8, cluster, workload=workload)
    assert str(caught.value) == ("plan: stages[0]: tp=2 does not divide the 25 attention heads of workload "
                                 "gpt-1.3b:hidden=1600,heads=25,layers=4; "
                                 "choose a tp that divides 25")
    with pytest.raises(SpecError, match=r"^plan: stages\[0\]: tp=2 does not divide the 25 attention heads"):
        simulate("strategies/planned.py", cluster, workload, 8, plan=given)
