"""'real' timing for the toy APIs: this simulator's device costs (dist_lib.costs.compute) on a cluster.

A toy tensor stands for a slice of a transformer workload: a layer's weight is that layer's
parameters, a batch of activations the samples' hidden states plus what backward of that layer
stashes. Durations come from dist_lib.costs.compute on the rank's own device, so a heterogeneous cluster
makes its slow ranks late; memory is counted in bytes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dist_lib.costs import compute as costs

from dist_lib.costs import network
from dist_lib.hardware.cluster import Cluster
from dist_lib.memory.tracker import OPTIMIZER_BYTES, WEIGHT_BYTES
from dist_lib.workload.transformer import Workload
from dist_lib.compat._runtime import CompatAssertionError, Settings

KIND = {"Weight": "weight", "OptState": "optimizer", "WeightGrad": "weight_grad", "Activation": "activation",
        "ActivationGrad": "activation_grad"}


def kind_of(value: Any) -> str:
    return KIND.get(type(value).__name__, "activation")


def samples_of(v: Any) -> frozenset:
    s = getattr(v, "batches", None)
    if s is None:
        s = getattr(v, "samples", frozenset())
    return frozenset(s)


def shard_fraction(v: Any) -> float:
    total = getattr(v, "total", None) or getattr(v, "num_shards", 1)
    return len(getattr(v, "shards", (0,))) / total


def default_cluster(world_size: int, device: str) -> Cluster:
    """`world_size` GPUs of one kind, in nodes of eight."""
    full, rest = divmod(world_size, 8)
    terms = ([f"{full}x8x{device}"] if full else []) + ([f"{rest}x{device}"] if rest else [])
    return Cluster.parse("+".join(terms))


def default_workload(api: str) -> Workload:
    if api == "lab":  # the lab's shape: hidden 4096, 1024 tokens per sample, 16-bit
        return Workload("lab-h4096", 1, 4096, 32, 1024, 0)
    return Workload("puzzles-h512", 1, 512, 8, 256, 0)  # the puzzles' HIDDEN=512, LENGTH=256


class RealCosts:
    """dist_lib.costs.compute on a (possibly heterogeneous) cluster; sizes from a transformer workload."""

    timing = "real"

    def __init__(self, cluster: Cluster, workload: Workload):
        self.cluster = cluster
        self.workload = workload
        self.world_size = cluster.world_size
        self.ring = cluster.ring_link(range(cluster.world_size))
        self._cache: dict[tuple, tuple[float, float]] = {}

    @classmethod
    def build(cls, settings: Settings, api: str, world_size: int, num_layers: int) -> RealCosts:
        s = settings
        cluster = Cluster.load(s.cluster) if s.cluster is not None else default_cluster(world_size, s.default_device)
        if cluster.world_size != world_size:
            raise CompatAssertionError(f"cluster {cluster.name} has {cluster.world_size} GPUs but "
                                       f"Dist has {world_size} ranks")
        workload = Workload.load(s.workload) if s.workload is not None else default_workload(api)
        return cls(cluster, replace(workload, num_layers=max(num_layers, 1)))

    def _params(self, layer: Any) -> int:
        layer = layer if isinstance(layer, int) and 0 <= layer < self.workload.num_layers else 0
        return self.workload.layer_params(layer)

    def compute(self, rank: int, op: str, layer: Any, n: int) -> tuple[float, float]:
        """(seconds, FLOPs) of forward, backward or loss of `n` samples at `layer` on `rank`'s device."""
        key = (rank, op, layer, n)
        hit = self._cache.get(key)
        if hit is None:
            device, w = self._device(rank), self.workload
            if op == "loss" or not isinstance(layer, int) or not 0 <= layer < w.num_layers:
                hit = (costs.loss_time(device, w, n), costs.compute_flops(w, "loss", 0, n)) if n else (0.0, 0.0)
            elif op == "forward":
                hit = (costs.forward_time(device, w, layer, n), costs.compute_flops(w, op, layer, n))
            else:
                hit = (costs.backward_time(device, w, layer, n), costs.compute_flops(w, op, layer, n))
            self._cache[key] = hit
        return hit

    def update(self, rank: int, layer: Any, fraction: float) -> float:
        return costs.update_time(self._device(rank), self._params(layer) * fraction)

    def _device(self, rank: int) -> Any:
        """`rank`'s device; a model whose rank is not one of its Dist's (the originals' defaults, rank 1
        on Dist(1)) computes on the device of the slot it is reported in (`build_result`): rank mod n."""
        n = self.cluster.world_size
        return self.cluster.device_of(rank if 0 <= rank < n else rank % n)

    def collective(self, op: str, value: Any, result: Any) -> float:
        p = self.world_size
        if op in ("allgather", "all_gather"):
            return network.all_gather_time(self.nbytes(result), p, self.ring)
        if op in ("scatterreduce", "reduce_scatter"):
            return network.reduce_scatter_time(self.nbytes(value), p, self.ring)
        return network.all_reduce_time(self.nbytes(value), p, self.ring)

    def p2p(self, src: int, dst: int, value: Any) -> float:
        if not 0 <= dst < self.world_size or src == dst:
            return 0.0
        return network.p2p_time(self.nbytes(value), self.cluster.p2p_link(src, dst))

    def nbytes(self, value: Any) -> float:
        """Bytes a toy tensor stands for: 2/12/2 bytes per parameter for weights/optimizer/gradients;
        a stored activation is what backward of its layer needs (the layer's whole stash)."""
        kind = KIND.get(type(value).__name__)
        w = self.workload
        if kind in ("weight", "weight_grad", "optimizer"):
            per = OPTIMIZER_BYTES if kind == "optimizer" else WEIGHT_BYTES
            return self._params(value.layer) * per * shard_fraction(value)
        n = len(samples_of(value))
        if kind == "activation" and isinstance(value.layer, int) and 0 <= value.layer < w.num_layers:
            return n * (w.activation_bytes() + w.stash_bytes(value.layer))
        if kind in ("activation", "activation_grad"):
            return n * w.activation_bytes()
        return 0.0
