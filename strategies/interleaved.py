"""Interleaved 1F1B: each rank holds `chunks` (v) non-contiguous model chunks.

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", sec. 2.2.2. With L layers cut into p x v blocks, rank s runs blocks s, s + p, ...; a
microbatch passes every rank v times, each time doing 1/v of the work, so the pipeline fills v times
faster: bubble (p - 1) / v x (F + B) per stage, the 1F1B bubble divided by v, at the cost of v times
more point-to-point messages. The first stage holds about p + (v - 1) p / v... microbatch-chunks of
activations: warm-up is (p - s - 1) x 2 + (v - 1) x p chunk forwards. Microbatches go in groups of p,
so m must be a multiple of p (as in Megatron-LM).

`padded_partition` lays the layers out as Qi et al. 2024 ran their 1F1B-I baseline (the Zero Bubble runtime,
sail-sg/zero-bubble-pipeline-parallelism, `--allow-padding-num-layers` with one layer per chunk): the layers
are padded to a whole number per chunk and the padding taken from the last chunk, then the first, so those
chunks may hold no layer at all; such a chunk passes its input on (Megatron-LM's no-op layer).
"""

from __future__ import annotations

from dist_lib import Model

from ._actions import Action
from ._pipeline import run_stage
from ._plan import build_plan


def schedule(stage: int, stages: int, microbatches: int, chunks: int = 2) -> list[Action]:
    p, v, m = stages, chunks, microbatches
    if m % p:
        raise ValueError(f"interleaved 1F1B runs microbatches in groups of pp={p}, but there are {m}; "
                         f"choose microbatch_size so that the number of microbatches per replica is a "
                         f"multiple of {p}")
    total = m * v

    def unit(k: int, backward: bool) -> tuple[int, int]:
        """The k-th (chunk, microbatch) this rank runs forward (or backward)."""
        group, within = divmod(k, p * v)
        chunk = within // p
        return (v - 1 - chunk if backward else chunk), group * p + within % p

    def F(k: int) -> Action:
        return Action("F", *unit(k, False))

    def B(k: int) -> Action:
        return Action("B", *unit(k, True))

    warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)  # 1. warm-up: fill every chunk's pipeline
    actions = [F(k) for k in range(warmup)]
    for k in range(total - warmup):  # 2. steady state: one chunk forward, one chunk backward
        actions += [F(warmup + k), B(k)]
    actions += [B(k) for k in range(total - warmup, total)]  # 3. cool-down
    return actions


def padded_partition(num_layers: int, stages: int, chunks: int) -> list[range]:
    """Each block's layers (block c x stages + s is chunk c of stage s) as the Zero Bubble runtime lays them out
    (megatron/model/transformer.py, `ParallelTransformer.get_offset`, added with `--allow-padding-num-layers`
    in commit cff01bfd): the layers are padded up to a multiple of the stages, each chunk gets the same share
    of the padded count, and each padding layer is taken off one block, the last block first, then the first,
    the second, ... (`for _index in range(-1, num_padding - 1): chunk_sizes[_index] -= 1`). With 62 layers on
    32 stages of 2 chunks: 64 padded, one layer a chunk, and block 0 (stage 0's first chunk) and block 63
    (stage 31's second) empty."""
    if stages < 1 or chunks < 1 or num_layers < 1:
        raise ValueError(f"padded_partition needs num_layers, stages and chunks >= 1, got {num_layers}, {stages}, "
                         f"{chunks}")
    blocks = stages * chunks
    size = -(-num_layers // blocks)  # layers per chunk once padded
    padding = size * blocks - num_layers
    if padding >= stages:
        raise ValueError(f"{num_layers} layers padded to a multiple of {stages} stages do not split into {chunks} "
                         f"equal chunks per stage (the runtime's padding is fewer than the stages); choose chunks "
                         f"dividing {-(-num_layers // stages)}")
    sizes = [size] * blocks
    for index in range(-1, padding - 1):
        sizes[index] -= 1
    out, start = [], 0
    for n in sizes:
        out.append(range(start, start + n))
        start += n
    return out


async def train(model: Model, *, microbatch_size: int = 1, pp: int | None = None, chunks: int = 2,
                partition=None, recompute: bool = False) -> None:
    plan = build_plan(model, schedule, microbatch_size=microbatch_size, pp=model.world_size if pp is None else pp,
                      chunks=chunks, partition=partition, recompute=recompute)
    await run_stage(model, plan)
