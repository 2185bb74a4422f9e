"""The recorded ops of context parallelism (`model.context_ops`): their opcodes and the mixin that records them.

They extend the program format of `recording.py` (opcodes after the MoE ops'; `replay_context.py` runs them):

    CONTEXT_INPUT cp_rank cp_size k (start stop) x k                   -> context activation
    CONTEXT_FORWARD layer act weight exchange k rank x k               -> context activation
    CONTEXT_BACKWARD layer act grad weight exchange k rank x k         -> context weight gradient, context
                                                                          activation gradient
    CONTEXT_LOSS act tp_rank tp_size                                   -> context activation gradient

`exchange` is the index of `kv_exchange` in `costs.context.KV_EXCHANGES`, plus, for a forward, len(KV_EXCHANGES)
times its modes (`forward_modes`: 1 for stash=False, 2 for selective_recompute, 4 for sequence_parallel, 8 x the
FP8 recipe's place in ("", *costs.fp8.RECIPES)), so a forward in the default modes is recorded as before; the k
ranks are the CP group's, in
its order. `context_forward` and `context_backward` are coroutines that send and receive key/value blocks and
await them inside the op: each is one decision of the strategy, recorded as one entry once it returns, and
replay awaits the same op, which issues the same messages. So that the entry is the whole truth, the rank does
nothing else while one is in flight (`Recorder.begin`): another task of the rank that issues an op or returns
from an await meanwhile is refused, naming both; a handle dropped meanwhile is dropped after the op's entry.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from dist_lib.costs.context import KV_EXCHANGES
from dist_lib.costs.fp8 import RECIPES as FP8_RECIPES
from dist_lib.run.recording_experts import FIRST_EXPERT_OPCODE, EXPERT_OPCODES, mask_intervals

CONTEXT_OPCODES = ("context_input", "context_forward", "context_backward", "context_loss")
FIRST_CONTEXT_OPCODE = FIRST_EXPERT_OPCODE + len(EXPERT_OPCODES)  # 37, after the MoE ops
CONTEXT_INPUT, CONTEXT_FORWARD, CONTEXT_BACKWARD, CONTEXT_LOSS = range(FIRST_CONTEXT_OPCODE, FIRST_CONTEXT_OPCODE + 4)


FP8_CHOICES = ("", *FP8_RECIPES)
MODE_COUNT = 8 * len(FP8_CHOICES)  # forward modes 0..MODE_COUNT - 1


def forward_modes(stash: bool, selective_recompute: bool, sequence_parallel: bool, fp8: str) -> int:
    """The modes word of a context forward the op has accepted (so each is a known value)."""
    return (not stash) + 2 * bool(selective_recompute) + 4 * bool(sequence_parallel) + 8 * FP8_CHOICES.index(fp8)


def forward_options(modes: int) -> dict:
    """The options of `context_forward` a modes word in 0..MODE_COUNT - 1 stands for."""
    return dict(stash=not modes & 1, selective_recompute=bool(modes & 2), sequence_parallel=bool(modes & 4),
                fp8=FP8_CHOICES[modes >> 3])


class ContextOpsRecording:
    """The context-parallel ops of a `RecordingModel` (which supplies `_model`, `_recorder`, `_rank`, `_emit`,
    `_wrap` and `_t`)."""

    __slots__ = ()
    _model: Any  # and RecordingModel's _recorder, _rank, _emit, _wrap and _t

    def context_input(self, samples: Any, cp_rank: int, cp_size: int) -> Any:
        act = self._model.context_input(samples, cp_rank, cp_size)
        spans = mask_intervals(act.samples)  # what was taken, however the samples were named
        self._emit(CONTEXT_INPUT, cp_rank, cp_size, len(spans) // 2, *spans)  # type: ignore[attr-defined]
        return self._wrap(act)  # type: ignore[attr-defined]

    async def context_forward(self, layer: int, act: Any, weight: Any, group: Any, *,
                              kv_exchange: str = "ring", stash: bool = True, selective_recompute: bool = False,
                              sequence_parallel: bool = False, fp8: str = "") -> Any:
        where = "context_forward"
        resolved = self._model._resolve_group(group, where)
        out = await self._in_flight(where, self._model.context_forward, layer, self._t(act, where),  # type: ignore
                                    self._t(weight, where), resolved, kv_exchange=kv_exchange, stash=stash,
                                    selective_recompute=selective_recompute, sequence_parallel=sequence_parallel,
                                    fp8=fp8)
        modes = forward_modes(stash, selective_recompute, sequence_parallel, fp8)
        exchange = KV_EXCHANGES.index(kv_exchange) + len(KV_EXCHANGES) * modes
        self._recorder.finish(self._rank, (  # type: ignore[attr-defined]
            CONTEXT_FORWARD, layer, act._number, weight._number, exchange, len(resolved.ranks), *resolved.ranks))
        return self._wrap(out)  # type: ignore[attr-defined]

    async def context_backward(self, layer: int, act: Any, grad: Any, weight: Any, group: Any, *,
                               kv_exchange: str = "ring") -> tuple[Any, Any]:
        where = "context_backward"
        resolved = self._model._resolve_group(group, where)
        weight_grad, act_grad = await self._in_flight(
            where, self._model.context_backward, layer, self._t(act, where), self._t(grad, where),  # type: ignore
            self._t(weight, where), resolved, kv_exchange=kv_exchange)  # type: ignore[attr-defined]
        self._recorder.finish(self._rank, (  # type: ignore[attr-defined]
            CONTEXT_BACKWARD, layer, act._number, grad._number, weight._number, KV_EXCHANGES.index(kv_exchange),
            len(resolved.ranks), *resolved.ranks))
        return self._wrap(weight_grad), self._wrap(act_grad)  # type: ignore[attr-defined]

    def context_loss(self, act: Any, *, tp_rank: int = 0, tp_size: int = 1) -> Any:
        out = self._model.context_loss(self._t(act, "context_loss"), tp_rank=tp_rank,  # type: ignore[attr-defined]
                                       tp_size=tp_size)
        self._emit(CONTEXT_LOSS, act._number, tp_rank, tp_size)  # type: ignore[attr-defined]
        return self._wrap(out)  # type: ignore[attr-defined]

    async def _in_flight(self, where: str, op: Callable[..., Coroutine[Any, Any, Any]], *args: Any,
                         **kwargs: Any) -> Any:
        """Run a context op, the rank's only business until it returns (`Recorder.begin`); the caller then
        records its entry with `Recorder.finish`. If it fails, it ends there with no entry."""
        self._recorder.begin(self._rank, where)  # type: ignore[attr-defined]
        try:
            return await op(*args, **kwargs)
        except BaseException:
            self._recorder.finish(self._rank, ())  # type: ignore[attr-defined]
            raise
