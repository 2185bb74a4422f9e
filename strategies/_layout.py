"""The parallel layout (dp, pp, tp), microbatch splitting and layer partitions, validated in one place.

Ranks form a grid built from one reshape, as in Megatron-LM (Shoeybi et al. 2019; Narayanan et al.
2021, sec. 3): tensor parallelism varies fastest, so a TP group is `tp` consecutive ranks and sits
inside a node on NVLink; then data parallelism; the pipeline stage varies slowest:

    rank = (stage * dp + replica) * tp + tp_rank

Every check raises `ValueError` with a message that names the option to change.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

from dist_lib import ReplicaGrid


@dataclass(frozen=True)
class Layout:
    """Data-, pipeline- and tensor-parallel degrees of a world of `dp * pp * tp` ranks."""

    dp: int
    pp: int
    tp: int

    @classmethod
    def build(cls, world_size: int, dp: int | None = None, pp: int = 1, tp: int = 1) -> Layout:
        """A validated layout; `dp=None` takes whatever `pp` and `tp` leave of the world."""
        for name, value in (("pp", pp), ("tp", tp)):
            _positive_int(name, value)
        # tp is named only where it is not 1 (the pipeline strategies have no tp option to name)
        with_tp = f" x tp={tp}" if tp > 1 else ""
        if dp is None:
            if world_size % (pp * tp):
                raise ValueError(f"pp={pp}{with_tp} does not divide the world of {world_size} ranks; " +
                                 (f"choose pp and tp whose product divides {world_size}" if tp > 1
                                  else f"choose a pp that divides {world_size}"))
            dp = world_size // (pp * tp)
        _positive_int("dp", dp)
        if dp * pp * tp != world_size:
            raise ValueError(f"layout dp={dp} x pp={pp}{with_tp} = {dp * pp * tp} ranks, but the cluster has "
                             f"{world_size}; change {'dp, pp or tp' if tp > 1 else 'dp or pp'} so that their "
                             f"product is {world_size}")
        return cls(dp, pp, tp)

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(replica, stage, tp_rank) of a rank."""
        tp_rank = rank % self.tp
        replica = rank // self.tp % self.dp
        stage = rank // (self.tp * self.dp)
        return replica, stage, tp_rank

    def rank(self, replica: int, stage: int, tp_rank: int = 0) -> int:
        return (stage * self.dp + replica) * self.tp + tp_rank

    def tp_group(self, rank: int) -> list[int]:
        replica, stage, _ = self.coords(rank)
        return [self.rank(replica, stage, t) for t in range(self.tp)]

    def dp_group(self, rank: int) -> list[int]:
        _, stage, tp_rank = self.coords(rank)
        return [self.rank(d, stage, tp_rank) for d in range(self.dp)]

    def stage_ranks(self, rank: int) -> list[int]:
        """The rank holding each pipeline stage of this rank's replica and TP slice."""
        replica, _, tp_rank = self.coords(rank)
        return [self.rank(replica, s, tp_rank) for s in range(self.pp)]

    def check_tp_in_node(self, cluster) -> None:
        """TP all-reduces run twice per layer: keep each TP group on one node's fast link. A group of `tp`
        consecutive ranks spans nodes exactly when a node starts inside it, so the node boundaries are
        what is checked (every rank runs this check: one pass over the world's ranks each would make the
        setup of a large world quadratic); the first group that spans nodes is named."""
        tp, start = self.tp, 0
        for node in cluster.nodes:
            if start % tp:
                first = start - start % tp
                nodes = {cluster.node_of(r) for r in range(first, first + tp)}
                raise ValueError(f"tp={tp}: TP group of ranks {first}..{first + tp - 1} spans nodes "
                                 f"{sorted(nodes)}; choose a tp that divides the GPUs per node")
            start += node.gpus


def declared_grid(train, world_size: int, options: dict) -> ReplicaGrid:
    """The replica grid a strategy of this layout declares for folding (`dist_lib/run/folding.py`): its
    `dp`, `pp` and `tp` options, or their defaults in `train`'s signature (`pp=None`: one stage per rank).
    Its replicas run one program over block `replica` of the global batch (`replica_samples`)."""
    defaults = {name: p.default for name, p in inspect.signature(train).parameters.items()}
    pick = lambda name, default: options.get(name, defaults.get(name, default))  # noqa: E731
    pp = pick("pp", 1)
    layout = Layout.build(world_size, pick("dp", None), world_size if pp is None else pp, pick("tp", 1))
    return ReplicaGrid(layout.dp, layout.tp)


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")


def microbatches(first: int, count: int, microbatch_size: int) -> tuple[range, ...]:
    """`count` samples from `first`, cut into microbatches of `microbatch_size` (all the same size).
    The ranks of one replica share one tuple (thousands of ranks of hundreds of microbatches each)."""
    _positive_int("microbatch_size", microbatch_size)
    if count % microbatch_size:
        raise ValueError(f"microbatch_size={microbatch_size} does not divide the {count} samples a replica "
                         f"trains on; choose a microbatch_size that divides {count}")
    return _cut(first, count, microbatch_size)


@functools.lru_cache(maxsize=256)
def _cut(first: int, count: int, microbatch_size: int) -> tuple[range, ...]:
    return tuple(range(s, s + microbatch_size) for s in range(first, first + count, microbatch_size))


def replica_samples(global_batch: int, dp: int, replica: int) -> tuple[int, int]:
    """(first sample, count) of an even data-parallel share."""
    if global_batch % dp:
        raise ValueError(f"global batch {global_batch} does not split evenly over dp={dp} replicas; "
                         f"change the global batch size or dp")
    share = global_batch // dp
    return replica * share, share


def check_chunks(chunks: object) -> None:
    """Model chunks per rank (interleaved 1F1B's v): a whole number >= 1."""
    _positive_int("chunks", chunks)


def even_partition(num_layers: int, parts: int, option: str = "pp") -> list[range]:
    """Contiguous blocks of equal size; `option` is named in the error when they cannot be equal."""
    if parts > num_layers:
        raise ValueError(f"{num_layers} layers cannot fill {parts} pipeline blocks of at least one layer each; "
                         f"lower {option} to at most {num_layers}")
    if num_layers % parts:
        raise ValueError(f"{num_layers} layers do not split evenly into {parts} pipeline blocks; choose {option} "
                         f"so that it divides {num_layers}, or pass an explicit `partition`")
    size = num_layers // parts
    return [range(i * size, (i + 1) * size) for i in range(parts)]


def check_partition(partition: object, num_layers: int, parts: int, option: str = "partition") -> list[range]:
    """An explicit partition: `parts` layer counts (or ranges) that tile 0..num_layers-1 in order. `option`
    is what the error calls it (`partition[1]` for one replica's list of several). A count is at least one
    layer; an empty range is a block with no layer, which passes its input on unchanged (Megatron-LM builds
    a no-op layer for a model chunk left empty, as padding the layers to a multiple of the stages leaves the
    first and last chunk: `interleaved.padded_partition`)."""
    if not isinstance(partition, (list, tuple)) or len(partition) != parts:
        raise ValueError(f"{option} must list {parts} blocks (one per pipeline stage), got {partition!r}")
    blocks: list[range] = []
    start = 0
    for item in partition:
        if not isinstance(item, range) and (isinstance(item, bool) or not isinstance(item, int)):
            raise ValueError(f"{option} {partition!r}: block {item!r} is neither a whole number of layers nor a "
                             f"range of layers")
        size = len(item) if isinstance(item, range) else item
        if size < 1 and not (isinstance(item, range) and item.stop == item.start):
            raise ValueError(f"{option} {partition!r}: every block needs at least one layer (an empty block is "
                             f"an empty range, range(k, k), at the layer k where it sits)")
        if isinstance(item, range) and (item.start != start or item.step != 1):
            raise ValueError(f"{option} {partition!r}: blocks must be contiguous, in order (ranges of step 1)")
        blocks.append(range(start, start + size))
        start += size
    if start != num_layers:
        raise ValueError(f"{option} {partition!r} covers {start} layers but the model has {num_layers}; "
                         f"fix the partition option")
    return blocks
