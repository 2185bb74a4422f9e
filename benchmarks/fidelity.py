"""Predict published iteration times with the built-in cost model and print them beside the measurements.

    python benchmarks/fidelity.py

Target: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
Table 5 (A100 80GB on Selene, sequence 2048, vocabulary 51200, TP 8 inside a node, PP across nodes,
no data parallelism). Each row is run twice: full recompute (TP only), and sequence parallelism with
selective recompute.

How a row is simulated. With DP = 1 every TP rank of a stage does the same work, so one TP rank per
pipeline stage is simulated: a dependency-driven run of Megatron's (interleaved) 1F1B order on p ranks,
with every duration from `dist_lib.costs` on the catalog A100 and the cluster's links:

* forward of a microbatch on a layer: `costs.forward_time` plus the two TP all-reduces
  (`costs.tp_layer_comm_time`, NVLink inside the node), which Megatron does not overlap;
* backward: `costs.backward_time` with the recompute mode (full recompute re-runs the forward and its
  all-reduces); the backward TP all-reduces overlap the weight-gradient GEMMs (Megatron's asynchronous
  TP all-reduce; Korthikanti sec. 4.2.2), so only their excess over `costs.backward_weight_time` shows;
* the LM head and loss on the last stage (`costs.loss_time`, vocabulary-parallel);
* stage-to-stage messages: `costs.p2p_time` of `costs.pipeline_message_bytes` over the InfiniBand NIC;
* after the flush: the embedding-gradient all-reduce between the first and last stage, then the
  optimizer step of the largest stage (`costs.update_time`).

No figure is fitted to these rows: GEMMs are timed by their shape (`costs.gemm_time`: 256 x 128 output
tiles in waves over the A100's 108 SMs), with the per-SM efficiency in `devices.py` calibrated on the
paper's single-layer measurement (Table 4); everything else comes from data sheets and the NCCL tuner.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dist_lib import Cluster, Workload, costs  # noqa: E402
from dist_lib.devices import DEVICES  # noqa: E402

PEAK = 312e12


@dataclass(frozen=True)
class Row:
    name: str
    preset: str
    gpus: int
    tp: int
    pp: int
    global_batch: int
    microbatch: int
    chunks: int  # interleaved model chunks per rank (1: plain 1F1B)
    full_recompute_s: float
    selective_sp_s: float


# Korthikanti et al. 2022, Tables 3 and 5.
TABLE5 = [
    Row("22B", "gpt-22b", 8, 8, 1, 4, 4, 1, 1.42, 1.10),
    Row("175B", "gpt-175b", 64, 8, 8, 64, 1, 3, 18.13, 13.75),
    Row("530B", "gpt-530b", 280, 8, 35, 280, 1, 3, 49.05, 37.83),
    Row("1T", "gpt-1t", 512, 8, 64, 512, 1, 1, 94.42, 71.49),
]


def megatron_order(p: int, m: int, v: int, rank: int) -> list[tuple[str, int, int]]:
    """Megatron-LM's 1F1B order for one rank: ("F"|"B", microbatch, chunk). Interleaved when v > 1
    (Narayanan et al. 2021, sec. 2.2; schedules.py: warm-up (p - rank - 1) * 2 + (v - 1) * p forwards,
    then one forward and one backward alternately, then the remaining backwards)."""
    total = m * v

    def forward(k: int) -> tuple[str, int, int]:
        return ("F", (k // (p * v)) * p + k % p, (k // p) % v)

    def backward(k: int) -> tuple[str, int, int]:
        return ("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

    if v == 1:
        warmup = min(p - rank - 1, m)
        forward = lambda k: ("F", k, 0)  # noqa: E731
        backward = lambda k: ("B", k, 0)  # noqa: E731
    else:
        warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)
    order = [forward(k) for k in range(warmup)]
    for i in range(total - warmup):
        order += [forward(warmup + i), backward(i)]
    order += [backward(k) for k in range(total - warmup, total)]
    return order


def simulate_row(row: Row, selective_sp: bool) -> dict[str, float]:
    workload = Workload.parse(f"{row.preset}:vocab=51200")
    nodes = max(1, row.gpus // 8)
    cluster = Cluster.parse(f"{nodes}x8xA100-80GB")
    device = DEVICES["A100-80GB"]
    tp_topo = cluster.topology(range(row.tp))
    p2p_link = cluster.p2p_link(0, 8) if nodes > 1 else cluster.p2p_link(0, 1)
    sp = selective_sp
    recompute = "selective" if selective_sp else "full"
    b, t, p, v = row.microbatch, row.tp, row.pp, row.chunks
    m = row.global_batch // b
    layers_per_chunk = workload.num_layers / (p * v)

    comm = costs.tp_layer_comm_time(workload, b, tp_topo, sequence_parallel=sp)
    f_layer = costs.forward_time(device, workload, 1, b, t, sequence_parallel=sp) + comm
    wgrad = costs.backward_weight_time(device, workload, 1, b, t)
    b_layer = costs.backward_time(device, workload, 1, b, t, sequence_parallel=sp, recompute=recompute) \
        + max(0.0, comm - wgrad)
    if recompute == "full":
        b_layer += comm  # the re-run forward repeats its all-reduces
    head = costs.loss_time(device, workload, b, t)
    message = costs.p2p_time(costs.pipeline_message_bytes(workload, b, t, sequence_parallel=sp), p2p_link)

    # dependency-driven run of every rank's order; virtual stage of (rank, chunk) = chunk * p + rank
    orders = [megatron_order(p, m, v, r) for r in range(p)]
    done: dict[tuple[str, int, int], float] = {}
    position = [0] * p
    clock = [0.0] * p
    last = p * v - 1
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(p):
            while position[r] < len(orders[r]):
                kind, mb, chunk = orders[r][position[r]]
                stage = chunk * p + r
                if kind == "F":
                    dep = None if stage == 0 else ("F", mb, stage - 1)
                else:
                    dep = ("F", mb, stage) if stage == last else ("B", mb, stage + 1)
                if dep is not None and dep not in done:
                    break
                if dep is None:
                    ready = 0.0
                else:  # a message from another rank arrives a p2p time after it was produced
                    ready = done[dep] + (message if dep[2] % p != r else 0.0)
                duration = layers_per_chunk * (f_layer if kind == "F" else b_layer)
                if stage == last:
                    duration += head / 3 if kind == "F" else 2 * head / 3
                clock[r] = max(clock[r], ready) + duration
                done[(kind, mb, stage)] = clock[r]
                position[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"{row.name}: schedule deadlocked")
    pipeline = max(clock)
    tied = 0.0
    if p > 1:  # word-embedding gradients shared by the first and last stage (Megatron)
        embedding_grad = 2 * workload.vocab * workload.hidden / t
        tied = costs.collective_time("all_reduce", embedding_grad, cluster.topology([0, 8 * (nodes - 1)]))
    stage_params = workload.layer_params(1) * workload.num_layers / p / t + workload.vocab * workload.hidden / t
    update = costs.update_time(device, stage_params)
    total = pipeline + tied + update
    model_flops = workload.model_flops_per_sample() * row.global_batch
    return {"time": total, "mfu": model_flops / (total * row.gpus * PEAK),
            "bubble": pipeline - m * v * layers_per_chunk * (f_layer + b_layer) - m * head}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    errors: list[float] = []
    print("Korthikanti et al. 2022, Table 5: iteration time (s), A100 80GB, seq 2048; predicted by dist_lib.costs")
    print(f"{'model':>5} {'GPUs':>5} {'TP':>3} {'PP':>3} {'mode':<22} {'measured':>9} {'predicted':>9} "
          f"{'error':>7} {'MFU':>6}")
    for row in TABLE5:
        for selective, measured in ((False, row.full_recompute_s), (True, row.selective_sp_s)):
            out = simulate_row(row, selective)
            error = out["time"] / measured - 1
            errors.append(abs(error))
            mode = "SP + selective" if selective else "full recompute"
            print(f"{row.name:>5} {row.gpus:>5} {row.tp:>3} {row.pp:>3} {mode:<22} {measured:>9.2f} "
                  f"{out['time']:>9.2f} {100 * error:>+6.1f}% {100 * out['mfu']:>5.1f}%")
    print(f"mean |error| {100 * sum(errors) / len(errors):.1f} %, max |error| {100 * max(errors):.1f} %")


if __name__ == "__main__":
    main()
