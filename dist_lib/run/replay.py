"""Re-execute a recorded program (see `recording.py`) through the simulator: the trusted half of grading.

Each rank runs an interpreter of its program instead of the strategy: it calls the real `Model` ops with
the tensors its handles name, awaits the works it awaited, and drops its reference to a handle where the
program says. The engine, the cost model and the memory books are the same as in `simulate`, unpatched,
so every time, byte and verdict of the result is the simulator's own. Replay is faithful because:

* each rank's calls, awaits and drops keep their order, which is all the engine's results depend on
  (they never depend on how asyncio interleaves ranks; DESIGN.md, "Virtual time only");
* the interpreter holds each tensor only through its handle table, so a tensor is freed exactly where
  the strategy dropped its last reference (or later, where the engine itself still held it);
* handles still held when the step ends stay held until the result is built, as they were.

The program is untrusted data: every entry is checked (opcode, operand count, handle numbers defined,
not dropped and of the right kind, bounded integers) before the op runs, and a malformed entry raises
`ProgramError` naming the rank and entry. A program that is well formed but wrong fails with the error
the simulator gives that program. A deadline bounds the replay's wall-clock time: the interpreter checks it
as it goes, and a replay that ends past it, with a result or with the simulator's error, is a `ReplayTimeout`.
"""

from __future__ import annotations

import time
from array import array
from typing import Any

from dist_lib.comm.collectives import Work
from dist_lib.errors import SimulationError
from dist_lib.hardware.cluster import Cluster
from dist_lib.model.handle import PIPE_EXTRAS
from dist_lib.model.other_collective_ops import DISPATCHERS
from dist_lib.run.recording import FP8_FLAGS, ADD, ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, AWAIT, BARRIER, BROADCAST, REDUCE, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, DROP, FINAL, FORWARD, INPUT, JOIN, LOAD, LOAD_SHARDED_STATE, LOSS, OPCODES, RECV, REDUCE_SCATTER, SEND, SPLIT, SPLIT_TP, TIED, EXTRA, UPDATE
from dist_lib.output.result import Result
from dist_lib.run.recording_context import CONTEXT_OPCODES, FIRST_CONTEXT_OPCODE
from dist_lib.run.recording_experts import EXPERT_BACKWARD_GROUPED, FIRST_EXPERT_OPCODE, REDUCE_ROUTED
from dist_lib.run.replay_context import run_context_op
from dist_lib.run.replay_experts import run_expert_op
from dist_lib.run.simulator import simulate
from dist_lib.tensors import ContextWeightGrad, ExpertGrad, WeightGrad
from dist_lib.workload.transformer import Workload

FP8_RECIPE_OF_FLAGS = {bit: recipe for recipe, bit in FP8_FLAGS.items()}

MAX_FIELD = 1 << 16  # shard, shard count, TP rank and degree: far above any cluster, far below a huge mask
CHECK_EVERY = 4096  # entries between deadline checks
_DROPPED = object()
_ADDED = (WeightGrad, ExpertGrad, ContextWeightGrad)  # the gradients that add (each to its own kind)
# operands after the opcode, for the fixed-size entries
_ARITY = {LOAD: 5, LOAD_SHARDED_STATE: 5, FORWARD: 4, BACKWARD: 4, BACKWARD_INPUT: 4, BACKWARD_WEIGHT: 4, LOSS: 3, UPDATE: 4, FINAL: 2,
          SEND: 2, RECV: 1, ADD: 2, AWAIT: 1, DROP: 1, SPLIT_TP: 3, TIED: 2, EXTRA: 2}


class ProgramError(SimulationError):
    """A recorded program that is not well formed (not an error of the strategy: of the record)."""


class ReplayTimeout(SimulationError):
    """The replay ran past its wall-clock deadline."""


def replay(programs: list[array], cluster: Cluster | str, workload: Workload | str, global_batch_size: int, *,
           enforce_memory: bool = True, deadline_s: float | None = None, memory_reserve: Any = None) -> Result:
    """The result of re-executing `programs` (one per rank). Raises `ProgramError` for a malformed
    program, `SimulationError` for a well-formed one the simulator rejects (as `simulate` would)."""
    cluster = Cluster.load(cluster)
    if len(programs) != cluster.world_size:
        raise ProgramError(f"the program has {len(programs)} ranks, the cluster {cluster.world_size}")
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    tables: list[list] = []  # kept until the result is built: handles held at the end stay alive

    async def interpret(model: Any) -> None:
        table: list = []
        tables.append(table)
        await _run(model, programs[model.rank], table, deadline)

    try:
        result = simulate(interpret, cluster, workload, global_batch_size, check=False, enforce_memory=enforce_memory,
                          memory_reserve=memory_reserve)
    except (ProgramError, ReplayTimeout):
        raise
    except SimulationError:  # found by the end-of-step checks, which may run past the deadline
        _check_deadline(deadline)
        raise
    finally:
        tables.clear()
    _check_deadline(deadline)  # the end-of-step checks and the result are part of the replay's time
    return result


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise ReplayTimeout("the replay ran past its time limit while checking the step's end and building its "
                            "result")


async def _run(model: Any, program: array, table: list, deadline: float | None) -> None:
    rank, world, batch = model.rank, model.world_size, model.global_batch_size
    n = len(program)  # read in place: a list of the words would take four times their bytes
    append, extend = table.append, table.extend
    i = 0
    since = 0

    def fail(why: str) -> ProgramError:
        return ProgramError(f"rank {rank} entry at word {i} ({_name(program[i])}): {why}")

    def get(k: int) -> Any:
        """The live object that the handle in operand k names."""
        h = program[i + k]
        if not 0 <= h < len(table):
            raise fail(f"handle {h} is not defined yet")
        obj = table[h]
        if obj is _DROPPED:
            raise fail(f"handle {h} was already dropped")
        return obj

    def small(k: int) -> int:
        v = program[i + k]
        if not -MAX_FIELD <= v <= MAX_FIELD:
            raise fail(f"operand {v} is out of range")
        return v

    while i < n:
        since += 1
        if since == CHECK_EVERY:
            since = 0
            if deadline is not None and time.monotonic() > deadline:
                raise ReplayTimeout(f"rank {rank}: the replay ran past its time limit at word {i} of {n}")
        op = program[i]
        arity = _ARITY.get(op)
        if arity is not None and i + arity >= n:
            raise fail("the program ends inside this entry")
        if op == DROP:  # over half of most programs
            h = program[i + 1]
            if not 0 <= h < len(table) or table[h] is _DROPPED:
                get(1)  # raises the reason
            table[h] = _DROPPED
            i += 2
            continue
        if op == FORWARD:
            flags = program[i + 4]
            if not 0 <= flags <= 63 or flags & 34 == 34:
                raise fail(f"flags {flags} are not a combination of 1 (stash), one of 2 and 32 (selective recompute, "
                           f"per-op selective checkpointing), 4 (sequence parallel) and one of 8, 16 and 24 (FP8 "
                           f"delayed, tensorwise or rowwise)")
            append(model.forward(small(1), get(2), get(3), stash=bool(flags & 1),
                                 selective_recompute="op" if flags & 32 else bool(flags & 2),
                                 sequence_parallel=bool(flags & 4), fp8=FP8_RECIPE_OF_FLAGS[flags & 24]))
        elif op == BACKWARD:
            extend(model.backward(small(1), get(2), get(3), get(4)))
        elif op == AWAIT:
            if get(1).__class__ is not Work:
                raise fail(f"handle {program[i + 1]} is not a Work")
            i += 2
            result = await table[program[i - 1]]
            if result.__class__ is list:  # an all_to_all's pieces: a handle each
                extend(result)
            else:
                append(result)
            del result
            continue
        elif op in (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER):
            k = program[i + 2] if i + 2 < n else -1
            if not 0 <= k <= world or i + 2 + k >= n:
                raise fail(f"group size {k} is not in 0..{world} or runs past the program's end")
            append(getattr(model, OPCODES[op])(get(1), None if k == 0 else program[i + 3:i + 3 + k].tolist()))
            i += 3 + k
            continue
        elif op in (BROADCAST, REDUCE, BARRIER, ALL_TO_ALL):
            i = _other_collective(model, program, i, n, table, world, batch, get, small, fail)
            continue
        elif op == ADD:  # (the recorder emits it for gradient + gradient only: `Handle.__add__`)
            for k in (1, 2):  # (no local keeps a tensor: a reference here would delay its free)
                if get(k).__class__ not in _ADDED:
                    raise fail(f"handle {program[i + k]} is a {type(get(k)).__name__}, not a WeightGrad (only "
                               f"weight gradients add), nor an MoE layer's ExpertGrad, nor a ContextWeightGrad")
            try:
                append(get(1) + get(2))
            except TypeError:  # (two kinds that do not add: each __add__ returned NotImplemented)
                raise fail(f"a {type(get(1)).__name__} and a {type(get(2)).__name__} do not add") from None
        elif FIRST_EXPERT_OPCODE <= op < FIRST_CONTEXT_OPCODE or op in (REDUCE_ROUTED, EXPERT_BACKWARD_GROUPED):
            i = run_expert_op(model, program, i, n, table, get, small, fail)
            continue
        elif FIRST_CONTEXT_OPCODE <= op < FIRST_CONTEXT_OPCODE + len(CONTEXT_OPCODES):
            i = await run_context_op(model, program, i, n, table, get, small, fail,
                                     lambda at: _samples(program, at, n, batch, fail))
            continue
        elif op == BACKWARD_INPUT:
            append(model.backward_input(small(1), get(2), get(3), get(4)))
        elif op == BACKWARD_WEIGHT:
            append(model.backward_weight(small(1), get(2), get(3), get(4)))
        elif op == LOSS:
            append(model.loss(get(1), tp_rank=small(2), tp_size=small(3)))
        elif op == UPDATE:
            extend(model.update(small(1), get(2), get(3), get(4)))
        elif op == TIED:
            append(model.tied_embedding_grad(tp_rank=small(1), tp_size=small(2)))
        elif op == FINAL:
            model.set_final_weight(small(1), get(2))
        elif op == SEND:
            append(model.send(get(1), small(2)))
        elif op == RECV:
            append(model.recv(small(1)))
        elif op == EXTRA:
            if not 0 <= small(1) < len(PIPE_EXTRAS):
                raise fail(f"pipe_extra kind {small(1)} is not one of 0..{len(PIPE_EXTRAS) - 1}")
            append(model.pipe_extra(PIPE_EXTRAS[small(1)], tp_size=small(2)))
        elif op == SPLIT_TP:
            append(model.split_tp(get(1), small(2), small(3)))
        elif op == LOAD:
            extend(model.load_weights(small(1), small(2), small(3), tp_rank=small(4), tp_size=small(5)))
        elif op == LOAD_SHARDED_STATE:
            extend(model.load_sharded_state(small(1), small(2), small(3), tp_rank=small(4), tp_size=small(5)))
        elif op == INPUT:
            samples = _samples(program, i + 1, n, batch, fail)
            append(model.get_input_activation(samples))
            i += 2 + 2 * program[i + 1]
            continue
        elif op == SPLIT:
            if i + 2 >= n:
                raise fail("the program ends inside this entry")
            samples = _samples(program, i + 2, n, batch, fail)
            append(model.split_samples(get(1), samples))
            i += 3 + 2 * program[i + 2]
            continue
        elif op == JOIN:
            k = program[i + 1] if i + 1 < n else -1
            if not 1 <= k <= batch or i + 1 + k >= n:
                raise fail(f"part count {k} is not in 1..{batch} or runs past the program's end")
            append(model.join_samples([get(2 + j) for j in range(k)]))
            i += 2 + k
            continue
        else:
            raise fail(f"unknown opcode {op}")
        i += 1 + arity  # type: ignore[operator]


def _other_collective(model: Any, program: array, i: int, n: int, table: list, world: int, batch: int, get: Any,
                      small: Any, fail: Any) -> int:
    """Run the broadcast, reduce, barrier or all_to_all entry at word `i`; the index of the next entry."""
    op = program[i]
    at = i + 1
    x = root = None
    if op in (BROADCAST, REDUCE):
        if at + 1 >= n:
            raise fail("the program ends inside this entry")
        x = None if program[at] == -1 else get(1)
        root = small(2)
        at += 2

    def count(at: int, most: int, what: str) -> int:
        k = program[at] if at < n else -1
        if not 0 <= k <= most or at + k >= n:
            raise fail(f"{what} {k} is not in 0..{most} or runs past the program's end")
        return k

    k = count(at, world, "group size")
    group = None if k == 0 else program[at + 1:at + 1 + k].tolist()
    at += 1 + k
    if op == BARRIER:
        table.append(model.barrier(group))
        return at
    if op != ALL_TO_ALL:
        table.append(getattr(model, OPCODES[op])(x, root, group))
        return at
    members = count(at, world, "piece count")
    pieces = []
    for j in range(members):
        h = program[at + 1 + j]
        pieces.append(None if h == -1 else get(at + 1 + j - i))
    at += 1 + members
    if at >= n or not 0 <= program[at] < 32 or program[at] >> 2 & 3 >= len(DISPATCHERS):
        raise fail(f"the expect, dispatcher and probs flags are not 0..31 with a dispatcher index below "
                   f"{len(DISPATCHERS)}, or the program ends before them")
    flags = program[at]
    at += 1
    expect = expect_experts = None
    if flags & 1:
        expect = []
        for _ in range(members):
            c = count(at, batch, "interval count")
            expect.append(None if c == 0 else _samples(program, at, n, batch, fail))
            at += 1 + 2 * c
    if flags & 2:
        expect_experts = []
        most = getattr(getattr(model, "moe", None), "experts", 0)
        for _ in range(members):
            c = count(at, most, "expert interval count")
            expect_experts.append(None if c == 0 else _samples(program, at, n, most, fail))
            at += 1 + 2 * c
    table.append(model.all_to_all(pieces, group, expect=expect, expect_experts=expect_experts,
                                  dispatcher=DISPATCHERS[flags >> 2 & 3], probs=bool(flags & 16)))
    return at


def _samples(program: array, at: int, n: int, batch: int, fail: Any) -> range | list[int]:
    """The samples named at word `at`: a count k, then k half-open intervals of the global batch."""
    k = program[at] if at < n else -1
    if not 1 <= k <= batch or at + 2 * k >= n:
        raise fail(f"interval count {k} is not in 1..{batch} or runs past the program's end")
    spans = program[at + 1:at + 1 + 2 * k]
    samples: list[int] = []
    for start, stop in zip(spans[::2], spans[1::2]):
        if not 0 <= start < stop <= batch:
            raise fail(f"samples {start}..{stop} are not an interval of the global batch 0..{batch}")
        samples.extend(range(start, stop))
    return range(spans[0], spans[1]) if k == 1 else samples


def _name(op: int) -> str:
    return OPCODES[op] if 0 <= op < len(OPCODES) else f"opcode {op}"
