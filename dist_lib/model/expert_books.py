"""`ExpertBooks`: what the ranks did with the routed experts of an MoE workload, for the end-of-step check
(every expert of every MoE layer handed in updated exactly once, with the gradients of every sample; under
expert tensor parallelism, every shard of it; as ZeRO shards, every ZeRO shard of it)."""

from __future__ import annotations

from collections.abc import Callable

from dist_lib.engine.core import Engine
from dist_lib.tensors import describe_mask, full_mask
from dist_lib.workload import moe as moe_layers
from dist_lib.workload.routing import alike_in_every_replica


class ExpertBooks:
    """What the ranks did with the experts, for the end-of-step check: the experts each rank loaded and
    handed in, and which (rank, layer, experts) were updated."""

    def __init__(self, engine: Engine):
        workload = engine.workload
        self.moe = workload.moe
        self.layers = [layer for layer in range(workload.num_layers) if self.moe.is_moe(layer)]
        h = workload.hidden
        # each layer's parameters without its routed experts: what `load_weights` holds
        self.dense_params = [workload.layer_params(layer) - moe_layers.routed_expert_params(self.moe, h, layer)
                             for layer in range(workload.num_layers)]
        self.expert_params = self.moe.expert_params(h)
        self.full_batch = engine.full_batch
        self.loaded: dict[tuple[int, int], set[int]] = {}  # (rank, layer) -> expert masks loaded
        # (rank, layer, experts, step, samples, tp_rank, tp_size, shards, num_shards): tp_rank and tp_size name an
        # expert-TP shard, shards of num_shards the ZeRO shards of it handed in (the distributed optimizer's)
        self.finals: list[tuple[int, int, int, int, int, int, int, int, int]] = []
        self.updated: set[tuple[int, int, int]] = set()
        # (cost function, device id, its arguments) -> (seconds, FLOPs): every rank prices the same few ops
        # (`MoEModel._priced`)
        self.costs: dict[tuple, tuple[float, float]] = {}
        # microbatch tokens -> (expert loads, their running sums), where they are the same for every layer and
        # microbatch (`ExpertParts._routing`); None for zipf's, drawn per microbatch
        self.routing: dict[int, tuple] | None = {} if alike_in_every_replica(self.moe) else None

    def problems(self, spread: Callable[[int, int], int] | None = None) -> list[str]:
        """One line per problem with the experts; empty when every expert was trained exactly once. `spread`:
        of a folded step's representatives, the ZeRO shards their replicas hold beside theirs (`run/folding`)."""
        out: list[str] = []
        everything = full_mask(self.moe.experts)
        handed: dict[int, int] = {}
        shards: dict[tuple[int, int, int], int] = {}  # (layer, experts, tp_size) -> expert-TP shards handed in
        zero: dict[tuple[int, int, int, int, int], int] = {}  # (..., tp_rank, num_shards) -> ZeRO shards handed in
        kept: dict[tuple[int, int], set[int]] = {}
        for rank, layer, experts, step, samples, tp_rank, tp_size, zero_shards, num_shards in self.finals:
            if step != 1:
                out.append(f"layer {layer}: rank {rank} handed in experts {describe_mask(experts)} "
                           + ("never updated" if step == 0 else f"updated {step} times"))
            elif samples != self.full_batch:
                out.append(f"layer {layer}: rank {rank}'s experts {describe_mask(experts)} were updated with the "
                           f"tokens of samples {describe_mask(samples)}, missing "
                           f"{describe_mask(self.full_batch & ~samples)}")
            if num_shards > 1:  # every ZeRO shard of this expert-TP shard, from the ranks that hold them
                at = (layer, experts, tp_size, tp_rank, num_shards)
                zero[at] = zero.get(at, 0) | (zero_shards if spread is None else spread(zero_shards, num_shards))
                if zero[at] != full_mask(num_shards):
                    kept.setdefault((rank, layer), set()).add(experts)
                    continue
            key = (layer, experts, tp_size)
            shards[key] = shards.get(key, 0) | 1 << tp_rank
            if shards[key] == full_mask(tp_size):  # every shard of these experts
                handed[layer] = handed.get(layer, 0) | experts
            kept.setdefault((rank, layer), set()).add(experts)
        for layer in self.layers:
            missing = everything & ~handed.get(layer, 0)
            if missing:
                partly = [f"{describe_mask(full_mask(size) & ~held)} of {size}" for (at, experts, size), held
                          in sorted(shards.items()) if at == layer and experts & missing and held != full_mask(size)]
                unsharded = sorted({f"{describe_mask(full_mask(num) & ~held)} of {num}" for (at, experts, _, _, num), held
                                    in zero.items() if at == layer and experts & missing and held != full_mask(num)})
                out.append(f"layer {layer}: no rank handed in experts {describe_mask(missing)}"
                           + (f" (their expert-TP shards {', '.join(partly)} are missing)" if partly else "")
                           + (f" (their ZeRO shards {', '.join(unsharded)} were not handed in: all_gather the "
                              f"updated shards over the expert-data-parallel group, or hand in every one)"
                              if unsharded else "")
                           + " (load_experts, update_experts and set_final_experts)")
        for (rank, layer), masks in sorted(self.loaded.items()):
            held = 0
            for m in kept.get((rank, layer), ()):
                held |= m
            lost = [m for m in masks if m & ~held]
            if lost:
                out.append(f"layer {layer}: rank {rank} loaded experts {describe_mask(lost[0])} but did not hand "
                           f"them in updated")
        return out
