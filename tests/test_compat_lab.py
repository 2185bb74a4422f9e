"""The course-lab API: solutions run unchanged, pass the check, and cost what the lab's own cost model
says (hand-derived below from its formulas), or this simulator's costs with timing='real'."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from dist_lib import Cluster, Workload

from dist_lib.costs import compute as costs

from dist_lib.costs import network
from dist_lib.compat import CompatStrictWarning, api_modules, configure, run_file
from dist_lib.compat import lab as lab_api
from dist_lib.compat import lab_utils
from dist_lib.hardware.devices import DEVICES
from dist_lib.output.trace import chrome_trace, validate_trace

SOLUTIONS = Path(__file__).parent / "compat_solutions" / "lab_solutions.py"
H100 = DEVICES["H100-80GB"]
LAB = Workload("lab-h4096", 4, 4096, 32, 1024, 0)  # the lab's shape: hidden 4096, 1024 tokens
H2, HB = 4096 * 4096, 4096 * 1024  # elements of a layer's weight and of one sample's activation


@pytest.fixture(scope="module")
def results():
    return {fn: run_file(SOLUTIONS, function=fn) for fn in
            ("train_ddp", "part1_training_loop", "part2_training_loop", "part3_training_loop")}


def test_every_part_is_a_correct_step_with_a_valid_trace(results):
    for name, result in results.items():
        assert result.correct, name
        assert result.options["api"] == "lab" and result.options["timing"] == "original"
        assert validate_trace(chrome_trace(result)) == [], name


def test_ddp_time_memory_and_mfu_are_the_labs(results):
    # 4 ranks x 4 samples in microbatches of 2; the lab's roofline on calculon's H100 figures:
    load = 2 * H2 / (450e9 * 0.9)  # 32 MiB from host memory at 90 % of 450 GB/s
    fwd = 2 * H2 * 2048 / (1e15 * 0.9)  # 69 GFLOP at 90 % of 1 PFLOP/s (HBM traffic takes less)
    all_reduce = 1e-5 + (2 * H2 * 5 / 4) / (450e9 * 0.65)  # in one NVLink domain: 1 + 1/p of the bytes
    update = 3 * H2 * 2 / (3072e9 * 0.9)  # 96 MiB of HBM traffic at 90 %
    end = 4 * load + 2 * 8 * fwd + 4 * (all_reduce + update)
    ddp = results["train_ddp"]
    assert ddp.time_s == pytest.approx(end, rel=1e-12)
    assert ddp.notebook_time == pytest.approx(end - update, rel=1e-12)  # the last event's start
    # peak at the second microbatch's loss: 4 layers of weights, optimizer state and summed gradients,
    # and the 2-sample activations entering layers 0..4
    assert ddp.peak_memory_bytes == 12 * H2 + 5 * 2 * HB and ddp.memory_unit == "elements"
    best = 4 * H2 * 16 * 1024 * 4 / (1e15 * 4)  # the lab's theoretical best time
    assert ddp.mfu == pytest.approx(best / ddp.notebook_time, rel=1e-12)


def test_zero_holds_less_than_ddp_and_1f1b_less_than_the_whole_batch_pipeline(results):
    assert results["part1_training_loop"].peak_memory_bytes < results["train_ddp"].peak_memory_bytes
    assert results["part3_training_loop"].peak_memory_bytes < results["part2_training_loop"].peak_memory_bytes


def test_real_timing_uses_the_simulators_cost_model():
    result = run_file(SOLUTIONS, function="train_ddp", timing="real")
    assert result.options["timing"] == "real" and result.memory_unit == "bytes"
    link = Cluster.parse("4xH100-80GB").ring_link(range(4))
    params = LAB.layer_params(0)
    per_microbatch = 4 * costs.forward_time(H100, LAB, 0, 2) + costs.loss_time(H100, LAB, 2) \
        + 4 * costs.backward_time(H100, LAB, 0, 2)
    expected = 2 * per_microbatch + 4 * (network.all_reduce_time(2 * params, 4, link) + costs.update_time(H100, params))
    assert result.time_s == pytest.approx(expected, rel=1e-12)
    assert result.mfu == pytest.approx(result.model_flops / (result.time_s * result.peak_flops))


def test_heterogeneous_cluster_in_real_timing():
    fast = run_file(SOLUTIONS, function="train_ddp", timing="real")
    mixed = run_file(SOLUTIONS, function="train_ddp", cluster="2xH100-80GB+2xA100-80GB")
    assert mixed.options["timing"] == "real" and mixed.correct
    assert mixed.time_s > fast.time_s * 2 and mixed.cluster.device_of(3).name == "A100-80GB"


def test_main_is_run_when_no_function_is_named(capsys):
    result = run_file(SOLUTIONS)
    assert result.strategy == "lab_solutions.main" and result.correct
    assert "Execution time" in capsys.readouterr().out


def test_training_stats_use_the_labs_units():
    with configure("lab", timing="original"), api_modules("lab"):
        spec = importlib.util.spec_from_file_location("_lab_sol", SOLUTIONS)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)

        async def two_ranks():
            dist = lab_api.Dist(2)
            return await asyncio.gather(*[module.train_ddp(lab_api.Model(r, dist, 2, 4), 2) for r in range(2)])
        models = asyncio.run(two_ranks())
    time, memory, rank = lab_utils.get_training_stats(models)
    # peak at backward(layer 0): weights and optimizer state of 2 layers, layer 1's gradient, and the
    # 2-sample input of layer 0 plus the gradient entering it; in elements, as the lab counts
    assert memory == 2 * 2 * H2 + H2 + 2 * 2 * HB
    assert time == max(m.log[-1].time for m in models) > 0
    assert lab_utils.get_model_theoretical_best_time(models[0]) == 4 * H2 * 4 * 1024 * 2 / (1e15 * 2)


def test_tensors_must_be_in_the_storage_dicts():
    async def sloppy(model):
        w, _ = model.load_weights(0)
        model.forward(0, model.get_input_activation([0]), w)
    with pytest.raises(AssertionError, match="not in model.activations"):
        asyncio.run(sloppy(lab_api.Model(0, lab_api.Dist(1), 1, 1)))


def test_main_runs_the_files_own_configuration_unless_a_function_or_set_up_is_named(capsys):
    styles = SOLUTIONS.parent / "lab_course_styles.py"
    own = run_file(styles)  # main(): 4 ranks, 8 layers, batch 32 in microbatches of 4, 1F1B
    assert own.strategy == "lab_course_styles.main" and own.cluster.world_size == 4 and own.global_batch_size == 32
    same = run_file(styles, function="part3_training_loop", ranks=4, layers=8, batches=32, batch_size=4)
    assert same.notebook_time == own.notebook_time and same.memory_bytes == own.memory_bytes
    assert "MFU:" in capsys.readouterr().out  # main() printed its own figures
    forced = run_file(styles, main=True, ranks=2)  # main=True wins over a named set-up
    assert forced.cluster.world_size == 4
    with pytest.raises(Exception, match="no function 'nope'"):
        run_file(styles, function="nope")


def test_course_ddp_passes_as_in_the_original_and_strict_mode_warns_about_the_double_count():
    styles = SOLUTIONS.parent / "lab_course_styles.py"
    setup = dict(function="train_ddp", ranks=4, layers=2, batches=8, batch_size=2)  # one microbatch per rank
    assert run_file(styles, **setup).correct
    with pytest.warns(CompatStrictWarning, match=r"the gradient of samples \[\d+, \d+\] is counted twice"):
        assert run_file(styles, strict=True, **setup).correct
