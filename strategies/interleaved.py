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

from dist_lib.schedules.actions import Action
from ._megatron_exchange import ExchangeOrder, exchange_choice
from ._layout import declared_grid
from ._plan import build_plan


def schedule(stage: int, stages: int, microbatches: int, chunks: int = 2) -> list[Action]:
    p, v, m = stages, chunks, microbatches
    _check_groups(p, m)
    total = m * v

    def F(k: int) -> Action:
        return Action("F", *_unit(k, False, p, v))

    def B(k: int) -> Action:
        return Action("B", *_unit(k, True, p, v))

    warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)  # 1. warm-up: fill every chunk's pipeline
    actions = [F(k) for k in range(warmup)]
    for k in range(total - warmup):  # 2. steady state: one chunk forward, one chunk backward
        actions += [F(warmup + k), B(k)]
    actions += [B(k) for k in range(total - warmup, total)]  # 3. cool-down
    return actions


def _check_groups(p: int, m: int) -> None:
    if m % p:
        raise ValueError(f"interleaved 1F1B runs microbatches in groups of pp={p}, but there are {m}; "
                         f"choose microbatch_size so that the number of microbatches per replica is a "
                         f"multiple of {p}")


def _unit(k: int, backward: bool, p: int, v: int) -> tuple[int, int]:
    """The k-th (chunk, microbatch) a rank runs forward (or backward); k may be negative or past the end, as
    Megatron-LM's `get_model_chunk_id` takes it (the chunk of k modulo a group of p x v)."""
    group, within = divmod(k, p * v)
    chunk = within // p
    return (v - 1 - chunk if backward else chunk), group * p + within % p


def megatron_schedule(stage: int, stages: int, microbatches: int, chunks: int = 2,
                      overlap: bool = False) -> list[Action]:
    """The same passes with Megatron-LM's exchanges (`_megatron_exchange.py`), as
    `forward_backward_pipelining_with_interleaving` (megatron/core/pipeline_parallel/schedules.py, the version
    of sail-sg/zero-bubble-pipeline-parallelism commit f68d3879) calls them: which messages each call carries
    follows its `recv_prev`/`recv_next` rules (the first stage runs p - 1 forwards ahead of the last, so it
    receives an activation after a steady-state forward unless the last stage's forward of that step was of its
    last chunk; the last stage likewise for gradients); with `overlap` (`overlap_p2p_comm`) the warm-up and
    steady-state calls are waited for before the next pass of their direction, the cool-down's at once. With
    m = p every pass is a warm-up forward, then every backward (Megatron-LM's `all_warmup_microbatches`)."""
    p, v, m, s = stages, chunks, microbatches, stage
    _check_groups(p, m)
    if v > 1 and p <= 2:
        # with two stages the previous and the next stage are one rank, and the messages of an exchange to it
        # would pair up out of order (megatron/arguments.py asserts pipeline-model-parallel size > 2 with the
        # interleaved schedule)
        raise ValueError(f"Megatron-LM's exchange with chunks={v} needs pp > 2, got pp={p}; use megatron_exchange=None "
                         f"or more stages")
    total, first, last = m * v, s == 0, s == p - 1
    everything_warm = m == p
    warmup = total if everything_warm else min((p - s - 1) * 2 + (v - 1) * p, total)
    remaining = total - warmup

    def chunk(k: int, backward: bool) -> int:
        return _unit(k, backward, p, v)[0]

    def sent_activation(k: int) -> tuple[int, int] | None:  # none from the last virtual stage
        return None if last and chunk(k, False) == v - 1 else _unit(k, False, p, v)

    def sent_gradient(k: int) -> tuple[int, int] | None:  # none from the first virtual stage
        return None if first and chunk(k, True) == 0 else _unit(k, True, p, v)

    order = ExchangeOrder(s, p, v)
    order.issue(receive_activation=not first)  # recv_forward of the first forward
    for k in range(warmup):
        if overlap:
            order.wait("activation")
        order.run("F", *_unit(k, False, p, v))
        receive = not (first and chunk(k + 1, False) == 0) and k != total - 1
        ends_warmup = k == warmup - 1 and not everything_warm  # the first gradient comes in too
        if overlap:
            order.issue(sent_activation(k), receive, wait=False)
            if ends_warmup:
                order.issue(receive_gradient=not last, wait=False)
        else:
            order.issue(sent_activation(k), receive, receive_gradient=ends_warmup and not last)
    for k in range(remaining):
        f = warmup + k
        receive_a = (chunk(f - (p - 1), False) != v - 1 if first else True) and k != remaining - 1
        receive_g = chunk(k - (p - 1), True) != 0 if last else True
        if overlap:
            order.wait("activation")
            order.run("F", *_unit(f, False, p, v))
            order.issue(sent_activation(f), receive_a, wait=False)
            order.wait("activation gradient")
            order.run("B", *_unit(k, True, p, v))
            order.issue(send_gradient=sent_gradient(k), receive_gradient=receive_g, wait=False)
        else:
            order.run("F", *_unit(f, False, p, v))
            order.run("B", *_unit(k, True, p, v))
            order.issue(sent_activation(f), receive_a, sent_gradient(k), receive_g)
    order.wait("activation gradient")
    if everything_warm:
        order.issue(receive_gradient=not last)  # recv_backward
    for k in range(remaining, total):
        order.run("B", *_unit(k, True, p, v))
        receive = not (last and chunk(k + 1, True) == v - 1) and k != total - 1
        order.issue(send_gradient=sent_gradient(k), receive_gradient=receive)
    return order.actions()


def megatron_overlap_schedule(stage: int, stages: int, microbatches: int, chunks: int = 2) -> list[Action]:
    """`megatron_schedule` with `overlap_p2p_comm` (a function of its own, so that plans cache it)."""
    return megatron_schedule(stage, stages, microbatches, chunks, overlap=True)


EXCHANGE_SCHEDULES = {"blocking": megatron_schedule, "overlap": megatron_overlap_schedule}


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
                partition=None, recompute: bool = False, megatron_exchange: str | None = None) -> None:
    """`megatron_exchange`: None (sends go without blocking, a pass receives its input when it starts),
    "blocking" or "overlap": Megatron-LM's exchanges (`megatron_schedule`), with `overlap_p2p_comm` off or on."""
    schedule_fn, run = exchange_choice(megatron_exchange, schedule, EXCHANGE_SCHEDULES)
    plan = build_plan(model, schedule_fn, microbatch_size=microbatch_size, pp=model.world_size if pp is None else pp,
                      chunks=chunks, partition=partition, recompute=recompute)
    await run(model, plan)


def replica_grid(world_size: int, global_batch_size: int, **options):
    """Its replicas run one program, each over its share of the batch: they fold (`_layout.declared_grid`)."""
    return declared_grid(train, world_size, options)
