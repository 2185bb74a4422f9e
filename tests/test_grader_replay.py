"""Recorded programs and their replay: the replay of an honest run is that run, an edited program is
graded as the program it is, and a malformed one is rejected naming the rank and entry."""

from __future__ import annotations

import inspect
import time
from array import array
from pathlib import Path

import pytest

from dist_lib import Activation, TensorError, Work, simulate
from dist_lib.errors import SimulationError, StrategyError
from dist_lib.run.recording import (ADD, ALL_REDUCE, AWAIT, DROP, FORWARD, INPUT, JOIN, LOAD, RECV, SPLIT, Handle,
                                record)
from dist_lib.run.replay import ProgramError, ReplayTimeout, replay
from dist_lib.workload.transformer import Workload
from grader.paths import trains_dense

ROOT = Path(__file__).resolve().parents[1]
CLUSTER, WORKLOAD, BATCH = "2x2xA100-80GB", "toy:layers=4", 8
BUILTIN = sorted(p for p in (ROOT / "strategies").glob("*.py") if not p.name.startswith("_"))
# the strategies that train mixtures of experts (they declare it: `grader.paths.trains_dense`) take this one:
# top-2 of 4 experts with a shared expert, skewed routing, every other layer an MoE layer
MOE_WORKLOAD = ("toy:layers=4,hidden=256,heads=4,seq=128,experts=4,top_k=2,expert_ffn_hidden=512,moe_every=2,"
                "dense_ffn_hidden=512,shared_experts=1,routing=zipf:1.2")
OPTIONS = {"ddp": {"microbatch_size": 1}, "zero": {"microbatch_size": 1}, "interleaved": {"pp": 2},
           "hybrid": {"pp": 2, "tp": 2, "selective_recompute": True, "tied_embeddings": True},
           "moe": {"ep": 2, "microbatch_size": 1}}
HONEST = str(ROOT / "tests" / "submissions" / "honest.py")


def _same(a, b) -> None:
    assert a.time_s == b.time_s and a.rank_times == b.rank_times
    assert a.memory_bytes == b.memory_bytes and a.hardware_flops == b.hardware_flops
    assert (a.correct, a.problems) == (b.correct, b.problems)
    assert len(a.raw_events) == len(b.raw_events)
    for (ta, va), (tb, vb) in zip(a.timelines, b.timelines):  # every allocation and free, at the same time
        assert list(ta) == list(tb) and list(va) == list(vb)


@pytest.mark.parametrize("path", BUILTIN, ids=lambda p: p.stem)
def test_replay_of_every_builtin_strategy_is_the_run_itself(path):
    options = OPTIONS.get(path.stem, {})
    workload = WORKLOAD if trains_dense(path) else MOE_WORKLOAD
    direct = simulate(str(path), CLUSTER, workload, BATCH, fold=False, **options)  # replay runs every rank
    recorded, programs = record(str(path), CLUSTER, workload, BATCH, **options)
    _same(recorded, direct)
    _same(replay(programs, CLUSTER, workload, BATCH), direct)


@pytest.mark.parametrize("options", [{"pp": 1, "tp": 2, "cp": 2}, {"pp": 2, "cp": 2, "kv_exchange": "all_gather"},
                                     {"pp": 1, "cp": 4, "kv_exchange": "torch_all_gather", "recompute": True}],
                         ids=["tp2-cp2-ring", "pp2-cp2-all_gather", "cp4-torch_all_gather"])
def test_replay_of_context_parallel_hybrid_is_the_run_itself(options):
    """Context parallelism's ops (ring attention's messages, the all-gather and reduce-scatter of keys and values,
    issued inside the ops) replay to the same step."""
    path = str(ROOT / "strategies" / "hybrid.py")
    direct = simulate(path, CLUSTER, WORKLOAD, BATCH, fold=False, **options)
    assert any(e.detail == "context-parallel" for e in direct.events)
    recorded, programs = record(path, CLUSTER, WORKLOAD, BATCH, **options)
    _same(recorded, direct)
    _same(replay(programs, CLUSTER, WORKLOAD, BATCH), direct)


def test_deepspeeds_partitioned_messages_and_attention_masks_replay():
    options = {"pp": 2, "tp": 2, "schedule": "deepspeed", "attention_mask_messages": True}
    direct = simulate("strategies/hybrid.py", CLUSTER, WORKLOAD, BATCH, **options)
    assert any(e.layer == -1 and e.op == "send" for e in direct.events)  # the masks and metadata went out
    recorded, programs = record("strategies/hybrid.py", CLUSTER, WORKLOAD, BATCH, **options)
    _same(recorded, direct)
    _same(replay(programs, CLUSTER, WORKLOAD, BATCH), direct)


def test_profile_workload_replays_on_every_tp_degree_it_uses():
    workload = "profiles:" + str(ROOT / "examples" / "profiles")
    direct = simulate(str(ROOT / "strategies" / "hybrid.py"), "1x4xA100-80GB", workload, 16, tp=2, pp=2)
    _, programs = record(str(ROOT / "strategies" / "hybrid.py"), "1x4xA100-80GB", workload, 16, tp=2, pp=2)
    _same(replay(programs, "1x4xA100-80GB", workload, 16), direct)


@pytest.fixture(scope="module")
def honest():
    return record(HONEST, CLUSTER, WORKLOAD, BATCH)


def _entries(program: array) -> list[list[int]]:
    """A program split into entries (for editing in tests)."""
    from dist_lib.run.replay import _ARITY
    out, i = [], 0
    while i < len(program):
        op = program[i]
        size = 1 + (_ARITY.get(op) or {INPUT: lambda: 1 + 2 * program[i + 1], SPLIT: lambda: 2 + 2 * program[i + 2],
                                        JOIN: lambda: 1 + program[i + 1]}.get(op, lambda: 2 + program[i + 2])())
        out.append(list(program[i:i + size]))
        i += size
    return out


def _program(entries: list[list[int]]) -> array:
    return array("q", [w for e in entries for w in e])


def _edited(programs, change, rank=0):
    programs = [array("q", p) for p in programs]
    entries = _entries(programs[rank])
    change(entries)
    programs[rank] = _program(entries)
    return programs


def test_a_later_drop_costs_the_bytes_it_keeps(honest):
    """Never drop rank 0's input activation: it is still live when the step ends, exactly its bytes more."""
    result, programs = honest
    act_bytes = Workload.load(WORKLOAD).activation_bytes() * (BATCH // 4)  # 2 samples a rank

    def keep_activation(entries):  # handles 0..7: four layers' weights and optimizer states; 8: the input
        drop = next(k for k, e in enumerate(entries) if e[0] == DROP and e[1] == 8)
        del entries[drop]

    kept = replay(_edited(programs, keep_activation), CLUSTER, WORKLOAD, BATCH)
    assert kept.timelines[0][1][-1] - result.timelines[0][1][-1] == act_bytes
    assert kept.memory_bytes[1:] == result.memory_bytes[1:]
    assert kept.time_s == result.time_s


def test_forged_programs_fail_as_the_program_deserves(honest):
    _, programs = honest
    no_forward = _edited(programs, lambda es: es.remove(next(e for e in es if e[0] == FORWARD and e[1] == 2)))
    with pytest.raises(SimulationError, match="rank 0"):  # layer 3 is then fed layer 2's input
        replay(no_forward, CLUSTER, WORKLOAD, BATCH)

    def stop_before_reducing(entries):
        del entries[next(k for k, e in enumerate(entries) if e[0] == ALL_REDUCE):]
    with pytest.raises(SimulationError, match="deadlock"):  # the other ranks wait on rank 0's all-reduce
        replay(_edited(programs, stop_before_reducing), CLUSTER, WORKLOAD, BATCH)


@pytest.mark.parametrize("change, message", [
    (lambda es: es.insert(0, [FORWARD, 0, 99, 0, 1]), "handle 99 is not defined yet"),
    (lambda es: es.insert(9, [DROP, 0]) or es.insert(10, [DROP, 0]), "handle 0 was already dropped"),
    (lambda es: es.append([77]), "unknown opcode 77"),
    (lambda es: es.append([FORWARD, 0, 1]), "ends inside this entry"),
    (lambda es: es.append([ALL_REDUCE, 0, 9, 0, 1]), "group size 9"),
    (lambda es: es.insert(0, [LOAD, 0, 2**40, 2**41, 0, 1]), "out of range"),
    (lambda es: es.insert(9, [FORWARD, 0, 8, 0, 34]), "flags 34"),
    (lambda es: es.insert(9, [AWAIT, 8]), "handle 8 is not a Work"),
    (lambda es: es.insert(0, [INPUT, 1, 5, 99]), "not an interval of the global batch"),
    # a weight plus its optimizer state: a TypeError of the simulator's once, a `crashed` row
    (lambda es: es.insert(0, [ADD, 0, 1]) or es.insert(0, [LOAD, 0, 0, 1, 0, 1]),
     r"handle 0 is a Weight, not a WeightGrad \(only weight gradients add\)"),
])
def test_malformed_programs_name_rank_and_entry(honest, change, message):
    _, programs = honest
    with pytest.raises(ProgramError, match=message) as caught:
        replay(_edited(programs, change), CLUSTER, WORKLOAD, BATCH)
    assert str(caught.value).startswith("rank 0 entry at word")


def test_a_program_for_another_world_size_is_malformed(honest):
    with pytest.raises(ProgramError, match="4 ranks, the cluster 2"):
        replay(honest[1], "2xA100-80GB", WORKLOAD, BATCH)


def test_replay_stops_at_its_deadline():
    async def busy(model):  # one rank loads and drops weights many times: a long, valid program
        for _ in range(3000):
            model.load_weights(0)

    _, programs = record(busy, "1xA100-80GB", WORKLOAD, BATCH)
    with pytest.raises(ReplayTimeout, match="time limit"):
        replay(programs, "1xA100-80GB", WORKLOAD, BATCH, deadline_s=0.0)


def test_handles_look_like_their_tensors_and_foreign_tensors_are_refused():
    seen = {}

    async def train(model):
        x = model.get_input_activation(range(model.rank * 4, model.rank * 4 + 4))
        work = model.all_reduce(model.backward(0, *_forward_one(model, x))[0])
        seen.setdefault("kinds", (isinstance(x, Activation), type(x) is Handle, isinstance(work, Work), repr(x)))
        await work
        with pytest.raises(TensorError, match="was not returned by this model's ops"):
            model.loss(x._t)
        raise SystemExit  # nothing more to record

    with pytest.raises(StrategyError, match="SystemExit"):  # reported as the strategy's own exit
        record(train, "2xA100-80GB", "toy:layers=1", BATCH)
    assert seen["kinds"][:3] == (True, True, True)
    assert seen["kinds"][3].startswith("Activation(layer 0, samples 0-3")


def _forward_one(model, x):
    weight, _ = model.load_weights(0)
    out = model.forward(0, x, weight)
    return x, model.loss(out), weight


def test_a_plan_whose_stages_differ_in_width_replays_its_splits_and_joins():
    """A 1-wide stage feeding a 2-wide one cuts each microbatch by samples and joins the gradients back."""
    from dist_lib.planner.plan import Plan, Stage
    plan = Plan(stages=(Stage((0,), 1, ((0, 2),), (4,)), Stage((1, 2), 1, ((2, 4),), (2, 2))), microbatch_size=4,
                microbatches=2, schedule="1f1b", recompute="none", zero=0)
    planned = str(ROOT / "strategies" / "planned.py")
    direct = simulate(planned, "3xA100-80GB", WORKLOAD, BATCH, plan=plan)
    recorded, programs = record(planned, "3xA100-80GB", WORKLOAD, BATCH, plan=plan)
    ops = {entry[0] for program in programs for entry in _entries(program)}
    assert {SPLIT, JOIN} <= ops
    _same(recorded, direct)
    _same(replay(programs, "3xA100-80GB", WORKLOAD, BATCH), direct)
    split = next(e for e in _entries(programs[0]) if e[0] == SPLIT)
    assert split[2] == 1 and split[4] - split[3] == 2  # one interval of two samples: a replica's share
    forged = array("q", list(programs[0]) + [JOIN, 1, 10**6])
    with pytest.raises(ProgramError, match=r"rank 0 entry at word \d+ \(join_samples\): handle 1000000 is not defined"):
        replay([forged, *programs[1:]], "3xA100-80GB", WORKLOAD, BATCH)


def test_run_grades_a_profile_workload_on_every_tp_degree_from_a_relative_path(tmp_path):
    """The sandboxed run resolves the relative profile folder from where `run` was started."""
    import json
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "grader", "run", "strategies/hybrid.py", "--workload",
                           "profiles:examples/profiles", "--cluster", "1x4xA100-80GB", "--set", "tp=2", "--set", "pp=2",
                           "--json", "--no-plots", "--trace", str(tmp_path / "t.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)
    direct = simulate(str(ROOT / "strategies" / "hybrid.py"), "1x4xA100-80GB",
                      "profiles:" + str(ROOT / "examples" / "profiles"), 32, tp=2, pp=2)
    assert (row["status"], row["time_s"], row["memory_bytes"]) == ("ok", direct.time_s, direct.memory_bytes)


def test_replay_does_not_depend_on_how_the_strategy_interleaved_its_awaits():
    """Awaits gathered in tasks (completed in whatever order asyncio runs them) and tensors dropped by
    another rank's code (a structure shared by all ranks) replay to the same step."""
    import asyncio
    shared: dict = {}

    async def train(model):
        layers, per = model.num_layers, model.global_batch_size // model.world_size
        weights = [model.load_weights(layer) for layer in range(layers)]
        x = model.get_input_activation(range(model.rank * per, (model.rank + 1) * per))
        shared[model.rank] = model.load_weights(0)  # held only there: freed by the last rank to get here,
        # while the others wait in their gathers
        inputs = []
        for layer in range(layers):
            inputs.append(x)
            x = model.forward(layer, x, weights[layer][0])
        if len(shared) == model.world_size:
            shared.clear()
        grad = model.loss(x)
        del x
        works = []
        for layer in reversed(range(layers)):
            weight_grad, grad = model.backward(layer, inputs.pop(), grad, weights[layer][0])
            works.append(model.all_reduce(weight_grad))
            del weight_grad
        reduced = await asyncio.gather(*works)
        del works
        for layer, grad in zip(reversed(range(layers)), reduced):
            new_weight, _ = model.update(layer, grad, *weights[layer])
            model.set_final_weight(layer, new_weight)

    direct = simulate(train, CLUSTER, WORKLOAD, BATCH)
    recorded, programs = record(train, CLUSTER, WORKLOAD, BATCH)
    _same(recorded, direct)
    _same(replay(programs, CLUSTER, WORKLOAD, BATCH), direct)


def test_every_model_op_is_recorded():
    """A Model op the recorder does not know would run unrecorded and be missing from the replay: each
    public method is either recorded or named as deciding nothing."""
    from dist_lib.model.handle import Model
    from dist_lib.run.recording import UNRECORDED_OPS, RecordingModel
    from dist_lib.run.recording_context import ContextOpsRecording
    ops = {n for n in dir(Model) if not n.startswith("_") and callable(getattr(Model, n))}
    recorded = {n for n in [*vars(RecordingModel), *vars(ContextOpsRecording)] if not n.startswith("_")}
    assert ops - set(UNRECORDED_OPS) == recorded
    assert {"context_input", "context_forward", "context_backward", "context_loss"} <= recorded
    def parameters(cls, name):  # past `self` (positional-only on the C twins of the hot ops)
        return [(p.name, p.kind, p.default) for p in inspect.signature(getattr(cls, name)).parameters.values()][1:]

    for name in recorded:  # and each takes exactly what the op takes, keywords and defaults included
        assert parameters(RecordingModel, name) == parameters(Model, name), name
    from dist_lib.model.experts import MoEModel  # and a mixture-of-experts rank's ops
    from dist_lib.run.recording import RecordingMoEModel
    from dist_lib.run.recording_experts import ExpertOpsRecording
    ops = {n for n in dir(MoEModel) if not n.startswith("_") and callable(getattr(MoEModel, n))} - ops
    recorded = {n for n in vars(ExpertOpsRecording) if not n.startswith("_")}
    assert ops - set(UNRECORDED_OPS) == recorded
    for name in recorded:
        assert parameters(RecordingMoEModel, name) == parameters(MoEModel, name), name


def test_a_recorded_moe_program_is_checked_as_untrusted_data():
    """Edits of an MoE program: experts outside the workload's are malformed; a dispatch to experts the
    receiving rank does not hold fails at the op, as the strategy would have."""
    from dist_lib.run.recording_experts import DISPATCH, LOAD_EXPERTS
    _, programs = record("strategies/moe.py", CLUSTER, MOE_WORKLOAD, BATCH, ep=2)

    def edit(old: list[int], new: list[int]) -> list[array]:
        edited = [array("q", p) for p in programs]
        words = edited[0].tolist()
        at = next(k for k in range(len(words)) if words[k:k + len(old)] == old)
        words[at:at + len(old)] = new
        edited[0] = array("q", words)
        return edited

    # rank 0 holds experts 0-1 of layer 0 (ep=2 over 4 experts): load experts 0..8 instead
    with pytest.raises(ProgramError, match="rank 0 .*load_experts.*experts 0..9"):
        replay(edit([LOAD_EXPERTS, 0, 1, 0, 2], [LOAD_EXPERTS, 0, 1, 0, 9]), CLUSTER, MOE_WORKLOAD, BATCH)
    # rank 0 cuts its routed tokens (handle 13) for experts 2-3 first, 0-1 second, and sends each piece to the
    # member at its place in the group: rank 0's experts get the tokens of rank 1's, caught at the all-to-all
    swapped = edit([DISPATCH, 13, 1, 0, 2, DISPATCH, 13, 1, 2, 4], [DISPATCH, 13, 1, 2, 4, DISPATCH, 13, 1, 0, 2])
    with pytest.raises(SimulationError, match="all_to_all #0 .*wrong expert rank"):
        replay(swapped, CLUSTER, MOE_WORKLOAD, BATCH)


def test_an_op_the_recorder_does_not_know_is_refused(monkeypatch):
    from dist_lib.model.handle import Model
    monkeypatch.setattr(Model, "scatter", lambda self, x: x, raising=False)

    async def train(model):
        model.scatter(None)

    with pytest.raises(TensorError, match="scatter: this op is not recorded"):
        record(train, "1xA100-80GB", WORKLOAD, BATCH)


PENDING = '''
from dist_lib.run.recording import RECV


async def train(model):
    await honest_train(model)
    if model.rank == 1:  # {n} receives appended to the recorded program, never run here
        model._recorder.programs[1].extend([RECV, 0] * {n})
        model._recorder.counts[1] += {n}
'''
TINY = {"name": "toy2", "cluster": "2xA100-80GB", "workload": WORKLOAD, "global_batch": BATCH}
LIMIT_S = 8


def test_a_forged_program_with_many_pending_receives_fails_briefly():
    from dist_lib import DeadlockError
    _, programs = record(HONEST, "2xA100-80GB", WORKLOAD, BATCH)
    n = 200_000
    programs[1].extend([RECV, 0] * n)
    start = time.monotonic()
    with pytest.raises(DeadlockError) as caught:
        replay(programs, "2xA100-80GB", WORKLOAD, BATCH, deadline_s=LIMIT_S)
    assert time.monotonic() - start < LIMIT_S
    assert str(caught.value).endswith(f"\n  ... and {n - 20} more") and len(str(caught.value)) < 2000


def _forged(folder: Path, n: int) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "honest.py").write_text(Path(HONEST).read_text())
    path = folder / "pending.py"  # the honest step, then the forgery
    path.write_text(Path(HONEST).read_text().replace("def train(", "def honest_train(") + PENDING.format(n=n))
    return path


def test_a_forged_row_is_graded_within_the_time_limit_and_the_board_completes(tmp_path):
    """The grader's work after the run (replay, end-of-step checks, result) is bounded by the limit;
    the row's error is short; the other row is graded all the same."""
    import json
    import subprocess
    import sys
    _forged(tmp_path / "subs", 300_000)
    (tmp_path / "suite.toml").write_text(
        f'name = "tiny"\n[limits]\ntimeout_s = {LIMIT_S}\n[[scenarios]]\n'
        + "".join(f'{k} = {json.dumps(v)}\n' for k, v in TINY.items())
        + '[[scoring.components]]\nmetric = "mfu"\nscale = 100\n')
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "grader", "leaderboard", str(tmp_path / "subs"), "--suite",
                           str(tmp_path / "suite.toml"), "--out", str(tmp_path / "out"), "--no-plots", "--trusted"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {r["strategy"]: r for r in map(json.loads, (tmp_path / "out" / "results.jsonl").read_text().splitlines())}
    assert rows["honest"]["status"] == "ok", rows["honest"]["error"]
    forged = rows["pending"]
    assert forged["status"] in ("failed", "timeout") and len(forged["error"]) < 5000, forged["error"][:300]
    # each run: its child, then at most the limit in the grader (plus a margin for a loaded machine)
    assert time.monotonic() - start < forged["wall_s"] + rows["honest"]["wall_s"] + LIMIT_S + 10
    assert (tmp_path / "out" / "leaderboard.json").stat().st_size < 20_000


def test_writing_the_trace_and_plots_stops_at_the_time_limit(tmp_path, monkeypatch):
    """Past the limit, code that never checks it (here a trace writer that never ends) is stopped: the
    row is a timeout with one message, and nothing half-written is left."""
    from dist_lib import Result
    from grader.grade import grade_run

    def endless(result, path):
        Path(path).write_text("{")
        while True:
            pass

    monkeypatch.setattr(Result, "write_chrome_trace", endless)
    trace = tmp_path / "t.json"
    limit = 3
    row, result = grade_run(HONEST, TINY, {"timeout_s": limit}, str(trace), plots=True, confine=False)
    assert (row["status"], result, row["time_s"], row["trace"]) == ("timeout", None, None, None), row["error"]
    assert row["error"].startswith("grading the recorded program") and f"over {limit} s" in row["error"]
    assert not trace.exists()
    parent = float(row["error"].rsplit("stopped after ", 1)[1].split(" s")[0])
    assert limit <= parent < limit + 1


def test_a_rows_error_text_and_problems_are_capped():
    from grader.deadline import MAX_ERROR_CHARS, capped, capped_list
    text = "x" * (MAX_ERROR_CHARS + 123)
    assert capped(text) == "x" * MAX_ERROR_CHARS + "\n... (cut here: 123 more characters)"
    assert capped("short") == "short"
    assert capped_list([f"p{i}" for i in range(25)]) == [f"p{i}" for i in range(20)] + ["... and 5 more"]


def test_a_replay_that_runs_the_grader_out_of_real_memory_is_an_invalid_row():
    """Wherever a replay runs out of the grader's real memory, as a MemoryError or as the simulator's own
    ResourceError for it (raised while it checks the step), the row is `invalid`, never an ordinary failure."""
    from dist_lib import ResourceError
    from grader.grade import _replay_row
    from grader.runner import Limits

    def out_of_memory():
        raise ResourceError("MemoryError: the simulation of 2 ranks ran out of real memory while checking the step")

    def memory_error():
        raise MemoryError

    for run in (out_of_memory, memory_error):
        result, status, error = _replay_row(run, Limits())
        assert (result, status) == (None, "invalid") and "exhausted the grader" in error
