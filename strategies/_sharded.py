"""Data-parallel sharding inside the 3D layout: Megatron's distributed optimizer (ZeRO-1) and FSDP/HSDP
(ZeRO-3) with tensor and pipeline parallelism, run by the shared pipeline runner (`_pipeline`).

Each TP slice of a layer is sharded over the stage's data-parallel group (shard i on the group's i-th rank,
the replica index, as a reduce-scatter leaves it):

* ``"optimizer"`` (Megatron-LM ``--use-distributed-optimizer``; megatron/core/optimizer/distrib_optimizer.py):
  every rank keeps the 16-bit weights and the fp32 main-gradient buffer whole and 1/dp of the fp32 master
  weights and Adam moments. A layer's gradient is reduce-scattered over the DP group once its last local
  microbatch has passed (with ``--overlap-grad-reduce``, during the rest of the backward:
  param_and_grad_buffer.py ``start_grad_sync``), each rank steps its 1/dp shard, and the updated 16-bit shards
  are all-gathered. With ``--overlap-param-gather`` that all-gather is not run after the step: the forward
  pre-hook of each bucket waits for its all-gather and dispatches the next bucket's (param_and_grad_buffer.py
  ``finish_param_sync``, ``next_param_gather_bucket_group``; distributed_data_parallel.py
  ``_make_forward_pre_hook``), so in the steady state a step starts from shards, gathers each layer before
  its first forward with the next layer's gather in flight, and ends with the updated shards. Buckets are
  here one layer each (Megatron's are at least 40M parameters: ``bucket_size``).
* ``"full"`` (PyTorch FSDP2's ``fully_shard`` per transformer block, as torchtitan applies it:
  torchtitan/distributed/fsdp.py): only the 16-bit weight shards live between uses; each block is
  all-gathered before its forward with the next block's all-gather prefetched, and resharded after the
  forward (``reshard_after_forward``) or kept until its backward. torchtitan's default keeps it with pipeline
  parallelism ("to avoid per-microbatch all-gathers", ``get_fsdp_reshard_after_forward_policy``) and reshards
  without. The backward gathers again what was resharded, prefetching the block before; after a block's
  last local microbatch its gradient is reduce-scattered (torch.distributed.pipelining syncs FSDP gradients on
  the last backward only) and the full weight dropped. Each rank steps its shard; the step hands in shards.
  HSDP is the same within a replicate group of the DP ranks (``replicate``): shards over dp/replicate ranks,
  then the shards' gradient all-reduced across the replicate groups (FSDP2 ``HSDP``:
  ``data_parallel_replicate_degree``), each issued as its reduce-scatter ends, during the rest of the backward
  (FSDP2's ``foreach_reduce`` runs it on its all-reduce stream right after the reduce-scatter:
  torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from dist_lib import Model, Work

from ._pipeline import StagePlan, _Stage

SHARDINGS = ("none", "optimizer", "full")


class ParamGathers:
    """The whole weights a sharded stage holds now, gathered from its DP shards: `get` awaits (or starts)
    a layer's all-gather and starts the next one's in the pass's order; the stage says when a whole
    weight may go (`after_forward`, `after_backward`). `weights` is the stage's layer -> (weight, optimizer
    state): with `keep` (the distributed optimizer, whose shard is a view of its whole 16-bit buffer) the
    whole weight takes the shard's place there once gathered, and stays to the step."""

    __slots__ = ("model", "group", "weights", "full", "reshard_after_forward", "keep")

    def __init__(self, model: Model, group: Sequence[int], weights: dict, *, reshard_after_forward: bool,
                 keep: bool) -> None:
        self.model, self.group, self.weights = model, group, weights
        self.full: dict = {}  # layer -> Work of its all-gather, or the whole Weight
        self.reshard_after_forward = reshard_after_forward
        self.keep = keep

    def start(self, layer: int) -> None:
        if layer not in self.full:
            self.full[layer] = self.model.all_gather(self.weights[layer][0], self.group)

    async def get(self, layer: int, block: range, backward: bool):
        self.start(layer)
        weight = self.full[layer]
        if isinstance(weight, Work):
            weight = self.full[layer] = await weight
            if self.keep:
                self.weights[layer] = (weight, self.weights[layer][1])
        nxt = layer - 1 if backward else layer + 1
        if nxt in block:  # prefetch: the next block's all-gather runs while this one computes
            self.start(nxt)
        return weight

    def after_forward(self, layer: int) -> None:
        if self.reshard_after_forward and not self.keep:
            self.full.pop(layer, None)

    def after_backward(self, layer: int, last: bool) -> None:
        if not self.keep and (last or self.reshard_after_forward):
            self.full.pop(layer, None)

    def drop(self, layer: int) -> None:
        self.full.pop(layer, None)


class ShardedStage(_Stage):
    """`_Stage` whose weights and optimizer state are sharded over its DP group (`SHARDINGS`)."""

    __slots__ = ("sharding", "dp_ranks", "shard", "replicate", "overlap_param_gather", "final_gathers", "in_flight",
                 "across")

    def __init__(self, model: Model, plan: StagePlan, sharding: str, *, overlap_param_gather: bool = True,
                 reshard_after_forward: bool | None = None, replicate: int = 1):
        if sharding not in SHARDINGS[1:]:
            raise ValueError(f"sharding must be one of {', '.join(SHARDINGS[1:])}, got {sharding!r}")
        self.sharding = sharding
        dp_ranks = list(plan.dp_group(0))
        if len(dp_ranks) % replicate:
            raise ValueError(f"replicate={replicate} does not divide the {len(dp_ranks)} data-parallel ranks of a "
                             f"stage; choose a replicate degree that divides dp")
        # HSDP: shard over consecutive runs of dp / replicate replicas, all-reduce across the runs
        size = len(dp_ranks) // replicate
        mine = dp_ranks.index(model.rank)
        self.replicate = [dp_ranks[i] for i in range(mine % size, len(dp_ranks), size)]
        self.dp_ranks = dp_ranks[mine - mine % size: mine - mine % size + size]
        self.shard = self.dp_ranks.index(model.rank)
        self.overlap_param_gather = overlap_param_gather
        self.final_gathers: dict = {}
        self.in_flight: list[int] = []  # layers whose gradient reduce-scatter was issued and not yet settled
        self.across: set[int] = set()  # HSDP: layers whose shard's all-reduce across the groups was issued
        super().__init__(model, plan)
        # FSDP2 frees a block's unsharded gradient once its reduce-scatter is done: before the next block's
        # reduce-scatter, the compute stream waits for the previous one and drops its buffers
        # (`FSDPParamGroup.post_backward`, torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py). The
        # distributed optimizer keeps its whole gradient buffer to the step anyway.
        self.settling = sharding == "full" and len(self.dp_ranks) > 1
        if reshard_after_forward is None:  # torchtitan's default: keep the whole weights with pipelining
            reshard_after_forward = len(plan.stage_ranks) == 1
        starts_sharded = sharding == "full" or overlap_param_gather
        if starts_sharded and len(self.dp_ranks) > 1:
            self.gathers = ParamGathers(model, self.dp_ranks, self.weights,
                                        reshard_after_forward=sharding == "full" and reshard_after_forward,
                                        keep=sharding == "optimizer")

    def load(self, layer: int) -> tuple:
        tp, tp_rank, n = len(self.plan.tp_group), self.plan.tp_rank, len(self.dp_ranks)
        model = self.model
        if self.sharding == "full" or self.overlap_param_gather:
            return model.load_weights(layer, self.shard, n, tp_rank=tp_rank, tp_size=tp)
        return model.load_sharded_state(layer, self.shard, n, tp_rank=tp_rank, tp_size=tp)

    def reduce(self, grad, group: Sequence[int]):
        if len(self.dp_ranks) == 1:
            return self.model.all_reduce(grad, self.replicate) if len(self.replicate) > 1 else grad
        return self.model.reduce_scatter(grad, self.dp_ranks)

    def _reduce(self, layer: int) -> None:
        grad = self.grads.pop(layer)
        alone = len(self.dp_ranks) == 1 and len(self.replicate) == 1
        self.reduced[layer] = grad if alone else self.reduce(grad, self.dp_ranks)
        if self.settling:
            self.in_flight.append(layer)

    async def settle(self) -> None:
        """Wait for every reduce-scatter issued before the newest one and keep its shard, so that the whole
        gradient it reduced is freed (FSDP2's wait on the previous block's reduce-scatter)."""
        in_flight, reduced = self.in_flight, self.reduced
        while len(in_flight) > 1:
            layer = in_flight.pop(0)
            reduced[layer] = await reduced[layer]
            if len(self.replicate) > 1:  # HSDP: the shard's all-reduce across the groups, issued now
                reduced[layer] = self.model.all_reduce(reduced[layer], self.replicate)
                self.across.add(layer)

    async def update_all(self) -> None:
        await self.finish_gradients()
        model = self.model
        hsdp = len(self.replicate) > 1 and len(self.dp_ranks) > 1
        gathered = self.final_gathers
        for layer in sorted(self.weights, reverse=True):
            grad = self.reduced.pop(layer)
            if isinstance(grad, Work):
                grad = await grad
            if hsdp and layer not in self.across:  # the shard's gradient summed across the replicate groups
                grad = await model.all_reduce(grad, self.replicate)
            weight, opt_state = self.weights.pop(layer)
            if self.gathers is not None:
                self.gathers.drop(layer)
            new_weight, _ = model.update(layer, grad, weight, opt_state)
            del grad, weight, opt_state
            if self.sharding == "optimizer" and not self.overlap_param_gather and len(self.dp_ranks) > 1:
                gathered[layer] = model.all_gather(new_weight, self.dp_ranks)
            else:
                model.set_final_weight(layer, new_weight)
            del new_weight
        for layer in sorted(gathered, reverse=True):
            model.set_final_weight(layer, await gathered.pop(layer))


def run_sharded_stage(model: Model, plan: StagePlan, sharding: str, **options):
    """This rank's part of the pipeline with sharded data parallelism, to await (as `run_stage`)."""
    if sharding == "none":
        from ._pipeline import run_stage
        return run_stage(model, plan)
    return ShardedStage(model, plan, sharding, **options).run()
