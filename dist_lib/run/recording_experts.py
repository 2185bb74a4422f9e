"""The recorded ops of a mixture-of-experts rank (`MoEModel`): their opcodes and the mixin that records them.

They extend the program format of `recording.py` (opcodes after its own; `replay_experts.py` runs them).
Experts are written as the half-open intervals of the expert numbers the op took (read from its result, so
a range and a list of the same experts record alike):

    LOAD_EXPERTS layer c (start stop) x c tp_rank tp_size shard num_shards -> expert weight, optimizer state
    UPDATE_EXPERTS layer grad weight opt               -> expert weight, expert optimizer state
    FINAL_EXPERTS layer weight                         -> (nothing)
    ROUTE layer act weight modes                       -> routed
    SHARED_EXPERTS layer routed weight fp8             -> (nothing)
    DISPATCH routed c (start stop) x c                 -> tokens
    EXPERT_FORWARD layer weight modes k piece x k      -> k expert outputs (a handle each)
    COMBINE routed k piece x k                         -> activation
    COMBINE_BACKWARD routed grad c (start stop) x c    -> tokens (the output gradient for those experts)
    EXPERT_BACKWARD layer tokens grad weight           -> expert gradient, tokens (input gradient)
    ROUTE_BACKWARD layer act grad routed weight k piece x k -> weight gradient, activation gradient
    REDUCE_ROUTED k piece x k                          -> routed (after the context ops' opcodes)
    EXPERT_BACKWARD_GROUPED layer weight k tokens x k grad x k -> expert gradient, k tokens (input gradients;
                                                          expert_backward given lists: after LOAD_SHARDED_STATE)

Under TP, ROUTE yields one handle per sequence part (its pieces, in order). `fp8` is the op's FP8 recipe as
its index in `FP8_RECIPES` (0: 16-bit); `modes` the same plus `NO_STASH` for stash=False, `SELECTIVE` for
selective_recompute=True and `RECOMPUTE_MODULE` for ROUTE's recompute_norm=True or EXPERT_FORWARD's
recompute_activation=True.
"""

from __future__ import annotations

from typing import Any

EXPERT_OPCODES = ("load_experts", "update_experts", "set_final_experts", "route", "shared_experts", "dispatch",
                  "expert_forward", "combine", "combine_backward", "expert_backward", "route_backward")
FIRST_EXPERT_OPCODE = 26  # after recording.py's own
(LOAD_EXPERTS, UPDATE_EXPERTS, FINAL_EXPERTS, ROUTE, SHARED_EXPERTS, DISPATCH, EXPERT_FORWARD, COMBINE,
 COMBINE_BACKWARD, EXPERT_BACKWARD, ROUTE_BACKWARD) = range(FIRST_EXPERT_OPCODE, FIRST_EXPERT_OPCODE + 11)
# the MoE op added after the context ops (`recording_context.CONTEXT_OPCODES`, 4 of them), so that the
# earlier opcodes keep their numbers
EXPERT_TP_OPCODES = ("reduce_routed",)
REDUCE_ROUTED = FIRST_EXPERT_OPCODE + 11 + 4
# the grouped form of expert_backward, after `recording.LOAD_SHARDED_STATE` (42)
EXPERT_GROUPED_OPCODES = ("expert_backward",)
EXPERT_BACKWARD_GROUPED = REDUCE_ROUTED + 2
EXPERT_QUERIES = ("expert_loads", "is_moe_layer")
FP8_RECIPES = ("", "delayed", "tensorwise", "rowwise")  # an MoE op's `fp8`, recorded as its index
NO_STASH, SELECTIVE, RECOMPUTE_MODULE = 4, 8, 16  # flags beside it  # MoEModel methods that only answer (they decide nothing)


def mask_intervals(mask: int) -> list[int]:
    """A mask of samples or experts as flat [start, stop, start, stop, ...] half-open intervals."""
    out: list[int] = []
    i = 0
    while mask >> i:
        if mask >> i & 1:
            j = i
            while mask >> j & 1:
                j += 1
            out += (i, j)
            i = j
        else:
            i += (((mask >> i) & -(mask >> i)).bit_length() - 1)  # skip to the next set bit
    return out


class ExpertOpsRecording:
    """The MoE ops of a `RecordingModel` (which supplies `_model`, `_emit`, `_wrap` and `_t`)."""

    __slots__ = ()
    _model: Any  # and RecordingModel's _emit, _wrap and _t

    def _experts_words(self, mask: int) -> list[int]:
        spans = mask_intervals(mask)
        return [len(spans) // 2, *spans]

    def _pieces(self, pieces: Any, where: str) -> tuple[list, list] | None:
        """The handles given (read once, a generator too) and the tensors behind them; None when `pieces` is
        not iterable (the op refuses it, with its message)."""
        try:
            handles = list(pieces)
        except TypeError:
            return None
        return handles, [self._t(p, where) for p in handles]  # type: ignore[attr-defined]

    def load_experts(self, layer: int, experts: Any, *, tp_rank: int = 0, tp_size: int = 1, shard: int = 0,
                     num_shards: int = 1) -> tuple[Any, Any]:
        weight, opt = self._model.load_experts(layer, experts, tp_rank=tp_rank, tp_size=tp_size, shard=shard,
                                               num_shards=num_shards)
        self._emit(LOAD_EXPERTS, layer, *self._experts_words(weight.experts), tp_rank, tp_size, shard, num_shards)
        return self._wrap(weight), self._wrap(opt)

    def update_experts(self, layer: int, grad: Any, weight: Any, opt_state: Any) -> tuple[Any, Any]:
        out = self._model.update_experts(layer, self._t(grad, "update_experts"), self._t(weight, "update_experts"),
                                         self._t(opt_state, "update_experts"))
        self._emit(UPDATE_EXPERTS, layer, grad._number, weight._number, opt_state._number)
        return self._wrap(out[0]), self._wrap(out[1])

    def set_final_experts(self, layer: int, weight: Any) -> None:
        self._model.set_final_experts(layer, self._t(weight, "set_final_experts"))
        self._emit(FINAL_EXPERTS, layer, weight._number)

    def route(self, layer: int, act: Any, weight: Any, *, fp8: str = "", stash: bool = True,
              selective_recompute: bool = False, recompute_norm: bool = False) -> Any:
        out = self._model.route(layer, self._t(act, "route"), self._t(weight, "route"), fp8=fp8, stash=stash,
                                selective_recompute=selective_recompute, recompute_norm=recompute_norm)
        self._emit(ROUTE, layer, act._number, weight._number, FP8_RECIPES.index(fp8) + (0 if stash else NO_STASH)
                   + (SELECTIVE if selective_recompute else 0) + (RECOMPUTE_MODULE if recompute_norm else 0))
        return self._wrap(out)

    def reduce_routed(self, pieces: Any) -> Any:
        listed = self._pieces(pieces, "reduce_routed")
        if listed is None:
            return self._model.reduce_routed(pieces)
        handles, given = listed
        out = self._model.reduce_routed(given)
        self._emit(REDUCE_ROUTED, len(handles), *(p._number for p in handles))
        return self._wrap(out)

    def shared_experts(self, layer: int, routed: Any, weight: Any, *, fp8: str = "") -> None:
        self._model.shared_experts(layer, self._t(routed, "shared_experts"), self._t(weight, "shared_experts"),
                                   fp8=fp8)
        self._emit(SHARED_EXPERTS, layer, routed._number, weight._number, FP8_RECIPES.index(fp8))

    def dispatch(self, routed: Any, experts: Any) -> Any:
        out = self._model.dispatch(self._t(routed, "dispatch"), experts)
        self._emit(DISPATCH, routed._number, *self._experts_words(out.experts))
        return self._wrap(out)

    def expert_forward(self, layer: int, pieces: Any, weight: Any, *, fp8: str = "", stash: bool = True,
                       recompute_activation: bool = False) -> list:
        listed = self._pieces(pieces, "expert_forward")
        if listed is None:  # refused there, with its message
            return self._model.expert_forward(layer, pieces, weight, fp8=fp8, stash=stash,
                                              recompute_activation=recompute_activation)
        handles, given = listed
        outs = self._model.expert_forward(layer, given, self._t(weight, "expert_forward"), fp8=fp8, stash=stash,
                                          recompute_activation=recompute_activation)
        self._emit(EXPERT_FORWARD, layer, weight._number, FP8_RECIPES.index(fp8) + (0 if stash else NO_STASH)
                   + (RECOMPUTE_MODULE if recompute_activation else 0),
                   len(handles),
                   *(p._number for p in handles))
        return self._wrap(outs)

    def combine(self, routed: Any, pieces: Any) -> Any:
        listed = self._pieces(pieces, "combine")
        if listed is None:
            return self._model.combine(routed, pieces)
        handles, given = listed
        out = self._model.combine(self._t(routed, "combine"), given)
        self._emit(COMBINE, routed._number, len(handles), *(p._number for p in handles))
        return self._wrap(out)

    def combine_backward(self, routed: Any, grad: Any, experts: Any) -> Any:
        out = self._model.combine_backward(self._t(routed, "combine_backward"), self._t(grad, "combine_backward"),
                                           experts)
        self._emit(COMBINE_BACKWARD, routed._number, grad._number, *self._experts_words(out.experts))
        return self._wrap(out)

    def expert_backward(self, layer: int, tokens: Any, grad: Any, weight: Any) -> tuple[Any, Any]:
        where = "expert_backward"
        if tokens.__class__ in (list, tuple):  # the grouped form: every piece of one expert_forward
            if grad.__class__ not in (list, tuple):  # refused there, with its message
                return self._model.expert_backward(layer, [self._t(p, where) for p in tokens], grad,
                                                   self._t(weight, where))
            out = self._model.expert_backward(layer, [self._t(p, where) for p in tokens],
                                              [self._t(g, where) for g in grad], self._t(weight, where))
            self._emit(EXPERT_BACKWARD_GROUPED, layer, weight._number, len(tokens), *(p._number for p in tokens),
                       *(g._number for g in grad))
            return self._wrap(out[0]), self._wrap(out[1])
        out = self._model.expert_backward(layer, self._t(tokens, where), self._t(grad, where), self._t(weight, where))
        self._emit(EXPERT_BACKWARD, layer, tokens._number, grad._number, weight._number)
        return self._wrap(out[0]), self._wrap(out[1])

    def route_backward(self, layer: int, act: Any, grad: Any, routed: Any, pieces: Any,
                       weight: Any) -> tuple[Any, Any]:
        listed = self._pieces(pieces, "route_backward")
        if listed is None:
            return self._model.route_backward(layer, act, grad, routed, pieces, weight)
        handles, given = listed
        where = "route_backward"
        out = self._model.route_backward(layer, self._t(act, where), self._t(grad, where), self._t(routed, where),
                                         given, self._t(weight, where))
        self._emit(ROUTE_BACKWARD, layer, act._number, grad._number, routed._number, weight._number, len(handles),
                   *(p._number for p in handles))
        return self._wrap(out[0]), self._wrap(out[1])
