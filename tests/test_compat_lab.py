"""The course-lab API: my DDP, ZeRO, pipeline and 1F1B solutions run unchanged, pass the check, and
cost what dist_lib's cost model says."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dist_lib import Cluster, Workload, costs
from dist_lib.compat import configure, run_file
from dist_lib.compat import lab as lab_api
from dist_lib.devices import DEVICES
from dist_lib.trace import chrome_trace, validate_trace

SOLUTIONS = Path(__file__).parent / "compat_solutions" / "lab_solutions.py"
H100 = DEVICES["H100-80GB"]
LAB = Workload("lab-h4096", 4, 4096, 32, 1024, 0)  # the lab's shape: hidden 4096, 1024 tokens


@pytest.fixture(scope="module")
def results():
    return {fn: run_file(SOLUTIONS, function=fn) for fn in
            ("train_ddp", "part1_training_loop", "part2_training_loop", "part3_training_loop")}


def test_every_part_is_a_correct_step_with_a_valid_trace(results):
    for name, result in results.items():
        assert result.correct, name
        assert result.options["api"] == "lab" and result.options["timing"] == "real"
        assert validate_trace(chrome_trace(result)) == [], name


def test_ddp_time_is_the_cost_models(results):
    # 4 ranks x 4 samples in microbatches of 2, then per layer one all-reduce of the 16-bit gradient
    # and one Adam update; every rank is alike, so no rank waits.
    link = Cluster.parse("4xH100-80GB").ring_link(range(4))
    params = LAB.layer_params(0)
    per_microbatch = 4 * costs.forward_time(H100, LAB, 0, 2) + costs.loss_time(H100, LAB, 2) \
        + 4 * costs.backward_time(H100, LAB, 0, 2)
    expected = 2 * per_microbatch + 4 * (costs.all_reduce_time(2 * params, 4, link) + costs.update_time(H100, params))
    assert results["train_ddp"].time_s == pytest.approx(expected, rel=1e-12)


def test_zero_holds_less_than_ddp_and_1f1b_less_than_the_whole_batch_pipeline(results):
    assert results["part1_training_loop"].peak_memory_bytes < results["train_ddp"].peak_memory_bytes / 2
    assert results["part3_training_loop"].peak_memory_bytes < results["part2_training_loop"].peak_memory_bytes
    assert results["part3_training_loop"].time_s < 0.75 * results["part2_training_loop"].time_s


def test_main_is_run_when_no_function_is_named(capsys):
    result = run_file(SOLUTIONS)
    assert result.strategy == "lab_solutions.main" and result.correct
    assert "Execution time" in capsys.readouterr().out


def test_training_stats_use_the_labs_units():
    with configure("lab", cluster="2xH100-80GB"):
        from dist_lib.compat import api_modules
        with api_modules("lab"):
            import importlib.util
            spec = importlib.util.spec_from_file_location("_lab_sol", SOLUTIONS)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)

            async def two_ranks():
                dist = lab_api.Dist(2)
                return await asyncio.gather(*[module.train_ddp(lab_api.Model(r, dist, 2, 4), 2) for r in range(2)])
            models = asyncio.run(two_ranks())
    time, memory, rank = lab_api.get_training_stats(models)
    # peak at backward(layer 0): weights and optimizer state of 2 layers, layer 1's gradient, and the
    # 2-sample input of layer 0 plus the gradient entering it; in elements, as the lab counts
    h2, act = 4096 * 4096, 4096 * 1024
    assert memory == 2 * 2 * h2 + h2 + 2 * 2 * act
    assert time == max(m.log[-1].time for m in models) > 0
    assert lab_api.get_model_theoretical_best_time(models[0]) == pytest.approx(
        3 * (24 * 1024 * 4096**2 + 4 * 1024**2 * 4096) * 2 * 4 / (2 * H100.peak_flops))


def test_tensors_must_be_in_the_storage_dicts():
    async def sloppy(model):
        w, _ = model.load_weights(0)
        model.forward(0, model.get_input_activation([0]), w)
    with pytest.raises(AssertionError, match="not in model.activations"):
        asyncio.run(sloppy(lab_api.Model(0, lab_api.Dist(1), 1, 1)))


def test_heterogeneous_cluster(results):
    mixed = run_file(SOLUTIONS, function="train_ddp", cluster="2xH100-80GB+2xA100-80GB")
    assert mixed.correct and mixed.time_s > results["train_ddp"].time_s * 2
    assert mixed.cluster.device_of(3).name == "A100-80GB"
