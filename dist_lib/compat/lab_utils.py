"""The course lab's `utils.py`: microbatches, the correctness check, the training statistics the
course grades with, its chrome trace, and the theoretical best time its MFU divides by.

`get_training_stats` and `get_model_theoretical_best_time` give the course's own figures in the
default (original) timing: MFU = best time / execution time, where execution time is the latest
start of a rank's last event. In 'real' timing the best time is the model FLOPs over the summed
peak FLOP/s of the cluster, so the same quotient is the MFU this simulator reports.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from typing import Any, Dict, Generator, List, Optional, Sequence, Tuple

from dist_lib.compat._runtime import CompatAssertionError
from dist_lib.compat.drawing import peak
from dist_lib.compat.lab import BLOCK_SIZE, HIDDEN_SIZE, Model  # noqa: F401  (the original's imports, kept)
from dist_lib.compat.lab_costs import theoretical_best_time
from dist_lib.compat._base import problems


def get_next_microbatch(global_batch_size: int, world_size: int, batch_size: int,
                        rank: int) -> Generator[List[int], None, None]:
    """Rank `rank`'s contiguous share of the global batch, in chunks of `batch_size` samples."""
    per_rank = global_batch_size // world_size
    mine = list(range(per_rank * rank, per_rank * (rank + 1)))
    for i in range(0, len(mine), batch_size):
        yield mine[i:i + batch_size]


def check(models: Sequence[Model]) -> None:
    """Every layer's final weight, combined over the ranks, is complete and at step 1."""
    for line in problems(models):
        raise CompatAssertionError(line)


def get_training_stats(models: Sequence[Model]) -> Tuple[int, int, int]:
    """(execution time: the latest start of a rank's last event; the largest memory any event
    recorded, in elements; the index of the model that recorded it first). Prints them as the lab."""
    check(models)
    execution_time = max(m.log[-1].time for m in models)
    max_memory, where = peak(models)
    print(f"Execution time: {execution_time} \nMaximum Memory: {max_memory} at GPU: {where[0]} time: {where[1]}")
    return execution_time, max_memory, where[0]


def get_batch_labeled_name(event: str, batch_id: int) -> str:
    """'(forward, S=[0, 1])' becomes 'forward batch: 3' when the samples are microbatch 3."""
    if batch_id == -1:
        return event
    return event.split(",")[0][1:] + f" batch: {batch_id}"


def get_batch_id(global_batch_list: List[List[int]], samples: List[int]) -> int:
    """The index of `samples` in `global_batch_list`, or -1 (no list, or not one microbatch)."""
    if global_batch_list is None:
        return -1
    try:
        return global_batch_list.index(samples)
    except ValueError:
        return -1


def to_chrome_trace(models: Sequence[Model], global_batch_list: Optional[List[List[int]]] = None) -> Dict[str, Any]:
    """The lab's trace: per GPU an 'Execution' thread of ops (named by microbatch when
    `global_batch_list` is given) and a 'Memory' counter, times in microseconds."""
    events: list[dict] = []
    for i, m in enumerate(models):
        for event in m.log:
            batch_id = get_batch_id(global_batch_list, list(event.samples))
            events.append({"name": get_batch_labeled_name(str(event), batch_id), "ph": "X",
                           "ts": event.time * 1_000_000, "dur": event.duration * 1_000_000, "pid": f"GPU {i}",
                           "tid": "Execution",
                           "args": {"memory": event.memory, "samples": list(event.samples), "layer": event.layer,
                                    "batch_id": str(batch_id) if batch_id != -1 else "Across Batch Operation"}})
            events.append({"name": "memory", "ph": "C", "ts": event.time * 1_000_000, "pid": f"GPU {i}",
                           "tid": "Memory", "args": {"memory": event.memory}})
    return {"traceEvents": events}


def write_chrome_trace(models: Sequence[Model], path: str,
                       global_batch_list: Optional[List[List[int]]] = None) -> None:
    """Write the lab's chrome trace to `path`, as the original does. Where the folder is read-only (the
    grader runs a file in a read-only copy of its folder, so a lab `main()` that writes
    `./debug_traces/part1.json` would otherwise fail the step), say so on stderr and go on: the trace is
    not part of the step, and the grader writes its own (`--trace`)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(to_chrome_trace(models, global_batch_list), f)
    except OSError as exc:
        if exc.errno != errno.EROFS:
            raise
        print(f"write_chrome_trace: {path} not written ({exc.strerror}); the run's own trace is the one "
              f"`python -m grader run --trace` writes", file=sys.stderr)


def get_model_theoretical_best_time(model: Model) -> float:
    """The lab's ideal step time (`lab_costs.theoretical_best_time`) in original timing; in real
    timing, model FLOPs over the cluster's summed peak FLOP/s."""
    real = model._real
    if real is None:
        return theoretical_best_time(model.num_layers, model.global_batch_size, model.world_size)
    peak_flops = sum(real.cluster.device_of(r).peak_flops for r in range(real.cluster.world_size))
    return real.workload.model_flops_per_sample() * model.global_batch_size / peak_flops


def get_global_batch_list(global_batch_size: int, batch_size: int) -> List[List[int]]:
    """Every microbatch of the global batch, in order: [[0..b-1], [b..2b-1], ...]."""
    return [list(range(i * batch_size, (i + 1) * batch_size)) for i in range(global_batch_size // batch_size)]
