"""The LLM-Training-Puzzles API: my solutions to all eight puzzles pass the check and, in unit-cost
mode, land on the puzzles' published targets (srush/LLM-Training-Puzzles, Distributed.ipynb)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dist_lib import DeadlockError, IncorrectStepError
from dist_lib.errors import StrategyError
from dist_lib.compat import CompatStrictWarning, api_modules, configure, detect_api, run_file
from dist_lib.compat import puzzles as P
from dist_lib.output.trace import chrome_trace, validate_trace

SOLUTIONS = Path(__file__).parent / "compat_solutions" / "puzzles_solutions.py"

# name: (published steps, published memory, exact steps on the diagram's axis, exact end, exact peak)
# The notebook reads its targets off the diagram, whose axis ends where the last event starts; exact
# values are derived by hand from the unit costs (forward/backward 1 per batch, update 0.5,
# collective 0.3, each end of a pass 0.2) and the memory units (layer 512*512, batch 512*256).
TARGETS = {
    "basic": (17, 2_600_000, 16.5, 17.0, 2_621_440),
    "grad_accum": (17, 2_000_000, 16.5, 17.0, 1_966_080),
    "ddp": (5, 1_800_000, 5.1, 5.6, 1_572_864),
    "wsdp": (20, 2_800_000, 19.9, 20.4, 2_621_440),
    "fsdp": (20, 2_300_000, 19.9, 20.4, 1_966_080),
    "pipeline": (66, 3_300_000, 66.9, 67.4, 2_621_440),
    "gpipe": (33, 4_100_000, 33.3, 33.8, 2_752_512),
    "pipeline_fsdp": (15, 1_000_000, 15.5, 16.0, 704_512),
}


@pytest.mark.parametrize("name", list(TARGETS))
def test_solution_is_correct_and_lands_on_the_published_targets(name):
    steps_target, memory_target, steps, end, peak = TARGETS[name]
    with api_modules("puzzles"):
        import importlib.util
        spec = importlib.util.spec_from_file_location("_p_sol", SOLUTIONS)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        models = asyncio.run(module.run(name))
    P.Model.check(models)
    got_steps, got_end, got_memory = P.stats(models)
    assert got_steps == pytest.approx(steps) and got_end == pytest.approx(end) and got_memory == peak
    assert abs(got_steps - steps_target) < 1  # the published step count, as the diagram shows it
    assert got_memory <= memory_target * 1.01


def test_run_file_gives_a_result_with_a_valid_trace():
    result = run_file(SOLUTIONS, function="gpipe")
    assert result.correct and result.options == {
        "api": "puzzles", "timing": "original",
        "notebook": {"time": pytest.approx(33.3), "memory": 2752512, "time_unit": "steps",
                     "memory_unit": "units"}}
    assert result.notebook_time == pytest.approx(33.3) and "33.3 steps" in repr(result)
    assert result.time_s == pytest.approx(33.8) and result.peak_memory_bytes == 2_752_512
    assert validate_trace(chrome_trace(result)) == []
    sends = [e for e in result.events if e.op == "send"]
    assert len(sends) == 3 * 4 * 2  # 3 hops x 4 microbatches x (forward + backward)


def test_real_timing_uses_the_cost_model():
    from dist_lib.costs import compute as costs
    from dist_lib.hardware.devices import DEVICES
    from dist_lib.workload.transformer import Workload
    result = run_file(SOLUTIONS, function="basic", timing="real", cluster="1xA100-80GB",
                      workload="toy:layers=2")
    a100, toy = DEVICES["A100-80GB"], Workload.parse("toy:layers=2")
    params = toy.layer_params(0)
    expected = 2 * costs.forward_time(a100, toy, 0, 4) + 2 * costs.backward_time(a100, toy, 0, 4) \
        + costs.loss_time(a100, toy, 4) + 2 * costs.update_time(a100, params)
    assert result.time_s == pytest.approx(expected)
    # the peak holds weights + optimizer (2 + 12 bytes/param), the stashes of both layers, the output
    stash = 4 * (toy.activation_bytes() + toy.stash_bytes(0))
    assert result.peak_memory_bytes == 2 * 14 * params + 2 * stash + 4 * toy.activation_bytes()


def test_heterogeneous_cluster_makes_the_slow_rank_late():
    fast = run_file(SOLUTIONS, function="ddp", timing="real", cluster="4xA100-80GB")
    mixed = run_file(SOLUTIONS, function="ddp", timing="real", cluster="2xA100-80GB+2xT4")
    assert mixed.time_s > 1.5 * fast.time_s  # the T4s hold everyone back at the all-reduces


def test_collective_mismatch_and_deadlock_raise_instead_of_hanging():
    async def mismatched(model):
        if model.rank == 0:
            await model.allreduce(model.fake_grad(0, [0]), 0)
        else:
            await model.allgather(model.load_weights(0, 1, 2)[0], 0)

    async def lonely(model):
        model.load_weights(0)  # a rank is known to the runtime from its first call
        if model.rank == 1:
            await model.receive()

    async def main(train):
        dist = P.Dist(2)
        await asyncio.wait_for(asyncio.gather(*[train(P.Model(r, dist, 1, 2)) for r in range(2)]), 5)

    with pytest.raises(AssertionError, match="rank 0 called allreduce but rank 1 called allgather"):
        asyncio.run(main(mismatched))
    with pytest.raises(DeadlockError, match="rank 1 waits in receive"):
        asyncio.run(main(lonely))


@pytest.mark.parametrize("runs", ["function", "main"])
def test_a_file_awaiting_an_event_nobody_sets_is_a_deadlock_naming_each_rank(tmp_path, monkeypatch, runs):
    import dist_lib.engine.waits

    monkeypatch.setattr(dist_lib.engine.waits, "HANG_CHECK_S", 0.001)
    path = tmp_path / "stuck.py"
    path.write_text(
        "import asyncio\n"
        "from lib import Dist, Model\n"
        "async def ddp(model):\n"
        "    model.load_weights(0)\n"
        "    if model.rank == 0:\n"
        "        await model.receive()\n"
        "    else:\n"
        "        await asyncio.Event().wait()\n"
        + ("async def main():\n"
           "    dist = Dist(2)\n"
           "    await asyncio.gather(*[ddp(Model(rank=r, dist=dist, layers=1, batches=2)) for r in range(2)])\n"
           if runs == "main" else ""))
    with pytest.raises(DeadlockError, match="the original API would hang here") as info:
        run_file(path, api="puzzles", function="ddp" if runs == "function" else None, ranks=2 if runs == "function"
                 else None)
    message = str(info.value)
    assert "rank 0 waits in receive" in message
    assert "rank 1 waits on an asyncio future (at stuck.py:8 in ddp)" in message


def test_wrong_step_is_reported():
    async def no_update(model):
        w, _ = model.load_weights(0)
        model.set_final_weight(0, w)
    with pytest.raises(AssertionError, match="step 0"):
        dist = P.Dist(1)
        m = P.Model(0, dist, 1, 1)
        asyncio.run(no_update(m))
        P.Model.check([m])


def test_gradient_sum_unites_batches_as_the_original_and_strict_mode_warns():
    g = P.WeightGrad(0, 1, frozenset({0}), 2)
    h = P.WeightGrad(0, 1, frozenset({1}), 2)
    assert (g + g).batches == {0} and (g + h).batches == {0, 1}
    with configure("puzzles", strict=True), pytest.warns(CompatStrictWarning, match=r"batches \[0\] is counted twice"):
        g + g
    with pytest.raises(AssertionError, match="same layer"):
        g + P.WeightGrad(1, 2, frozenset({1}), 2)


def test_detect_api():
    assert detect_api(SOLUTIONS.read_text()) == "puzzles"
    assert detect_api("from utils import get_training_stats\nmodel.get_input_activation([0])") == "lab"
    assert detect_api("print(1)") is None


def test_incorrect_file_raises(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from lib import Model\n\nasync def ddp(model):\n"
                   "    w, o = model.load_weights(0)\n    model.set_final_weight(0, w)\n")
    with pytest.raises(IncorrectStepError):
        run_file(bad, layers=1)
    assert not run_file(bad, layers=1, check=False).correct


def test_grader_style_call():
    result = run_file(SOLUTIONS, api="puzzles", function="ddp", cluster="4xA100-80GB", workload="toy",
                      global_batch_size=32, check=False, enforce_memory=True)
    assert result.correct and result.options["timing"] == "real" and result.cluster.world_size == 4


def test_deadlock_report_lists_who_is_missing_when_it_is_detected():
    async def rank_two_skips(model):
        model.load_weights(0)
        if model.rank != 2:
            await model.allreduce(model.fake_grad(0, [model.rank]), 0)

    async def main():
        dist = P.Dist(3)
        await asyncio.gather(*[rank_two_skips(P.Model(r, dist, 1, 3)) for r in range(3)])

    with pytest.raises(DeadlockError) as caught:
        asyncio.run(main())
    report = str(caught.value)
    # rank 0 arrived when ranks 1 and 2 were missing; by detection only rank 2 is
    assert "rank 0 waits in allreduce(layer 0) #0, waiting for ranks [2]" in report
    assert "rank 1 waits in allreduce(layer 0) #0, waiting for ranks [2]" in report and "rank 2 finished" in report


DEFAULT_MODEL = Path(__file__).parent / "compat_solutions" / "puzzles_default_model.py"


def test_a_model_on_the_default_dist_is_the_runs_result_run_after_run(capsys):
    """`Model(layers=2, batches=4)` (rank 1 on the default Dist(1)) as the original notebook's first example:
    each run reports its own model, in slot 0 as the original's draw() shows it. Hand-derived: 8 forward
    + 8 backward steps, updates at 16 and 16.5; peak at the second update = weights and optimizer states
    2 x 512^2 each, activations 0..2 and their gradients 6 x 4 x 512 x 256, weight gradients 2 x 512^2."""
    for _ in range(2):  # the original's default Dist is shared by the process; here each run has its own
        result = run_file(DEFAULT_MODEL, api="puzzles")
        assert result.strategy == "puzzles_default_model.main" and result.correct
        assert result.notebook_time == 16.5 and result.notebook_memory == 4_718_592
        assert len(result.raw_events) == 7 and {e[0] for e in result.raw_events} == {0}
        assert "Timesteps: 16.5 \nMaximum Memory: 4718592.0 at GPU: 0 time: 16" in capsys.readouterr().out


def test_a_model_on_the_default_dist_runs_in_real_timing():
    result = run_file(DEFAULT_MODEL, api="puzzles", timing="real")
    assert result.options["timing"] == "real" and result.correct and result.time_unit == "s"
    assert result.rank_times[0] > 0 and {e[0] for e in result.raw_events} == {0}


def test_status_names_the_types_as_the_original_notebook_prints_them(capsys):
    """The puzzles notebook's tour (its cells 3-10: batches 2 and 3 through two layers, loss, backward,
    then `del grad_activations[1]` and `model.status()`); the expected text is that cell's output as saved
    by a run on the original library (wkcn/LLM-Training-Puzzles, puzzles.ipynb, cell 10)."""
    model = P.Model(layers=2, batches=4)
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    activations[0] = model.get_activation(batches=[2, 3])
    for i in range(model.LAYERS):
        weights[i], opt_states[i] = model.load_weights(i)
    activations[1] = model.forward(layer=0, inp=activations[0], weight=weights[0])
    activations[2] = model.forward(layer=1, inp=activations[1], weight=weights[1])
    grad_activations[model.LAYERS] = model.loss(activations[model.LAYERS])
    grad_weights[1], grad_activations[1] = model.backward(1, activations[1], grad_activations[2], weights[1])
    grad_weights[0], grad_activations[0] = model.backward(0, activations[0], grad_activations[1], weights[0])
    print("Before memory:", model.memory())
    del grad_activations[1]
    print("After memory:", model.memory())
    model.status()
    assert capsys.readouterr().out == (
        "Before memory: 3145728.0\nAfter memory: 2883584.0\n0 <class 'lib.Weight'>,1 <class 'lib.Weight'>,"
        "0 <class 'lib.OptState'>,1 <class 'lib.OptState'>,0 <class 'lib.Activation'>,1 <class 'lib.Activation'>,"
        "2 <class 'lib.Activation'>,2 <class 'lib.ActivationGrad'>,0 <class 'lib.ActivationGrad'>,"
        "1 <class 'lib.WeightGrad'>,0 <class 'lib.WeightGrad'>,\n")


def test_a_name_lib_lacks_is_named_as_the_original_names_it(tmp_path):
    """The original says `cannot import name 'X' from 'lib'`; so does a file run here, not this project's
    module path."""
    path = tmp_path / "typo.py"
    path.write_text("from lib import Model, NoSuchThing\n\n\nasync def basic(model):\n    pass\n")
    with pytest.raises(StrategyError) as caught:
        run_file(path, api="puzzles", function="basic")
    assert str(caught.value) == (f"strategy file {path}: importing it raised ImportError: cannot import name "
                                 f"'NoSuchThing' from 'lib' (at typo.py:1 in <module>)")
