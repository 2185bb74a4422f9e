"""A framework search on GPUs with FP8 tensor cores weighs FP8 linear layers too, and the plan's `fp8` goes
through export and import unchanged, so the exported run gives the plan's simulated step."""

import pytest

from dist_lib import Cluster, Workload
from dist_lib.planner import plan
from dist_lib.planner.export import export
from dist_lib.planner.launch import Launch
from dist_lib.planner.plan import Plan

from tests.test_framework_plan import check_search

H100, LLAMA = "1x8xH100-80GB", "llama-3-8b:layers=4"


@pytest.mark.parametrize("framework, recipe", [("megatron", "delayed"), ("torchtitan", "tensorwise")])
def test_a_framework_search_on_h100_picks_fp8_and_the_round_trip_is_exact(framework, recipe):
    search, launch = check_search(H100, LLAMA, 32, framework)
    assert search.best.plan.fp8 == recipe and launch.fp8 == recipe
    # faster than the best 16-bit plan the same search simulated or estimated
    plain = [c.seconds for c in search.candidates if not c.plan.fp8]
    assert plain and search.best.seconds < min(plain)


def test_the_flags_name_the_recipe():
    cluster, workload = Cluster.load(H100), Workload.load(LLAMA)
    best = plan(cluster, workload, 32, framework="megatron", top=0).best.plan
    text = export(best, "megatron", workload, cluster).settings
    assert "--fp8-format hybrid" in text and "--fp8-recipe delayed" in text
    toml = export(best.__class__(**{**{f: getattr(best, f) for f in best.__slots__}, "fp8": "tensorwise"}),
                  "torchtitan", workload, cluster).settings
    assert 'converters = ["quantize.linear.float8"]' in toml and 'recipe_name = "tensorwise"' in toml


def test_without_a_framework_or_fp8_tensor_cores_no_plan_uses_fp8():
    assert not any(c.plan.fp8 for c in plan(H100, LLAMA, 32, top=0).candidates)
    assert not any(c.plan.fp8 for c in plan("1x8xA100-80GB", "gpt-1.3b:layers=4", 32, framework="megatron",
                                            top=0).candidates)


def test_a_plan_file_without_fp8_reads_as_16_bit_and_an_fp8_plan_keeps_it():
    cluster, workload = Cluster.load(H100), Workload.load(LLAMA)
    best = plan(cluster, workload, 32, framework="megatron", top=0).best.plan
    data = best.to_dict()
    assert data["fp8"] == "delayed" and Plan.from_dict(data) == best
    del data["fp8"]
    assert Plan.from_dict(data).fp8 == ""
    assert "fp8" not in Plan.from_dict(data).to_dict()


def test_fp8_that_a_framework_cannot_run_is_refused_in_one_line():
    cluster, workload = Cluster.load(H100), Workload.load(LLAMA)
    best = plan(cluster, workload, 32, framework="megatron", top=0).best.plan
    with pytest.raises(Exception, match="fp8 'delayed' has no torchtitan setting"):
        Launch.from_plan(best, "torchtitan", workload.num_layers)
    with pytest.raises(Exception, match="no FP8 tensor cores"):
        best.check(8, 4, 32, Cluster.load("1x8xA100-80GB"))
