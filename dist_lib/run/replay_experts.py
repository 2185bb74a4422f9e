"""Replay of the MoE ops of a recorded program (their format: `recording_experts.py`), checked as untrusted
data as `replay.py` checks the rest: operand counts, handles defined and live, expert intervals inside the
workload's experts. The `MoEModel` ops then check what the program does with them."""

from __future__ import annotations

from array import array
from typing import Any, Callable

from dist_lib.run.recording_experts import (COMBINE, COMBINE_BACKWARD, DISPATCH, EXPERT_BACKWARD,
                                            EXPERT_BACKWARD_GROUPED, EXPERT_FORWARD, FINAL_EXPERTS, FP8_RECIPES,
                                            LOAD_EXPERTS, NO_STASH, RECOMPUTE_MODULE, REDUCE_ROUTED, ROUTE,
                                            ROUTE_BACKWARD, SELECTIVE, SHARED_EXPERTS, UPDATE_EXPERTS)

# operands after the opcode, for the fixed-size entries
EXPERT_ARITY = {UPDATE_EXPERTS: 4, FINAL_EXPERTS: 2, ROUTE: 4, SHARED_EXPERTS: 4, EXPERT_BACKWARD: 4}


def run_expert_op(model: Any, program: array, i: int, n: int, table: list, get: Callable[[int], Any],
                  small: Callable[[int], int], fail: Callable[[str], Exception]) -> int:
    """Run the MoE entry at word `i` on `model`; the index of the next entry. `get(k)` is the live object of
    the handle in operand k, `small(k)` operand k as a bounded integer, `fail(why)` the `ProgramError`."""
    op = program[i]
    if not hasattr(model, "moe"):
        raise fail(f"workload {model.workload.name} has no experts")
    def modes(k: int, allowed: int = 0) -> dict:
        """Operand k as an op's modes: its FP8 recipe, and the flags `allowed` of NO_STASH, SELECTIVE and
        RECOMPUTE_MODULE (ROUTE's `recompute_norm`, EXPERT_FORWARD's `recompute_activation`)."""
        code = program[i + k]
        if not 0 <= code < 32 or code & 3 >= len(FP8_RECIPES) or code & ~3 & ~allowed:
            raise fail(f"mode code {code} is not an FP8 recipe index with the flags this op takes")
        out: dict = {"fp8": FP8_RECIPES[code & 3]}
        if allowed & NO_STASH:
            out["stash"] = not code & NO_STASH
        if allowed & SELECTIVE:
            out["selective_recompute"] = bool(code & SELECTIVE)
        if allowed & RECOMPUTE_MODULE:
            out["recompute_norm" if op == ROUTE else "recompute_activation"] = bool(code & RECOMPUTE_MODULE)
        return out

    arity = EXPERT_ARITY.get(op)
    if arity is not None:
        if i + arity >= n:
            raise fail("the program ends inside this entry")
        if op == UPDATE_EXPERTS:
            table.extend(model.update_experts(small(1), get(2), get(3), get(4)))
        elif op == FINAL_EXPERTS:
            model.set_final_experts(small(1), get(2))
        elif op == ROUTE:
            out = model.route(small(1), get(2), get(3), **modes(4, NO_STASH | SELECTIVE | RECOMPUTE_MODULE))
            table.extend(out) if out.__class__ is list else table.append(out)  # under TP: a piece per part
        elif op == SHARED_EXPERTS:
            model.shared_experts(small(1), get(2), get(3), **modes(4))
        else:
            table.extend(model.expert_backward(small(1), get(2), get(3), get(4)))
        return i + 1 + arity
    count = model.moe.experts

    def experts(at: int) -> tuple[list[int], int]:
        """The experts named at word `at` (a count c, then c intervals) and the index past them."""
        c = program[at] if at < n else -1
        if not 1 <= c <= count or at + 2 * c >= n:
            raise fail(f"expert interval count {c} is not in 1..{count} or runs past the program's end")
        out: list[int] = []
        for k in range(c):
            start, stop = program[at + 1 + 2 * k], program[at + 2 + 2 * k]
            if not 0 <= start < stop <= count:
                raise fail(f"experts {start}..{stop} are not an interval of the {count} experts")
            out.extend(range(start, stop))
        return out, at + 1 + 2 * c

    def handles(at: int) -> tuple[list[Any], int]:
        """The k handles named at word `at` (a count k, then k handles) and the index past them."""
        k = program[at] if at < n else -1
        if not 0 <= k <= len(table) or at + k >= n:
            raise fail(f"piece count {k} is not in 0..{len(table)} or runs past the program's end")
        return [get(at + 1 + j - i) for j in range(k)], at + 1 + k

    if op == LOAD_EXPERTS:
        if i + 1 >= n:
            raise fail("the program ends inside this entry")
        chosen, at = experts(i + 2)
        if at + 3 >= n:
            raise fail("the program ends inside this entry")
        table.extend(model.load_experts(small(1), chosen, tp_rank=small(at - i), tp_size=small(at + 1 - i),
                                        shard=small(at + 2 - i), num_shards=small(at + 3 - i)))
        at += 4
    elif op == DISPATCH:
        chosen, at = experts(i + 2)
        table.append(model.dispatch(get(1), chosen))
    elif op == COMBINE_BACKWARD:
        chosen, at = experts(i + 3)
        table.append(model.combine_backward(get(1), get(2), chosen))
    elif op == EXPERT_FORWARD:
        if i + 3 >= n:
            raise fail("the program ends inside this entry")
        pieces, at = handles(i + 4)
        table.extend(model.expert_forward(small(1), pieces, get(2), **modes(3, NO_STASH | RECOMPUTE_MODULE)))
    elif op == COMBINE:
        pieces, at = handles(i + 2)
        table.append(model.combine(get(1), pieces))
    elif op == REDUCE_ROUTED:
        pieces, at = handles(i + 1)
        table.append(model.reduce_routed(pieces))
    elif op == ROUTE_BACKWARD:
        pieces, at = handles(i + 6)
        table.extend(model.route_backward(small(1), get(2), get(3), get(4), pieces, get(5)))
    elif op == EXPERT_BACKWARD_GROUPED:
        pieces, at = handles(i + 3)
        k = len(pieces)
        if at + k > n:
            raise fail("the program ends inside this entry")
        grads = [get(at + j - i) for j in range(k)]
        expert_grad, input_grads = model.expert_backward(small(1), pieces, grads, get(2))
        table.append(expert_grad)
        table.extend(input_grads)
        at += k
    else:
        raise fail(f"unknown opcode {op}")
    return at
