"""Folding identical data-parallel replicas (`simulate(..., fold=True)`, `dist_lib/run/folding.py`): a folded
step gives the full step's results exactly, and never folds what is not alike."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dist_lib import ReplicaGrid, simulate
from dist_lib.comm.folding import relabel_shards, rotate
from dist_lib.hardware.cluster import Cluster
from dist_lib.hardware.replicas import Fold

FIGURES = ("time_s", "rank_times", "memory_bytes", "mfu", "hfu", "bubble_fraction", "correct", "problems",
           "final_weights", "hardware_flops")


def assert_same(full, folded) -> None:
    """Every figure, every rank's memory timeline, and the events of the ranks that ran (op ids aside: they
    number the other replicas' ops too)."""
    for key in FIGURES:
        assert getattr(folded, key) == getattr(full, key), key
    for rank in range(full.cluster.world_size):
        assert [list(a) for a in folded.timelines[rank]] == [list(a) for a in full.timelines[rank]], rank
    ran = set(folded.representatives)

    def ops(result):
        return sorted(e[:10] + e[11:] for e in result.raw_events if e[0] in ran)

    assert ops(folded) == ops(full)


def both(strategy, cluster, workload, batch, **options):
    full = simulate(strategy, cluster, workload, batch, fold=False, check=False, **options)
    folded = simulate(strategy, cluster, workload, batch, check=False, **options)
    return full, folded


# ---- the relabelling of masks ---------------------------------------------------------------------

def test_rotate_moves_block_zero_to_block_j_and_keeps_whole_masks():
    assert rotate(0b0011, 1, 2, 2) == 0b1100
    assert rotate(0b000011, 2, 2, 3) == 0b110000
    assert rotate(0b111111, 2, 2, 3) == 0b111111
    assert rotate(0b010001, 1, 2, 3) == 0b000101  # block 2 wraps round to block 0


def test_relabel_shards_of_a_tensor_sharded_over_the_replicas():
    assert relabel_shards(0b0001, 4, 3, 4) == 0b1000
    assert relabel_shards(0b1111, 4, 3, 4) == 0b1111  # whole: the same everywhere


# ---- the hardware's symmetry ----------------------------------------------------------------------

def test_fold_of_a_grid_with_two_replicas_per_node():
    """tp 4 on nodes of 8: a node holds two replicas of a stage; dp 4, pp 2 on 4 nodes."""
    cluster = Cluster.parse("4x8xA100-80GB:nics=1x25")
    fold, why = Fold.build(cluster, ReplicaGrid(dp=4, tp=4))
    assert why == "" and fold.reps == [0, 1, 2, 3, 16, 17, 18, 19]
    assert fold.rep_of[13] == 1 and fold.replica_of[13] == 3
    world = 32
    # a stage spans 2 nodes: their shared NICs are one orbit of 2, the node of rank 0 stands for both
    assert fold.canon[4 * world + 2 * 1] == 4 * world and fold.orbit[4 * world] == 2
    # a message of rank 0 wanting 10 bytes/s of its node's NIC stands for 4 replicas' messages: 40 over 2 NICs
    assert fold.usage(((4 * world, 10),), fold.copies) == ((4 * world, 40),)
    assert fold.capacities()[4 * world] == 2 * cluster.link_capacities()[4 * world]


@pytest.mark.parametrize("spec, grid, why", [
    ("1x4xA100-80GB+1x4xV100-32GB", ReplicaGrid(8), "the nodes differ"),
    ("2x8xA100-80GB:inter=50+1x8xA100-80GB", ReplicaGrid(24), "the nodes differ"),
    ("3x4xA100-80GB", ReplicaGrid(dp=3, tp=2), "cut the stages"),
    ("1x8xA100-80GB", ReplicaGrid(1), "one replica"),
])
def test_no_fold_where_the_replicas_are_not_alike(spec, grid, why):
    fold, reason = Fold.build(Cluster.parse(spec), grid)
    assert fold is None and why in reason


# ---- folded and full steps agree ------------------------------------------------------------------

SCHEDULES = ("gpipe", "1f1b", "interleaved", "deepspeed")


@st.composite
def hybrid_configs(draw):
    dp = draw(st.integers(2, 16))
    tp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([1, 2, 4]))
    schedule = draw(st.sampled_from(SCHEDULES))
    chunks = 2 if schedule == "interleaved" else 1
    gpus = draw(st.sampled_from([g for g in (2, 4, 8) if g % tp == 0]))
    world = dp * pp * tp
    nics = draw(st.sampled_from(["", ":nics=1x25"]))
    microbatches = draw(st.integers(1, 3)) * pp
    options = dict(dp=dp, pp=pp, tp=tp, schedule=schedule, recompute=draw(st.booleans()),
                   overlap_grad_reduce=draw(st.booleans()))
    # context parallelism: a replica's stage is its cp x tp ranks, inside a node or on whole nodes of its own
    cp = draw(st.sampled_from([1, 2])) if schedule != "deepspeed" else 1
    if cp > 1:
        options.update(cp=cp)
        world *= cp
    # the distributed optimizer's and FSDP's shards: replica j holds block j of each
    sharding = draw(st.sampled_from(["none", "distributed optimizer", "fsdp"]))
    if sharding == "distributed optimizer":
        options.update(distributed_optimizer=True, overlap_param_gather=draw(st.booleans()))
    elif sharding == "fsdp" and pp == 1:
        options.update(fsdp=True)
        # HSDP: shard groups of dp / replicate replicas fold as one, the replicate groups crossing the fold
        replicate = draw(st.sampled_from([r for r in (1, 2, 3, 4) if dp % r == 0]))
        if replicate > 1:
            options.update(replicate=replicate)
    cluster = f"{world // gpus}x{gpus}xA100-80GB{nics}" if world % gpus == 0 else f"{world}xA100-80GB{nics}"
    return cluster, f"toy:layers={pp * chunks * 2}", dp * microbatches, options


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hybrid_configs())
def test_folded_hybrid_steps_are_the_full_steps(config):
    cluster, workload, batch, options = config
    full, folded = both("strategies.hybrid", cluster, workload, batch, **options)
    copies = options.get("replicate", options["dp"])  # (HSDP: a folded replica is a shard group)
    if folded.representatives is None:  # (the nodes cut the grid unevenly: not folded, the same run)
        width = options["tp"] * options.get("cp", 1) * options["dp"] // copies
        assert Fold.build(Cluster.parse(cluster), ReplicaGrid(copies, width))[0] is None
        return
    assert full.representatives is None and len(set(folded.representatives)) * copies == full.cluster.world_size
    assert_same(full, folded)


@pytest.mark.parametrize("cluster,options", [
    ("1x4xA100-80GB", dict(dp=4, replicate=2)),
    ("2x8xA100-80GB", dict(dp=8, tp=2, replicate=2)),
    ("4x4xA100-80GB:nics=1x25", dict(dp=8, pp=2, replicate=4)),
    ("2x4xA100-80GB", dict(dp=4, cp=2, replicate=2)),
    ("3x4xA100-80GB", dict(dp=6, tp=2, replicate=3)),
    ("4x2xA100-80GB:nics=1x25", dict(dp=8, replicate=2)),
])
def test_folded_hsdp_steps_are_the_full_steps(cluster, options):
    """HSDP folds by shard groups: each group of dp / replicate replicas holds every shard, so the replicate
    groups' all-reduces cross the fold with the very shards of the representatives' group."""
    options = dict(options, pp=options.get("pp", 1))
    pp = options["pp"]
    full, folded = both("strategies.hybrid", cluster, f"toy:layers={2 * pp}", options["dp"] * 2 * pp, fsdp=True,
                        recompute=False, **options)
    assert folded.representatives is not None and full.correct
    assert len(set(folded.representatives)) * options["replicate"] == full.cluster.world_size
    assert_same(full, folded)


@settings(max_examples=10, deadline=None)
@given(dp=st.integers(2, 16), stage=st.sampled_from([1, 2, 3]), nics=st.sampled_from(["", ":nics=1x10"]))
def test_folded_zero_steps_are_the_full_steps(dp, stage, nics):
    cluster = f"{dp // 2}x2xA100-80GB{nics}" if dp % 2 == 0 else f"{dp}xA100-80GB{nics}"
    full, folded = both("strategies.zero", cluster, "toy:layers=4", 2 * dp, stage=stage, microbatch_size=1)
    assert folded.representatives is not None
    assert_same(full, folded)


@pytest.mark.parametrize("strategy, options", [
    ("strategies.ddp", {"microbatch_size": 1, "bucket_mb": 0.5}),
    ("strategies.one_f_one_b", {"pp": 2}),
    ("strategies.zero_bubble", {"pp": 2}),
    ("strategies.interleaved", {"pp": 2, "chunks": 2}),
])
def test_folded_data_parallel_strategies(strategy, options):
    full, folded = both(strategy, "2x4xV100-16GB:nics=1x1.25", "toy:layers=4", 16, **options)
    assert folded.representatives is not None
    assert_same(full, folded)


@pytest.mark.slow
@pytest.mark.parametrize("dp", [32, 64])
def test_folded_large_hybrid_step(dp):
    full, folded = both("strategies.hybrid", f"{dp}x8xA100-80GB:nics=4x50", "toy:layers=8", dp * 4,
                        tp=4, pp=2, schedule="interleaved")
    assert_same(full, folded)


# ---- mixtures of experts: the replicas that exchange tokens fold as one ------------------------------

MOE = ("toy:layers=4,hidden=256,heads=4,seq=128,experts={experts},top_k={top_k},expert_ffn_hidden=512,"
       "moe_every=2,dense_ffn_hidden=512,shared_experts={shared},routing={routing}")


@st.composite
def moe_configs(draw):
    experts = draw(st.sampled_from([2, 4, 8]))
    pp = draw(st.sampled_from([1, 2]))
    gpus = draw(st.sampled_from([2, 4, 8]))
    tp = draw(st.sampled_from([1, 2]))
    ep = draw(st.sampled_from([e for e in (1, 2, 4) if experts % e == 0]))
    etp = draw(st.sampled_from(sorted({1, tp, 2})))
    dp = ep * draw(st.integers(2, 4))
    world = dp * tp * pp
    weights = "/".join(str(1 + i % 3) for i in range(experts))
    routing = draw(st.sampled_from(["uniform", f"measured:{weights}"]))
    options = dict(pp=pp, dp=dp, schedule=draw(st.sampled_from(["1f1b", "gpipe", "interleaved"])))
    if ep > 1 or draw(st.booleans()):  # (without `ep`, every replica holds every expert)
        options.update(ep=ep)
    if tp > 1:  # (sequence-parallel, as Megatron-Core runs experts under TP: their token masks hold the parts)
        options.update(tp=tp, sequence_parallel=True)
    if etp != tp and (dp * tp) % (ep * etp) == 0:
        options.update(etp=etp)
    if draw(st.booleans()):
        options.update(distributed_optimizer=True)
    workload = MOE.format(experts=experts, top_k=draw(st.integers(1, 2)), shared=draw(st.integers(0, 1)),
                          routing=routing)
    cluster = f"{world // gpus}x{gpus}xA100-80GB" if world % gpus == 0 else f"{world}xA100-80GB"
    return cluster, workload, dp * pp * draw(st.integers(1, 2)), options


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(moe_configs())
def test_folded_moe_steps_are_the_full_steps(config):
    """A folded replica holds the ep x etp ranks of a stage that exchange tokens and whole TP groups
    (`hybrid.replica_grid`); its all-to-alls load the folded links once per replica, and the
    expert-data-parallel all-reduces span the folded replicas alike (under TP, their gradients' masks over
    sample parts relabelled part by part)."""
    cluster, workload, batch, options = config
    full, folded = both("strategies.hybrid", cluster, workload, batch, **options)
    assert full.correct, full.problems
    tp = options.get("tp", 1)
    width = math.lcm(options.get("ep", 1) * options.get("etp", tp), tp)
    copies = options["dp"] * tp // width
    if folded.representatives is None:  # (the nodes cut the grid unevenly: not folded, the same run)
        assert Fold.build(Cluster.parse(cluster), ReplicaGrid(copies, width))[0] is None
        return
    assert len(set(folded.representatives)) * copies == full.cluster.world_size
    assert_same(full, folded)


def test_moe_steps_whose_replicas_route_differently_do_not_fold():
    """zipf draws each microbatch's expert ranking from its first sample, so replicas load their experts
    differently: not folded. Under TP they fold, the experts' gradients' masks over sample parts relabelled
    part by part."""
    zipf = MOE.format(experts=4, top_k=2, shared=0, routing="zipf:1.2")
    assert simulate("strategies.hybrid", "2x4xA100-80GB", zipf, 16, pp=2, ep=2).representatives is None
    uniform = MOE.format(experts=4, top_k=2, shared=0, routing="uniform")
    folded = simulate("strategies.hybrid", "2x4xA100-80GB", uniform, 16, pp=2, ep=2)
    # 8 ranks, pp=2: dp=4 replicas a stage, EP groups of 2 replicas: two folded replicas of 2 ranks a stage
    assert sorted(set(folded.representatives)) == [0, 1, 4, 5]
    # 16 ranks, pp=2, tp=2: dp=4, EP groups of 2 replicas x 2 TP ranks (etp = tp): two folded replicas of 4
    # ranks a stage
    under_tp = simulate("strategies.hybrid", "4x4xA100-80GB", uniform, 16, pp=2, ep=2, tp=2, sequence_parallel=True)
    assert sorted(set(under_tp.representatives)) == [0, 1, 2, 3, 8, 9, 10, 11]


def test_an_moe_step_that_drops_an_expert_update_reads_as_the_full_step(monkeypatch):
    """A problem with the representatives' experts runs the step again unfolded, for the full step's lines."""
    from dist_lib.model.experts import MoEModel
    real = MoEModel.set_final_experts

    def skip_rank_one(self, layer, weight):
        if self.rank != 1:
            real(self, layer, weight)

    monkeypatch.setattr(MoEModel, "set_final_experts", skip_rank_one)
    workload = MOE.format(experts=4, top_k=2, shared=0, routing="uniform")
    full, folded = both("strategies.hybrid", "2x4xA100-80GB", workload, 16, pp=2, ep=2)
    assert not full.correct and folded.representatives is None
    # rank 1 holds experts 2-3 of replica 1 (EP groups of replicas 0-1 and 2-3 a stage); rank 3 its copy
    assert folded.problems == full.problems == ["layer 0: rank 1 loaded experts 2-3 but did not hand them in updated"]


# ---- what never folds ------------------------------------------------------------------------------

def test_heterogeneous_clusters_and_per_replica_shares_never_fold():
    mixed = simulate("strategies.ddp", "1x4xA100-80GB+1x4xV100-32GB", "toy:layers=4", 16, microbatch_size=1)
    assert mixed.representatives is None
    shares = simulate("strategies.hetero", "1x4xA100-80GB+1x4xT4", "toy:layers=8", 16, dp=2, pp=4)
    assert shares.representatives is None
    planned = simulate("strategies.planned", "2x4xA100-80GB", "toy:layers=8", 16)
    assert planned.representatives is None
    unfolded = simulate("strategies.ddp", "2x4xA100-80GB", "toy:layers=4", 16, microbatch_size=1, fold=False)
    assert unfolded.representatives is None


async def _undeclared(model, microbatch_size: int = 1):
    from strategies import ddp
    await ddp.train(model, microbatch_size=microbatch_size)


def test_a_strategy_that_declares_nothing_does_not_fold():
    assert simulate(_undeclared, "2x4xA100-80GB", "toy:layers=4", 16).representatives is None


async def _skips_layer_zero(model):
    """DDP that hands in layer 0 without updating it: an incorrect step, the same verdict folded or not."""
    rank, n = model.rank, model.world_size
    weights = [model.load_weights(layer) for layer in range(model.num_layers)]
    share = model.global_batch_size // n
    x = model.get_input_activation(range(rank * share, (rank + 1) * share))
    inputs = []
    for layer, (w, _) in enumerate(weights):
        inputs.append(x)
        x = model.forward(layer, x, w)
    grad = model.loss(x)
    for layer in reversed(range(model.num_layers)):
        w, opt = weights[layer]
        wg, grad = model.backward(layer, inputs.pop(), grad, w)
        if layer:
            new, _ = model.update(layer, await model.all_reduce(wg), w, opt)
            model.set_final_weight(layer, new)
        else:
            model.set_final_weight(layer, w)


_skips_layer_zero.replica_grid = lambda world_size, batch, **options: ReplicaGrid(world_size)


def test_an_incorrect_step_has_the_same_verdict_folded():
    full, folded = both(_skips_layer_zero, "2x4xA100-80GB", "toy:layers=3", 16)
    assert folded.representatives is not None
    assert not full.correct and full.problems[0] == "layer 0: rank 0 handed in a weight that was never updated"
    assert len(full.problems) == 8
    assert_same(full, folded)


async def _sends_across(model):
    """Declares folding, then sends from replica 0 to replica 1: the fold breaks and the step runs unfolded."""
    from strategies import ddp
    if model.rank == 0:
        await model.send(model.get_input_activation([0]), 1)
    elif model.rank == 1:
        await model.recv(0)
    await ddp.train(model, microbatch_size=1)


_sends_across.replica_grid = lambda world_size, batch, **options: ReplicaGrid(world_size)


def test_a_broken_promise_runs_unfolded_with_the_full_results():
    full, folded = both(_sends_across, "2x4xA100-80GB", "toy:layers=3", 16)
    assert folded.representatives is None
    for key in FIGURES:
        assert getattr(folded, key) == getattr(full, key), key


def test_the_terminal_schedule_draws_a_folded_replica_as_its_representative():
    """A folded step has events for its representatives only; the schedule shows each other rank busy as
    its representative was (`1=0`), never idle, and says why under the table."""
    from rich.console import Console

    from grader.report_terminal import schedule_view
    result = simulate("strategies/ddp.py", "1x4xA100-80GB", "toy:layers=4", 8, microbatch_size=1)
    assert result.representatives == [0, 0, 0, 0]
    console = Console(width=100, record=True)
    console.print(schedule_view(result, 40))
    text = console.export_text()
    rows = {line.split()[0]: line.split()[1] for line in text.splitlines()
            if line.strip() and line.split()[0] in ("0", "1=0", "2=0", "3=0")}
    assert len(rows) == 4 and len(set(rows.values())) == 1 and set(rows["0"]) != {"·"}
    assert "rank r is a folded replica of rank k" in text


def test_the_kept_check_of_a_folded_step_checks_the_representatives_first():
    """`check_kept_folded` gives `check_kept`'s lines: the representatives alone only where every piece is
    whole (so each replica's records are its representative's), else the whole step."""
    from types import SimpleNamespace

    from dist_lib.model.correctness import check_kept
    from dist_lib.run.folding import check_kept_folded

    fold = SimpleNamespace(reps=[0, 1], grid=ReplicaGrid(4, 2))  # two ranks a replica, four replicas
    whole = (0, 0b1, 1, 0, 1)

    def handed(rank, layer, shards=0b1, num_shards=1):
        return (rank, layer, 1, 0b1111, shards, num_shards, 0, 1)

    loaded = [[whole, (1, 0b1, 1, 0, 1)], [whole]] * 4
    finals = [record for r in range(8) for record in (handed(r, 0), handed(r, 1))]
    assert check_kept_folded(loaded, finals, fold) == [] == check_kept(loaded, finals)
    # a representative's problem: every rank's line, as unfolded (rank 1 and its replicas loaded layer 1 too)
    loaded = [[whole, (1, 0b1, 1, 0, 1)]] * 8
    finals = [handed(r, 0) for r in range(8)] + [handed(r, 1) for r in range(0, 8, 2)]
    assert check_kept_folded(loaded, finals, fold) == check_kept(loaded, finals)
    assert len(check_kept(loaded, finals)) == 4 and "rank 7 loaded" in check_kept(loaded, finals)[-1]
    # sharded pieces: no shortcut, a replica's own records are read (here one the representatives' do not
    # account for: rank 6 hands in shard 1 where it loaded shard 0)
    loaded = [[(0, 0b01, 2, 0, 1)]] * 8
    finals = [handed(r, 0, 0b01, 2) for r in range(6)] + [handed(6, 0, 0b10, 2), handed(7, 0, 0b01, 2)]
    assert check_kept_folded(loaded, finals, fold) == check_kept(loaded, finals) != []
