"""Plans for heterogeneous clusters: layer partitions sized to stage speed, batch shares sized to replica
speed, both from the cost model (costs.py) and within each device's memory.

* Partition (AMP, Li et al. 2022, sec. 4): dynamic programming over contiguous layer blocks that
  minimises the slowest stage's time per microbatch, skipping blocks that would not fit in memory.
* Shares (Metis, Um et al. ATC'24, sec. 5): microbatches go one at a time to the replica whose
  estimated 1F1B time, sum of stage times + (m - 1) x slowest stage, grows least.
"""

from __future__ import annotations

from collections.abc import Sequence

from dist_lib import costs
from dist_lib.model import OPTIMIZER_BYTES, WEIGHT_BYTES

MEMORY_HEADROOM = 0.9  # leave 10 % of each device for buffers the estimate does not count


def layer_seconds(device, workload, layer: int, microbatch_size: int) -> float:
    return costs.forward_time(device, workload, layer, microbatch_size) + \
        costs.backward_time(device, workload, layer, microbatch_size)


def stage_bytes(workload, layers: range, microbatch_size: int, in_flight: int) -> float:
    """Model state (16 bytes per parameter) plus `in_flight` microbatches of stashes and layer inputs."""
    state = sum(workload.layer_params(l) for l in layers) * (2 * WEIGHT_BYTES + OPTIMIZER_BYTES)
    per_sample = sum(workload.stash_bytes(l) + workload.activation_bytes() for l in layers)
    return state + in_flight * microbatch_size * per_sample


def partition(devices: Sequence, workload, microbatch_size: int) -> list[range]:
    """Contiguous blocks, one per stage device, minimising the slowest stage (1F1B in-flight memory)."""
    p, n = len(devices), workload.num_layers
    if n < p:
        raise ValueError(f"{n} layers cannot fill pp={p} stages; lower pp")
    inf = float("inf")

    def cost(s: int, i: int, j: int) -> float:
        device = devices[s]
        if stage_bytes(workload, range(i, j), microbatch_size, p - s) > MEMORY_HEADROOM * device.memory_bytes:
            return inf
        seconds = sum(layer_seconds(device, workload, l, microbatch_size) for l in range(i, j))
        if s == p - 1:
            seconds += costs.loss_time(device, workload, microbatch_size)
        return seconds

    # best[s][j]: slowest-stage time of putting layers 0..j-1 on stages 0..s; cut[s][j] the block start
    best = [[inf] * (n + 1) for _ in range(p)]
    cut = [[0] * (n + 1) for _ in range(p)]
    for j in range(1, n + 1):
        best[0][j] = cost(0, 0, j)
    for s in range(1, p):
        for j in range(s + 1, n + 1):
            for i in range(s, j):
                value = max(best[s - 1][i], cost(s, i, j))
                if value < best[s][j]:
                    best[s][j], cut[s][j] = value, i
    if best[p - 1][n] == inf:
        raise ValueError(f"no partition of {n} layers over {p} stages fits in device memory; raise pp or "
                         f"lower microbatch_size")
    blocks, j = [], n
    for s in reversed(range(p)):
        i = cut[s][j] if s else 0
        blocks.append(range(i, j))
        j = i
    return blocks[::-1]


def stage_seconds(devices: Sequence, workload, blocks: Sequence[range], microbatch_size: int) -> list[float]:
    out = [sum(layer_seconds(d, workload, l, microbatch_size) for l in block) for d, block in zip(devices, blocks)]
    out[-1] += costs.loss_time(devices[-1], workload, microbatch_size)
    return out


def shares(replica_stage_seconds: Sequence[Sequence[float]], microbatches: int) -> list[int]:
    """Microbatches per replica: each goes to the replica whose estimated step grows least."""
    dp = len(replica_stage_seconds)
    if microbatches < dp:
        raise ValueError(f"{microbatches} microbatches cannot give each of dp={dp} replicas one; lower "
                         f"microbatch_size or dp")
    counts = [1] * dp

    def step(d: int, m: int) -> float:
        times = replica_stage_seconds[d]
        return sum(times) + (m - 1) * max(times)

    for _ in range(microbatches - dp):
        d = min(range(dp), key=lambda r: (step(r, counts[r] + 1), r))
        counts[d] += 1
    return counts
