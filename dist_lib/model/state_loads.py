"""What a rank holds of a layer at the start of a step, by size: the bytes of a part of its weights and
optimizer state (`StateLoads._shard_bytes`), and the load of a distributed optimizer's rank, whose 16-bit
weights are whole and whose optimizer state is one shard (`load_sharded_state`). A mixin of `Model`."""

from __future__ import annotations

from typing import Any

from dist_lib.memory.tracker import OPTIMIZER_BYTES, WEIGHT_BYTES
from dist_lib.tensors import OptState, Weight


class StateLoads:
    """`_shard_bytes` and `load_sharded_state` on a `Model` (which supplies `_params`, `_shard_sizes`, `_mem`,
    `_state`, `workload`, `num_layers`, `rank` and `_explain_load`)."""

    __slots__ = ()
    _params: Any
    _shard_sizes: dict
    _mem: Any
    _state: Any
    workload: Any
    num_layers: int
    rank: int

    def _shard_bytes(self, layer: int, parts: int) -> tuple[int, ...]:
        """(weight bytes, optimizer bytes[, gradient bytes]) of one of `parts` equal parts of a layer,
        computed once per step so that every rank's buffers share the same int objects. The gradient's
        size is listed only where the workload's gradients are wider than its weights (fp32 gradients); the
        C ops read two-element entries only, so such layers take the Python path."""
        key = (layer, parts)
        sizes = self._shard_sizes.get(key)
        if sizes is None:
            params = self._params[layer] / parts
            sizes = (int(params * WEIGHT_BYTES), int(params * OPTIMIZER_BYTES))
            grad = int(params * WEIGHT_BYTES * self.workload.grad_bytes_per_element / self.workload.bytes_per_element)
            if grad != sizes[0]:
                sizes += (grad,)
            self._shard_sizes[key] = sizes
        return sizes

    def load_sharded_state(self, layer: int, shard: int, num_shards: int, *, tp_rank: int = 0,
                           tp_size: int = 1) -> tuple[Weight, OptState]:
        """A distributed optimizer's start of step (Megatron-LM's `--use-distributed-optimizer`, ZeRO-1): TP
        slice `tp_rank` of `tp_size` of the layer's 16-bit weights whole, and shard `shard` of `num_shards`
        of its optimizer state. What `load_weights` gives whole and `load_weights(layer, shard, num_shards)`
        gives sharded, without ever holding the whole optimizer state; both pieces are handed in at the end
        as each would be."""
        if layer.__class__ is not int or not 0 <= layer < self.num_layers or shard.__class__ is not int \
                or num_shards.__class__ is not int or not 0 <= shard < num_shards \
                or tp_rank.__class__ is not int or tp_size.__class__ is not int or not 0 <= tp_rank < tp_size:
            self._explain_load(layer, shard, num_shards, tp_rank, tp_size,  # type: ignore[attr-defined]
                               "load_sharded_state")
        weight_bytes = self._shard_bytes(layer, tp_size)[0]
        optimizer_bytes = self._shard_bytes(layer, tp_size * num_shards)[1]
        mem = self._mem
        mem.context = ("load_weights", layer)
        loaded = self._state.loaded
        loaded.append((layer, 1, 1, tp_rank, tp_size))
        loaded.append((layer, 1 << shard, num_shards, tp_rank, tp_size))
        return (Weight(mem, weight_bytes, self.rank, layer, 0, 1, 1, tp_rank, tp_size, 0),
                OptState(mem, optimizer_bytes, self.rank, layer, 0, 1 << shard, num_shards, tp_rank, tp_size, 0))
