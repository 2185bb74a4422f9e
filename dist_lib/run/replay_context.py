"""Replay of the context-parallel ops of a recorded program (their format: `recording_context.py`), checked as
untrusted data as `replay.py` checks the rest: operand counts, handles defined and live, bounded integers, a
known key/value exchange, a group of ranks of the cluster. `context_forward` and `context_backward` are awaited
here as the strategy awaited them, so they issue the same messages and collectives; the ops themselves then
check what the program gives them (the CP part against the group, the activation's and weight's kinds and
layers, the blocks each ring step receives), failing with their own errors."""

from __future__ import annotations

from array import array
from typing import Any, Callable

from dist_lib.costs.context import KV_EXCHANGES
from dist_lib.run.recording_context import (CONTEXT_BACKWARD, CONTEXT_FORWARD, CONTEXT_INPUT, CONTEXT_LOSS,
                                            MODE_COUNT, forward_options)

# operands after the opcode before the group (forward, backward) or in all (loss)
CONTEXT_ARITY = {CONTEXT_FORWARD: 4, CONTEXT_BACKWARD: 5, CONTEXT_LOSS: 3}


async def run_context_op(model: Any, program: array, i: int, n: int, table: list, get: Callable[[int], Any],
                         small: Callable[[int], int], fail: Callable[[str], Exception],
                         samples: Callable[[int], Any]) -> int:
    """Run the context-parallel entry at word `i` on `model`; the index of the next entry. `get(k)` is the live
    object of the handle in operand k, `small(k)` operand k as a bounded integer, `fail(why)` the
    `ProgramError`, `samples(at)` the samples named at word `at` (a count, then half-open intervals)."""
    op = program[i]
    if op == CONTEXT_INPUT:
        if i + 3 >= n:
            raise fail("the program ends inside this entry")
        table.append(model.context_input(samples(i + 3), small(1), small(2)))
        return i + 4 + 2 * program[i + 3]
    arity = CONTEXT_ARITY.get(op)
    if arity is None:
        raise fail(f"unknown opcode {op}")
    if i + arity >= n:
        raise fail("the program ends inside this entry")
    if op == CONTEXT_LOSS:
        table.append(model.context_loss(get(1), tp_rank=small(2), tp_size=small(3)))
        return i + 1 + arity
    exchange, modes = divmod(program[i + arity], len(KV_EXCHANGES))[::-1]
    if not 0 <= program[i + arity] < len(KV_EXCHANGES) * (MODE_COUNT if op == CONTEXT_FORWARD else 1):
        raise fail(f"key/value exchange {program[i + arity]} is not one of 0..{len(KV_EXCHANGES) - 1} "
                   f"({', '.join(KV_EXCHANGES)})" + (f", plus {len(KV_EXCHANGES)} x a forward's modes "
                                                     f"0..{MODE_COUNT - 1}" if op == CONTEXT_FORWARD else ""))
    at = i + arity + 1
    k = program[at] if at < n else -1
    if not 1 <= k <= model.world_size or at + k >= n:
        raise fail(f"group size {k} is not in 1..{model.world_size} or runs past the program's end")
    group = program[at + 1:at + 1 + k].tolist()  # (the op's own group lookup checks the ranks)
    if op == CONTEXT_FORWARD:
        table.append(await model.context_forward(small(1), get(2), get(3), group,
                                                 kv_exchange=KV_EXCHANGES[exchange], **forward_options(modes)))
    else:
        table.extend(await model.context_backward(small(1), get(2), get(3), get(4), group,
                                                  kv_exchange=KV_EXCHANGES[exchange]))
    return at + 1 + k
