"""Oracle: the course lab's `utils.py` figures (microbatches, check, statistics, best time)."""

from __future__ import annotations

from ._common import check_final_weights
from .lab_lib import BLOCK_SIZE, HIDDEN_SIZE


def get_next_microbatch(global_batch_size, world_size, batch_size, rank):
    per = global_batch_size // world_size
    mine = list(range(per * rank, per * (rank + 1)))
    for i in range(0, len(mine), batch_size):
        yield mine[i:i + batch_size]


def get_global_batch_list(global_batch_size, batch_size):
    return [list(range(i * batch_size, (i + 1) * batch_size)) for i in range(global_batch_size // batch_size)]


def check(models):
    check_final_weights(models, models[0].num_layers)


def get_training_stats(models):
    check(models)
    time = max(m.log[-1].time for m in models)
    best, rank = 0, None
    for i, m in enumerate(models):
        for e in m.log:
            if e.memory > best:
                best, rank = e.memory, i
    return time, best, rank


def get_model_theoretical_best_time(model):
    flops = 4 * HIDDEN_SIZE * HIDDEN_SIZE * model.global_batch_size * BLOCK_SIZE * model.num_layers
    return flops / (1e15 * model.world_size)


def write_chrome_trace(models, path, global_batch_list=None):
    pass
