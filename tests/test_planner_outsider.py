"""The planner as a user outside the project meets it: memory that binds on small devices, refusals that
must read right, budgets no plan meets, and the table's word against the simulator's."""

from __future__ import annotations

import pytest

from dist_lib import Cluster, SpecError, Workload, simulate
from dist_lib.planner import plan, space
from dist_lib.planner.evaluate import run_plan
from dist_lib.planner.plan import Plan
from dist_lib.planner.search import generate

ONE_LAYER = "gpt-1.3b:layers=1,seq=128"  # one layer beside the embedding: its gradient outweighs the stash


def _device(memory_gib: float) -> Cluster:
    """One GPU of a custom device with `memory_gib` GiB of memory."""
    return Cluster.from_dict({"devices": {"G": {"peak_tflops": 100, "memory_GiB": memory_gib, "hbm_GBps": 800,
                                                "intra_bandwidth_GBps": 25, "inter_bandwidth_GBps": 12.5}},
                              "nodes": [{"device": "G", "gpus": 1}]})


def test_the_estimate_counts_a_layers_gradient_twice_while_microbatches_accumulate():
    """Two microbatches on one GPU: while the second one's weight gradient is added to the first's, the
    layer's gradient is there twice. With one layer that is state (16 bytes a parameter) plus 2 more
    bytes a parameter; the simulator holds that, and the estimate must count no less."""
    cluster, workload = Cluster.load("1xA100-80GB"), Workload.load(ONE_LAYER)
    params = workload.layer_params(0)
    capacity = cluster.device_of(0).memory_bytes
    candidates, _ = generate(cluster, workload, 2, memory_reserve=None)  # shares of the whole device
    two = next(c for c in candidates if c.plan.microbatches == 2 and c.plan.recompute == "none")
    peak = run_plan(cluster, workload, 2, two.plan).memory_bytes[0]
    assert peak >= 18 * params  # weight 2 + gradient 2 + optimizer 12, and the second gradient 2
    assert two.memory * capacity >= peak * (1 - 1e-12)  # the estimate counts all of it (to rounding)
    # one microbatch sums nothing: no second copy, and the estimate stays below 18 bytes a parameter
    one = next(c for c in candidates if c.plan.microbatches == 1 and c.plan.recompute == "none")
    assert one.memory * capacity < 18 * params


def test_on_a_device_the_accumulated_gradient_overflows_the_estimate_only_plan_runs():
    """2.5 GiB (no runtime reserve): the state of one layer and the embedding (2.29 GiB) fits with one
    microbatch of two but not with the second gradient copy of two microbatches of one (2.58 GiB). The
    estimate once chose the latter, which the simulator then refused for memory. 2.3 GiB holds neither."""
    cluster = _device(2.5)
    found = plan(cluster, ONE_LAYER, 2, top=0, memory_reserve=None)
    assert found.best.plan.microbatches == 1
    result = simulate("strategies/planned.py", cluster, ONE_LAYER, 2, plan=found.best.plan)
    assert result.memory_bytes[0] <= found.best.memory * cluster.device_of(0).memory_bytes
    with pytest.raises(SpecError, match="no plan fits in memory"):
        plan(_device(2.3), ONE_LAYER, 2, top=0, memory_reserve=None)


def test_a_memory_refusal_shows_sizes_that_compare_as_they_read():
    """A 2.3 GiB device beside a 2.29 GiB state: shown to a tenth both read 2.3, and the device's size
    was once shown whole ("2 GiB"), under the state it was said to exceed."""
    with pytest.raises(SpecError) as caught:
        plan(_device(2.3), ONE_LAYER, 2, top=0)
    message = str(caught.value)
    assert "about 2.29 GiB a GPU, under the largest device's 2.3 GiB" in message
    with pytest.raises(SpecError, match=r"needs about 2\.3 GiB a GPU, beside the activations; the largest device "
                                        r"has 2\.2 GiB"):
        plan(_device(2.2), ONE_LAYER, 2, top=0)


def test_a_budget_no_node_meets_names_the_cheapest_node_and_its_price():
    """Within a budget a plan may rent part of a type, but whole nodes: under $10/h a node of four A100-80GB
    ($5.12/h each) does not fit, though one of its GPUs would, and the refusal says what the cheapest node
    costs; of two T4 nodes one is the least a plan can rent."""
    with pytest.raises(SpecError) as caught:
        plan("1x4xA100-80GB", "gpt-350m", 16, budget=10)
    assert "at least one node of the cheapest type, 4 x A100-80GB, at $20.48/h" in str(caught.value)
    with pytest.raises(SpecError, match=r"one node of the cheapest type, 2 x T4, at \$"):
        plan("1x4xA100-80GB+2x2xT4", "gpt-350m", 16, budget=1)


@pytest.mark.parametrize("cluster,workload,batch", [
    ("1x2xA100-80GB+1x1xV100-16GB+1x1xT4", "gpt-350m:layers=4", 7),
    ("2x2xA100-80GB:nics=1x0.05+1x2xV100-32GB", "gpt-350m:layers=4", 12),
])
def test_the_best_plan_written_and_run_again_takes_the_step_the_search_reports(cluster, workload, batch, tmp_path):
    """The file the search writes reads back to the same plan, and `planned.py` run on it simulates
    exactly the step time the table prints for it (a prime batch and a node NIC slower than the rest)."""
    found = plan(cluster, workload, batch, top=3)
    path = tmp_path / "plan.json"
    found.best.plan.save(path)
    assert Plan.load(path) == found.best.plan
    assert simulate("strategies/planned.py", cluster, workload, batch, plan=str(path)).time_s == found.best.seconds


def test_two_alike_gpus_on_nvlink_run_data_parallel_and_unlike_ones_share_by_speed():
    """A model that fits on one A100: two of them on NVLink split the batch evenly, data-parallel. An
    A100 and a V100 in one data-parallel stage take shares by speed: each replica one sample, and the
    six left cut by the speed ratio of a layer on each (A100 first, rounded to the larger remainder)."""
    best = plan("1x2xA100-80GB", "gpt-350m", 8, top=3).best.plan
    assert [(s.dp, s.tp, s.shares) for s in best.stages] == [(2, 1, (4, 4))]
    cluster, workload = Cluster.load("1xA100-80GB+1xV100-32GB"), Workload.load("gpt-350m:layers=4")
    fast, slow = (1 / space.layer_seconds(cluster.device_of(r), workload, 1, 4, 1) for r in (0, 1))
    ideal = 6 * fast / (fast + slow)
    assert 3 < ideal < 5
    assert space.shares(cluster, workload, (0, 1), 1, 8) == (1 + round(ideal), 1 + 6 - round(ideal))


@pytest.mark.parametrize("name", ["pareto.txt", "pareto"])
def test_a_plot_name_matplotlib_cannot_write_is_refused_before_the_search(name, tmp_path, capsys):
    """`--plot pareto.txt` once ran the whole search and then failed in matplotlib with a traceback; a
    bare `pareto` was written as `pareto.png` while the command said `pareto`."""
    from grader.cli import main
    out = tmp_path / "plan.json"
    assert main(["plan", "--cluster", "1x2xA100-80GB", "--workload", "toy:layers=2", "--batch", "4",
                 "--out", str(out), "--plot", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: --plot {tmp_path / name}: the Pareto plot is an image; give a name ending in "
                   ".png, .pdf, .svg, .eps, .ps, .jpg, .jpeg, .tif, .tiff")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(SpecError, match="plot x.txt: the Pareto plot is an image"):
        from dist_lib.planner.report import plot_pareto
        plot_pareto(plan("1x2xA100-80GB", "toy:layers=2", 4, top=0), "x.txt")


def test_a_plan_file_without_a_required_field_says_it_is_missing(tmp_path):
    """A hand-edited file that lost `microbatches` was told "microbatches must be a whole number >= 1,
    got None"; it now reads as missing, naming the file."""
    path = tmp_path / "plan.json"
    path.write_text('{"stages": [{"ranks": [0], "tp": 1, "blocks": [[0, 2]], "shares": [4]}], '
                    '"microbatch_size": 4}')
    with pytest.raises(SpecError) as caught:
        simulate("strategies/planned.py", "1xA100-80GB", "toy:layers=2", 4, plan=str(path))
    assert str(caught.value) == f"plan file {path}: missing field(s) microbatches"


def test_where_only_a_pipeline_of_few_microbatches_fits_the_search_still_finds_it():
    # 4 T4s, 7 heads (no TP), a batch of 1: no data parallelism, so the one layout is four stages of one
    # microbatch, which the search sets aside (fewer microbatches than half the stages) unless nothing
    # else gives a plan; it used to answer "no plan"
    cluster, workload = Cluster.parse("1x4xT4"), Workload.parse("toy:layers=7,heads=7,hidden=448")
    candidates, reasons = generate(cluster, workload, 1)
    assert reasons == [] and candidates
    assert {len(c.plan.stages) for c in candidates} == {4}
    assert all(c.plan.microbatches == 1 for c in candidates)
    assert sorted(sum(b - a for a, b in s.blocks) for s in candidates[0].plan.stages) == [1, 2, 2, 2]
    result = simulate("strategies/planned.py", cluster, workload, 1)
    assert result.correct and result.time_s > 0
