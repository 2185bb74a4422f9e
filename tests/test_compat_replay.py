"""`--api puzzles|lab` runs are graded by re-executing their recorded toy-API calls in the grader
(`dist_lib.compat.recording` in the worker, `dist_lib.compat.replay` in the grader): every honest file
the tests use gets exactly the direct run's figures, a program out of shape is refused naming its rank
and entry, and a run whose calls cannot be recorded is taken as reported, marked unverified with why."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from dist_lib.compat import CompatDeadlockError, run_file
from dist_lib.compat.recording import record_file
from dist_lib.compat.replay import ProgramError, ReplayTimeout, replay
from grader.grade import grade_run
from grader.report_terminal import compat_lines
from grader.runner import sandbox_problem
from grader.scenario import Scenario

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS, NOTEBOOKS = ROOT / "tests" / "compat_solutions", ROOT / "tests" / "compat_notebooks"
ORIGINAL = Scenario(name="run", cluster="2xA100-80GB", workload="toy", global_batch=8, options={}, given=())
REAL = Scenario(name="run", cluster="2xH100-80GB+2xA100-80GB", workload="toy", global_batch=8, options={},
                given=("cluster",))

# every solution file and notebook the compat tests run, by (file, api, function, scenario)
CASES = [*[("puzzles_solutions.py", "puzzles", fn, ORIGINAL) for fn in
           ("basic", "grad_accum", "ddp", "wsdp", "fsdp", "pipeline", "gpipe", "pipeline_fsdp")],
         ("puzzles_default_model.py", "puzzles", None, ORIGINAL),
         *[("lab_solutions.py", "lab", fn, ORIGINAL) for fn in
           ("train_ddp", "part1_training_loop", "part2_training_loop", "part3_training_loop", None)],
         *[("lab_course_styles.py", "lab", fn, ORIGINAL) for fn in
           ("part1_training_loop", "part2_training_loop", "part3_training_loop", None)],
         *[(f"../compat_notebooks/{name}", "puzzles", None, ORIGINAL) for name in
           ("puzzles_notebook.ipynb", "puzzles_notebook_export.py", "puzzles_notebook_light.py",
            "puzzles_notebook_percent.py")],
         ("../compat_notebooks/colab_drive_notebook.ipynb", "puzzles", "basic", ORIGINAL),
         ("puzzles_solutions.py", "puzzles", "ddp", REAL), ("lab_solutions.py", "lab", "train_ddp", REAL)]


@pytest.mark.parametrize("name, api, function, scenario", CASES,
                         ids=[f"{Path(c[0]).name}-{c[2] or 'own'}-{c[3].given or 'original'}" for c in CASES])
def test_a_graded_run_has_the_direct_runs_figures(tmp_path, name, api, function, scenario):
    path = SOLUTIONS / name
    direct = run_file(path, api=api, function=function, check=False, exact_memory=True,
                      cluster=scenario.cluster if scenario.given else None)
    row, result = grade_run(str(path), scenario.to_dict(), {"timeout_s": 60}, str(tmp_path / "t.json"), plots=False,
                            api=api, function=function, confine=sandbox_problem() is None)
    assert row["status"] == "ok", row["error"]
    assert result.options["verified"] is True and row["strategy"] == path.stem
    assert (row["time_s"], row["memory_bytes"], row["correct"]) == (direct.time_s, direct.memory_bytes, direct.correct)
    assert result.options["notebook"] == direct.options["notebook"] and result.rank_times == direct.rank_times


@pytest.fixture(scope="module")
def basic():
    """The recorded program of puzzle 0 (1 rank, 2 layers, 4 batches), through JSON as it travels."""
    _, program, reason = record_file(SOLUTIONS / "puzzles_solutions.py", "puzzles", function="basic", check=False,
                                     exact_memory=True)
    assert reason is None
    return json.loads(json.dumps(program))


def _replayed(program, function="basic"):
    return replay(program, SOLUTIONS / "puzzles_solutions.py", "puzzles", function, deadline_s=30)


def _entry(program, name):
    entries = program["models"][0][3]
    return next(j for j, e in enumerate(entries) if e[0] == "op" and e[1] == name)


def test_the_recorded_program_replays_to_the_notebooks_figures(basic):
    result = _replayed(basic)
    assert (result.notebook_time, result.notebook_memory, result.correct) == (16.5, 2621440.0, True)


def test_a_programs_options_cannot_relabel_the_run(basic):
    """The options travel in the program, the sandboxed file's data: the API, the timing and the figures
    the result states are the replay's own, and a forged "unverified" reason does not stand beside them."""
    program = copy.deepcopy(basic)
    program["options"] = {**program["options"], "api": "lab", "timing": "real", "unverified": "forged"}
    result = _replayed(program)
    assert (result.options["api"], result.options["timing"], result.options["verified"]) == ("puzzles", "original",
                                                                                             True)
    assert "unverified" not in result.options and result.options["notebook"]["time"] == 16.5


def _forward_first_arg(program, value):
    j = _entry(program, "forward")
    program["models"][0][3][j][2][1] = value
    return j


@pytest.mark.parametrize("edit, words", [
    (lambda p: _forward_first_arg(p, ["h", 999]),
     "rank 0, entry {j} (forward): handle 999 is used before it is defined"),
    (lambda p: _forward_first_arg(p, 7), "rank 0, entry {j} (forward): argument 2 must be a handle (of a Activation)"),
    (lambda p: p["models"][0][3].insert(0, ["jump", 3]) or 0, "rank 0, entry {j}: 'jump' is not an entry"),
    (lambda p: p["models"][0][3].insert(0, ["op", "all_reduce", [], 0, None]) or 0,
     "rank 0, entry {j}: 'all_reduce' is not an op of the puzzles API's Model"),
    (lambda p: p["models"][0][3].insert(0, ["op", "loss", [], 1, None]) or 0,
     "rank 0, entry {j} (loss): expected 1 argument"),
    (lambda p: p["models"][0][3].insert(0, ["lit", 0, [0, 2, 2**60, ["fs", [0]], 1]]) or 0,
     "rank 0, entry {j}: the number 1152921504606846976 is out of range"),
    (lambda p: p["models"][0][3].insert(0, ["mem", [[2, [5], [], []]]]) or 0,
     "rank 0, entry {j}: deletes key 5 from activations, which does not hold it"),
    (lambda p: p["models"][0].__setitem__(1, 1) or 0, "basic runs on 1 ranks of 2 layers and 4 batches"),
])
def test_a_program_out_of_shape_is_refused_naming_rank_and_entry(basic, edit, words):
    program = copy.deepcopy(basic)
    j = edit(program)
    with pytest.raises(ProgramError) as error:
        _replayed(program)
    assert words.format(j=j) in str(error.value)


def test_a_tensor_of_the_wrong_kind_is_refused_as_it_is_bound(basic):
    program = copy.deepcopy(basic)
    j = _entry(program, "forward")
    weight = program["models"][0][3][j][2][2]
    program["models"][0][3][j][2][1] = weight  # the layer's weight where its input activation goes
    with pytest.raises(ProgramError, match=rf"rank 0, entry {j} \(forward\): argument 2 is a Weight, not the "
                                           r"Activation the op takes"):
        _replayed(program)


def test_a_program_that_claims_the_wrong_number_of_outputs_is_refused(basic):
    program = copy.deepcopy(basic)
    j = _entry(program, "forward")
    program["models"][0][3][j][3] = 2
    with pytest.raises(ProgramError, match=rf"rank 0, entry {j} \(forward\): the program says its result holds 2 "
                                           r"tensors; it holds 1"):
        _replayed(program)


def test_a_program_that_waits_forever_fails_as_a_deadlock():
    program = {"api": "puzzles", "function": "main", "options": {}, "ranks": 2,
               "models": [[0, 2, 4, [["op", "receive", [], 1, None]], []], [1, 2, 4, [], []]]}
    with pytest.raises(CompatDeadlockError, match="rank 0, entry 0 \\(receive\\): deadlock"):
        _replayed(program, None)


def test_a_replay_past_its_deadline_stops(basic):
    with pytest.raises(ReplayTimeout):
        replay(basic, SOLUTIONS / "puzzles_solutions.py", "puzzles", "basic", deadline_s=0)


CONCURRENT = '''from lib import Model
import asyncio


async def ddp(model):
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    per = model.BATCHES // model.RANKS
    for layer in range(model.LAYERS):
        weights[layer], opt_states[layer] = model.load_weights(layer)
    activations[0] = model.get_activation(range(model.rank * per, (model.rank + 1) * per))
    for layer in range(model.LAYERS):
        activations[layer + 1] = model.forward(layer, activations[layer], weights[layer])
    grad_activations[model.LAYERS] = model.loss(activations[model.LAYERS])
    for layer in reversed(range(model.LAYERS)):
        grad_weights[layer], grad_activations[layer] = model.backward(
            layer, activations[layer], grad_activations[layer + 1], weights[layer])
    # every layer's all-reduce at once, on one model: their order on its clock is the interleaving's
    reduced = await asyncio.gather(*[model.allreduce(grad_weights[layer], layer) for layer in range(model.LAYERS)])
    for layer in range(model.LAYERS):
        grad_weights[layer] = reduced[layer]
        weights[layer], opt_states[layer] = model.update(layer, grad_weights[layer], weights[layer], opt_states[layer])
        model.set_final_weight(layer, weights[layer])
'''


def test_a_run_whose_calls_cannot_be_recorded_is_graded_as_reported_and_unverified(tmp_path):
    path = tmp_path / "concurrent.py"
    path.write_text(CONCURRENT)
    direct = run_file(path, api="puzzles", function="ddp", check=False, exact_memory=True)
    row, result = grade_run(str(path), ORIGINAL.to_dict(), {"timeout_s": 60}, str(tmp_path / "t.json"), plots=False,
                            api="puzzles", function="ddp", confine=sandbox_problem() is None)
    assert row["status"] == "ok" and result.options["verified"] is False
    assert result.options["unverified"] == ("rank 0 called allreduce while its allreduce was pending (a model's ops "
                                            "share its clock; the program runs them one at a time)")
    assert (row["time_s"], row["memory_bytes"]) == (direct.time_s, direct.memory_bytes)
    lines = compat_lines(row, "puzzles", None)
    assert lines[-1] == ("  [dim]verified      no: the run's calls could not be recorded for the grader to re-execute "
                         "(rank 0 called allreduce while its allreduce was pending (a model's ops share its clock; "
                         "the program runs them one at a time)); its figures are as it reported them[/]")


ODD = '''from lib import Model, WeightGrad, Weight


def basic(model):
    """Puzzle 0, written to use every kind of entry a program has."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    layers = model.LAYERS
    for layer in range(layers):
        weights[layer], opt_states[layer] = model.load_weights(layer, total=1, shard=0)  # keywords
    activations[0] = model.get_activation(range(model.BATCHES))
    activations["spare"] = spare = model.get_activation([0])
    spare.batches = frozenset([0, 1])  # written in place while stored
    for layer in range(layers):
        activations[layer + 1] = model.forward(layer, activations[layer], weights[layer])
    dict.__setitem__(activations, "hidden", model.get_activation([1, 2]))  # past the dict's methods
    del activations["spare"]
    activations["spare"] = activations.pop(0)  # stored again: now last
    try:
        model.forward(0, activations[1], weights[0])  # the wrong layer's input: raises, and is caught
    except AssertionError:
        pass
    grad_activations[layers] = model.loss(activations[layers])
    for layer in reversed(range(layers)):
        inp = activations[layer] if layer else activations["spare"]
        g, grad_activations[layer] = model.backward(layer, inp, grad_activations[layer + 1], weights[layer])
        half = WeightGrad(layer, layers, frozenset([0, 1]), model.BATCHES)  # built by hand
        total = (g + half) + WeightGrad(layer, layers, frozenset([3]), model.BATCHES)  # sums
        total.batches = total.batches | {2}  # written in place after it was made
        grad_weights[layer] = total.shard(0, 2).combine(total.shard(1, 2))  # shards combined again
    for layer in range(layers):
        weights[layer], opt_states[layer] = model.update(layer, grad_weights[layer], weights[layer],
                                                         opt_states[layer], shard=0)
        model.set_final_weight(layer, weights[layer])
    model.final_weights[layers + 3] = Weight(0, layers, 7)  # beyond the layers: not the check's business
    return model
'''


def test_a_file_that_uses_every_kind_of_entry_replays_to_its_direct_figures(tmp_path):
    path = tmp_path / "odd.py"
    path.write_text(ODD)
    direct = run_file(path, api="puzzles", function="basic", check=False, exact_memory=True)
    _, program, reason = record_file(path, "puzzles", function="basic", check=False, exact_memory=True)
    assert reason is None
    kinds = {e[0] if e[0] != "op" else e[1] for e in program["models"][0][3]}
    assert {"lit", "call", "set", "mem", "forward", "load_weights"} <= kinds
    assert [e[:2] + e[3:] for e in program["models"][0][3] if e[:2] == ["op", "forward"]] == \
        [["op", "forward", 1, None]] * 2 + [["op", "forward", -1, None]]  # the last raised, and was caught
    result = replay(json.loads(json.dumps(program)), path, "puzzles", "basic", deadline_s=30)
    assert (result.time_s, result.memory_bytes, result.notebook_memory, result.correct, result.problems) == \
        (direct.time_s, direct.memory_bytes, direct.notebook_memory, direct.correct, direct.problems)
    assert result.timelines == direct.timelines and direct.correct


REFUSED = '''from lib import Model


async def part1_training_loop(model, batch_size):
    """A lab step that tries an update with a gradient it just took out of storage, catches the refusal,
    and then does the step right."""
    weights, opt_states, activations, grad_activations, grad_weights = model.storage()
    layers = model.num_layers
    for layer in range(layers):
        weights[layer], opt_states[layer] = model.load_weights(layer)
    activations[0] = model.get_input_activation(range(model.global_batch_size))
    for layer in range(layers):
        activations[layer + 1] = model.forward(layer, activations[layer], weights[layer])
    grad_activations[layers] = model.loss(activations[layers])
    for layer in reversed(range(layers)):
        grad_weights[layer], grad_activations[layer] = model.backward(
            layer, activations[layer], grad_activations[layer + 1], weights[layer])
    model.log_event("note")  # an event: its storage holds every gradient
    g = grad_weights.pop(0)
    try:
        model.update(0, g, weights[0], opt_states[0])  # refused: g is no longer stored
    except AssertionError:
        pass
    grad_weights[0] = g
    for layer in range(layers):
        weights[layer], opt_states[layer] = model.update(layer, grad_weights[layer], weights[layer], opt_states[layer])
        model.set_final_weight(layer, weights[layer])
'''


def test_an_op_that_was_refused_is_refused_again_on_the_storage_it_saw(tmp_path):
    """The lab's update checks that its operands are stored before it logs its event: the program holds the
    storage as the refused call saw it, so the replay refuses it too (and logs no update event)."""
    path = tmp_path / "refused.py"
    path.write_text(REFUSED)
    direct = run_file(path, api="lab", function="part1_training_loop", check=False, exact_memory=True)
    _, program, reason = record_file(path, "lab", function="part1_training_loop", check=False, exact_memory=True)
    result = replay(json.loads(json.dumps(program)), path, "lab", "part1_training_loop", deadline_s=30)
    assert reason is None and direct.correct
    updates = [e for e in result.raw_events if e[0] == 0 and e[1] == "update"]
    assert len(updates) == 4 and result.rank_times == direct.rank_times and result.time_s == direct.time_s


def test_a_program_too_large_to_hand_back_is_a_clear_failure(monkeypatch):
    from grader import _worker
    from grader.runner import isolation
    monkeypatch.setattr(isolation, "HEADER_BYTES", 2**16 + 1000)  # room for a program of 1000 bytes
    job = {"strategy": str(SOLUTIONS / "puzzles_solutions.py"), "api": "puzzles", "function": "gpipe"}
    with pytest.raises(_worker._TooLarge, match=r"the recorded program takes .* MiB, over the .* MiB a --api run "
                                                r"may hand back"):
        _worker._run_compat(job, ORIGINAL.to_dict(), {})
