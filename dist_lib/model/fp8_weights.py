"""What a forward's FP8 mode keeps beside its stash: Transformer Engine's FP8 copy of each layer's weights
(`costs.fp8.persistent_bytes`, `FP8WeightCache`), made by the layer's first FP8 forward with delayed
scaling on a rank and kept to the end of the step. A mixin of `Model` (whose forward and `context_forward`
check their modes through `_forward_modes`); torchao's tensorwise scaling keeps nothing."""

from __future__ import annotations

from typing import Any

from dist_lib.costs import fp8 as fp8_costs
from dist_lib.memory.tracker import WEIGHT, Buffer
from dist_lib.tensors import Weight


class FP8WeightCache(Buffer):
    """What Transformer Engine keeps of a layer's TP slice between passes once its linear layers have run in FP8
    with delayed scaling: the FP8 weight, its transpose and the scaling state (`costs.fp8.persistent_bytes`).
    Made by the layer's first FP8 forward on the rank; it lives to the end of the step, as TE's workspaces do."""

    __slots__ = ("layer", "tp_rank", "tp_size")
    code = WEIGHT  # memory.KINDS index

    _args = ("layer", "tp_rank", "tp_size")


class FP8Weights:
    """`_forward_modes` on a `Model` (which supplies `_mem`, `workload` and `_check_modes`)."""

    __slots__ = ()
    _mem: Any
    workload: Any

    def _forward_modes(self, layer: int, weight: Any, selective_recompute: Any, sequence_parallel: Any, fp8: Any,
                       op: str = "forward") -> None:
        """Check a forward's modes (`OpChecks._check_modes`); with delayed FP8 scaling, keep the layer's FP8
        weights from now on (once per layer and TP slice)."""
        self._check_modes(layer, selective_recompute, sequence_parallel, fp8, op)  # type: ignore[attr-defined]
        if fp8 != "delayed" or weight.__class__ is not Weight:
            return
        try:
            kept = self._fp8_weights  # type: ignore[attr-defined]
        except AttributeError:  # (made on the first FP8 forward: a 16-bit step never pays for the dict)
            kept = self._fp8_weights = {}  # type: ignore[attr-defined]
        key = (layer, weight.tp_rank, weight.tp_size)
        if key not in kept:
            self._mem.context = (op, layer)
            nbytes = fp8_costs.persistent_bytes(self.workload, weight.tp_size, "delayed")
            kept[key] = FP8WeightCache(self._mem, nbytes, layer, weight.tp_rank, weight.tp_size)
