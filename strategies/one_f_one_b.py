"""1F1B (PipeDream-Flush): warm-up forwards, then one forward / one backward, then cool-down.

Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training" (PipeDream-2BW/Flush) and
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", sec. 2.2.1.
Same bubble as GPipe, (p - 1) / (m + p - 1) of the step, but stage s holds at most p - s microbatches
of activations (p on the first stage) instead of m, because each backward frees one as soon as the
pipeline is full. Ranks beyond `pp` become data-parallel replicas.
"""

from __future__ import annotations

from dist_lib import Model

from dist_lib.schedules.actions import Action
from dist_lib.schedules.one_f_one_b import schedule
from ._megatron_exchange import ExchangeOrder, exchange_choice
from ._layout import declared_grid
from ._plan import build_plan


def megatron_schedule(stage: int, stages: int, microbatches: int, chunks: int = 1) -> list[Action]:
    """The same passes with Megatron-LM's exchanges (`_megatron_exchange.py`), as
    `forward_backward_pipelining_without_interleaving` (megatron/core/pipeline_parallel/schedules.py, the version
    of sail-sg/zero-bubble-pipeline-parallelism commit f68d3879; megatron/schedules.py of 2021 calls the same)
    calls them, each waited for at once: `recv_forward` and `send_forward` around each warm-up forward, then
    `recv_forward` once; `send_forward_recv_backward` after each steady-state forward and
    `send_backward_recv_forward` (the last: `send_backward`) after its backward; `recv_backward` and
    `send_backward` around each cool-down backward. The first stage receives no activation, the last sends none
    and receives no gradient."""
    order_of_passes = schedule(stage, stages, microbatches, chunks)
    m, first, last = microbatches, stage == 0, stage == stages - 1
    warmup = min(stages - stage - 1, m)
    order = ExchangeOrder(stage, stages, 1)
    passes = iter(order_of_passes)
    for i in range(warmup):
        order.issue(receive_activation=not first)
        order.run(*next(passes))
        order.issue(None if last else (0, i))
    if m > warmup:
        order.issue(receive_activation=not first)
    for i in range(m - warmup):
        order.run(*next(passes))
        order.issue(None if last else (0, warmup + i), receive_gradient=not last)
        order.run(*next(passes))
        order.issue(receive_activation=not first and i != m - warmup - 1, send_gradient=None if first else (0, i))
    for i in range(m - warmup, m):
        order.issue(receive_gradient=not last)
        order.run(*next(passes))
        order.issue(send_gradient=None if first else (0, i))
    return order.actions()


async def train(model: Model, *, microbatch_size: int = 1, pp: int | None = None, partition=None,
                recompute: bool = False, megatron_exchange: str | None = None) -> None:
    """`megatron_exchange`: None (sends go without blocking, a pass receives its input when it starts) or
    "blocking": Megatron-LM's exchanges (`megatron_schedule`; Megatron-LM overlaps pipeline messages only in
    its interleaved schedule)."""
    schedule_fn, run = exchange_choice(megatron_exchange, schedule, {"blocking": megatron_schedule},
                                       " (Megatron-LM overlaps pipeline messages only in its interleaved schedule)")
    plan = build_plan(model, schedule_fn, microbatch_size=microbatch_size, pp=model.world_size if pp is None else pp,
                      partition=partition, recompute=recompute)
    await run(model, plan)


def replica_grid(world_size: int, global_batch_size: int, **options):
    """Its replicas run one program, each over its share of the batch: they fold (`_layout.declared_grid`)."""
    return declared_grid(train, world_size, options)
