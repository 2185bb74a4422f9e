"""Context parallelism's ops in a graded run: recorded as one decision each (the ring's messages and awaits
are inside the op), replayed by calling the same op, and checked as untrusted data (a forged CP part, group or
key/value block fails as a `ProgramError` or with the op's own error, never otherwise)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from array import array
from pathlib import Path

import pytest

from dist_lib import TensorError, simulate
from dist_lib.errors import SimulationError, StrategyError
from dist_lib.run.recording import (ADD, ALL_GATHER, ALL_REDUCE, AWAIT, BACKWARD, DROP, FORWARD, LOAD, LOSS, RECV,
                                    SEND, SPLIT, UPDATE, Recorder, record)
from dist_lib.run.recording_context import CONTEXT_BACKWARD, CONTEXT_FORWARD, CONTEXT_INPUT, CONTEXT_LOSS
from dist_lib.run.replay import ProgramError, replay

ROOT = Path(__file__).resolve().parents[1]
CLUSTER, WORKLOAD, BATCH = "2xA100-80GB", "toy:layers=1", 8


async def cp_step(model):
    """One layer, the whole batch, context-parallel over both ranks (each holds half of every sequence)."""
    group = model.group([0, 1])
    weight, opt = model.load_weights(0)
    x = model.context_input(range(8), model.rank, 2)
    y = await model.context_forward(0, x, weight, group)
    grad = model.context_loss(y)
    weight_grad, _ = await model.context_backward(0, x, grad, weight, group)
    whole = await model.all_reduce(weight_grad, group)
    new_weight, _ = model.update(0, whole, weight, opt)
    model.set_final_weight(0, new_weight)


@pytest.fixture(scope="module")
def recorded():
    return record(cp_step, CLUSTER, WORKLOAD, BATCH)


def test_a_context_parallel_step_is_four_entries_and_replays_to_itself(recorded):
    result, programs = recorded
    direct = simulate(cp_step, CLUSTER, WORKLOAD, BATCH, fold=False)
    replayed = replay(programs, CLUSTER, WORKLOAD, BATCH)
    for run in (result, replayed):
        assert (run.time_s, run.rank_times, run.memory_bytes) == (direct.time_s, direct.rank_times, direct.memory_bytes)
        assert [(e.rank, e.op, e.start, e.end) for e in run.events] == \
               [(e.rank, e.op, e.start, e.end) for e in direct.events]
    assert replayed.correct and not replayed.problems
    assert any(e.op == "send" for e in direct.events)  # the ring's messages, issued inside the ops
    # rank 0: weight and optimizer state (handles 0, 1), its sequence part (2), the layer's output (3) through
    # the ring of the CP group [0, 1], the loss gradient (4), then both gradients (5, 6)
    assert list(programs[0][:34]) == [LOAD, 0, 0, 1, 0, 1,
                                      CONTEXT_INPUT, 0, 2, 1, 0, 8,
                                      CONTEXT_FORWARD, 0, 2, 0, 0, 2, 0, 1,
                                      CONTEXT_LOSS, 3, 0, 1,
                                      CONTEXT_BACKWARD, 0, 2, 4, 0, 0, 2, 0, 1,
                                      ALL_REDUCE]


def _forged(programs, words: dict[int, int] | None = None, cut: int | None = None, rank: int = 0):
    """`programs` with words of `rank`'s program replaced (at their index), or it cut after `cut` words."""
    out = [array("q", p) for p in programs]
    for at, word in (words or {}).items():
        out[rank][at] = word
    if cut is not None:
        out[rank] = out[rank][:cut]
    return out


@pytest.mark.parametrize("words, cut, error, message", [
    ({7: 1}, None, TensorError, r"rank 0 context_forward\(layer 0\): group \[0, 1\] is not this activation's CP "
                                r"group: it must have 2 ranks with this rank \(0\) at position 1"),  # cp_rank 1
    ({8: 4}, None, TensorError, r"rank 0 context_forward\(layer 0\): group \[0, 1\] is not this activation's CP "
                                r"group: it must have 4 ranks"),  # cp_size 4
    ({7: 2}, None, TensorError, "rank 0 context_input: cp_rank=2, cp_size=2 is not a part"),
    ({8: 2**20}, None, ProgramError, r"entry at word 6 \(context_input\): operand 1048576 is out of range"),
    ({9: 9}, None, ProgramError, r"\(context_input\): interval count 9 is not in 1..8"),
    ({11: 9}, None, ProgramError, r"samples 0..9 are not an interval of the global batch"),
    ({16: 96}, None, ProgramError, r"entry at word 12 \(context_forward\): key/value exchange 96 is not one of "
                                   r"0..2 \(ring, all_gather, torch_all_gather\), plus 3 x a forward's modes 0..31"),
    ({16: 3 * 16}, None, TensorError, r"context_forward\(layer 0\): fp8='tensorwise' on A100-80GB, which "
                                              r"has no FP8 tensor cores"),  # a forged FP8 forward on an A100
    ({29: 3}, None, ProgramError, r"\(context_backward\): key/value exchange 3 is not one of 0..2 \(ring, "
                                  r"all_gather, torch_all_gather\)$"),
    ({17: 0}, None, ProgramError, r"\(context_forward\): group size 0 is not in 1..2"),
    ({17: 3}, None, ProgramError, r"\(context_forward\): group size 3 is not in 1..2"),
    ({19: 5}, None, TensorError, r"rank 0 context_forward\(layer 0\): group \[0, 5\]: rank 5 is not in 0..1"),
    ({19: 0}, None, TensorError, r"rank 0 context_forward\(layer 0\): group \[0, 0\] lists rank 0 more than once"),
    ({14: 0}, None, TensorError, r"expected the complete ContextActivation entering layer 0, got Weight"),
    ({15: 9}, None, ProgramError, r"\(context_forward\): handle 9 is not defined yet"),
    ({21: 2}, None, TensorError, "rank 0 context_loss: expected the complete ContextActivation after the last layer"),
    ({23: 0}, None, TensorError, r"rank 0 context_loss: tp_rank=0, tp_size=0 is not a part"),
    ({27: 2}, None, TensorError, r"rank 0 context_backward\(layer 0\): expected the complete gradient of layer 0's "
                                 r"output"),  # the activation as its own gradient
    ({29: -1}, None, ProgramError, r"\(context_backward\): key/value exchange -1"),
    ({}, 18, ProgramError, r"\(context_forward\): group size 2 is not in 1..2 or runs past the program's end"),
    ({}, 22, ProgramError, r"entry at word 20 \(context_loss\): the program ends inside this entry"),
])
def test_a_forged_context_entry_is_the_programs_error_or_the_ops(recorded, words, cut, error, message):
    with pytest.raises(error, match=message):
        replay(_forged(recorded[1], words, cut), CLUSTER, WORKLOAD, BATCH)


def test_both_ranks_claiming_one_sequence_part_fail_in_the_ring(recorded):
    """Rank 1 claims part 0 too and names the group the other way round: a group is a set of ranks, so its
    position check fails at once, naming it."""
    with pytest.raises(TensorError, match=r"rank 1 context_forward\(layer 0\): group \[0, 1\] is not this "
                                          r"activation's CP group"):
        replay(_forged(recorded[1], {7: 0}, rank=1), CLUSTER, WORKLOAD, BATCH)


K = 4  # rank 0's handle of rank 1's key/value block, taken off the ring by a forged receive
_STOLEN = [LOAD, 0, 0, 1, 0, 1, CONTEXT_INPUT, 0, 2, 1, 0, 8, RECV, 1, AWAIT, 3]


@pytest.mark.parametrize("entry", [
    [FORWARD, 0, K, 0, 1], [FORWARD, 0, 2, K, 1], [BACKWARD, 0, K, K, 0], [LOSS, K, 0, 1], [UPDATE, 0, K, 0, 1],
    [ALL_REDUCE, K, 0], [ALL_GATHER, K, 0], [SEND, K, 1], [SPLIT, K, 1, 0, 4], [ADD, K, K], [AWAIT, K],
    [CONTEXT_FORWARD, 0, K, 0, 0, 2, 0, 1], [CONTEXT_FORWARD, 0, 2, K, 1, 2, 0, 1],
    [CONTEXT_BACKWARD, 0, 2, K, 0, 0, 2, 0, 1], [CONTEXT_BACKWARD, 0, K, K, K, 1, 2, 0, 1], [CONTEXT_LOSS, K, 0, 1],
], ids=lambda e: "-".join(map(str, e)))
def test_another_ranks_key_value_block_feeds_no_op(recorded, entry):
    """Rank 0 receives the block rank 1's ring sent it before its own context_forward could, then hands it to an
    op: each refuses it (or, sent on, the ring that then gets it does), or the step deadlocks; a simulator
    error every time, never another exception."""
    programs = [array("q", _STOLEN + entry), recorded[1][1]]
    with pytest.raises(SimulationError, match=r"rank [01]|deadlock") as caught:
        replay(programs, CLUSTER, WORKLOAD, BATCH)
    assert caught.type is not StrategyError  # (which would wrap an exception the op did not mean)


def test_a_rank_does_nothing_else_while_its_context_op_is_in_flight():
    """A graded run records a context op as one entry, so another task of the rank may not issue ops meanwhile
    (the replay would run them after it): refused, naming both ops."""
    async def overlapped(model):
        group = model.group([0, 1])
        weight, _ = model.load_weights(0)
        x = model.context_input(range(8), model.rank, 2)

        async def other():
            model.load_weights(0)

        await asyncio.gather(model.context_forward(0, x, weight, group), other())

    simulate(overlapped, CLUSTER, WORKLOAD, BATCH, check=False)  # fine when run directly
    with pytest.raises(TensorError, match="rank 0 load_weights: context_forward is still in flight on this rank"):
        record(overlapped, CLUSTER, WORKLOAD, BATCH)


def test_a_drop_while_a_context_op_is_in_flight_follows_its_entry():
    recorder = Recorder(2)
    recorder.emit(0, LOAD, 0, 0, 1, 0, 1)
    recorder.begin(0, "context_forward")
    recorder.programs[0].extend((DROP, 1))  # as `Handle.__del__` writes it
    recorder.emit(1, DROP, 0)  # the other rank goes on
    with pytest.raises(TensorError, match="context_forward is still in flight"):
        recorder.begin(0, "context_backward")
    recorder.finish(0, (CONTEXT_FORWARD, 0, 2, 0, 0, 2, 0, 1))
    assert list(recorder.programs[0]) == [LOAD, 0, 0, 1, 0, 1, CONTEXT_FORWARD, 0, 2, 0, 0, 2, 0, 1, DROP, 1]
    recorder.begin(0, "context_backward")
    recorder.programs[0].extend((DROP, 0))
    recorder.finish(0, ())  # it failed: no entry, the drop still counts
    assert list(recorder.programs[0][-2:]) == [DROP, 0] and recorder.busy == [None, None]


@pytest.mark.parametrize("order", ["plain first", "context first"])
def test_a_gradient_of_part_of_the_sequence_adds_to_no_whole_gradient(order):
    """A plain WeightGrad plus a ContextWeightGrad would claim the CP samples whole with one sequence part."""
    async def mixed(model):
        group = model.group([0, 1])
        weight, _ = model.load_weights(0)
        plain = model.get_input_activation(range(2 * model.rank, 2 * model.rank + 2))
        whole, _ = model.backward(0, plain, model.loss(model.forward(0, plain, weight)), weight)
        x = model.context_input(range(6, 8), model.rank, 2)
        y = await model.context_forward(0, x, weight, group)
        part, _ = await model.context_backward(0, x, model.context_loss(y), weight, group)
        return whole + part if order == "plain first" else part + whole

    with pytest.raises(TensorError, match=r"rank 0 WeightGrad \+ WeightGrad \(layer 0\): cannot add .* a gradient "
                                          r"of some sequence parts is no sample's gradient until the CP ranks "
                                          r"all-reduce it"):
        simulate(mixed, CLUSTER, WORKLOAD, BATCH, check=False)


def test_run_grades_context_parallel_hybrid_in_the_sandbox_as_simulate_runs_it(tmp_path):
    from grader.runner import sandbox_problem
    if sandbox_problem():
        pytest.skip(f"the OS sandbox is not usable here: {sandbox_problem()}")
    cluster, workload = "1x8xH100-80GB", "llama-3-8b:layers=2"
    proc = subprocess.run([sys.executable, "-m", "grader", "run", "hybrid", "--cluster", cluster, "--workload",
                           workload, "--batch", "8", "--set", "tp=2", "--set", "cp=2", "--json", "--no-plots",
                           "--trace", str(tmp_path / "t.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)
    direct = simulate(str(ROOT / "strategies" / "hybrid.py"), cluster, workload, 8, fold=False, tp=2, cp=2)
    assert (row["status"], row["verified"], row["correct"]) == ("ok", True, True)
    assert (row["time_s"], row["memory_bytes"]) == (direct.time_s, direct.memory_bytes)
    assert row["hfu"] == direct.hfu and row["mfu"] == direct.mfu
