"""A cross-check for `fidelity.py`: Megatron-LM's pipeline schedules as each rank runs them, with its blocking
point-to-point exchanges, composed with `dist_lib.costs.compute` outside the simulator (`compose`).

`fidelity.py` predicts every published run through `simulate()` and the built-in strategies; this bespoke
composition of the same cost formulas is printed beside it, so that a gap between the two points at the
strategy or the engine rather than at the formulas. Each rank runs a program of compute steps ("F"/"B" of one microbatch on one model
chunk) and exchanges: one `_communicate` call of Megatron-LM's p2p_communication.py, a batch of sends
and receives with the previous and next pipeline rank that returns only when all of them are done
(torch.distributed.batch_isend_irecv, then waits and a torch.cuda.synchronize). A send completes when
its receiver has posted the matching receive, so an exchange ends when every peer it talks to has reached
its own matching exchange, plus the transfer. Programs follow Megatron-LM's schedules.py of 2022:
`forward_backward_pipelining_without_interleaving` (1F1B) and `..._with_interleaving` (Narayanan et al.
2021, sec. 2.2). Activations go to the next rank, gradients to the previous; with interleaving the pipeline
is a ring (the last rank sends chunk c's output to the first rank's chunk c + 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dist_lib import Cluster, Workload

from dist_lib.costs import compute as costs

from dist_lib.costs import network
from dist_lib.hardware.topology import Topology
from dist_lib.hardware.devices import Device

ACT, GRAD = "act", "grad"  # what a message carries: forward activations (to next) or gradients (to previous)


@dataclass(frozen=True)
class Compute:
    kind: str  # "F" or "B"
    chunk: int


@dataclass(frozen=True)
class Exchange:
    sends: tuple[str, ...]  # ACT goes to the next rank, GRAD to the previous one
    recvs: tuple[str, ...]  # ACT comes from the previous rank, GRAD from the next one


Step = Compute | Exchange


def chunk_of(k: int, p: int, v: int, forward: bool) -> int:
    """Megatron's get_model_chunk_id: the model chunk of the k-th forward (or backward) on a rank."""
    chunk = (k % (p * v)) // p
    return chunk if forward else v - 1 - chunk


def one_f_one_b(p: int, m: int, rank: int) -> list[Step]:
    """forward_backward_pipelining_without_interleaving: warm-up forwards, 1F1B, cool-down backwards."""
    first, last = rank == 0, rank == p - 1
    recv_fwd = () if first else (ACT,)
    send_fwd = () if last else (ACT,)
    recv_bwd = () if last else (GRAD,)
    send_bwd = () if first else (GRAD,)
    warmup = min(p - rank - 1, m)
    steps: list[Step] = []
    for _ in range(warmup):
        steps += [Exchange((), recv_fwd), Compute("F", 0), Exchange(send_fwd, ())]
    if m > warmup:
        steps.append(Exchange((), recv_fwd))
    for i in range(m - warmup):
        steps += [Compute("F", 0), Exchange(send_fwd, recv_bwd), Compute("B", 0)]
        steps.append(Exchange(send_bwd, () if i == m - warmup - 1 else recv_fwd))
    for _ in range(warmup):
        steps += [Exchange((), recv_bwd), Compute("B", 0), Exchange(send_bwd, ())]
    return steps


def interleaved(p: int, m: int, v: int, rank: int) -> list[Step]:
    """forward_backward_pipelining_with_interleaving (Megatron-LM 2022), one exchange per step."""
    total = m * v
    first, last = rank == 0, rank == p - 1
    all_warmup = m == p
    warmup = total if all_warmup else min((p - rank - 1) * 2 + (v - 1) * p, total)
    remaining = total - warmup

    def exchange(send_act: bool, send_grad: bool, recv_act: bool, recv_grad: bool) -> Exchange:
        return Exchange(tuple(x for x, on in ((ACT, send_act), (GRAD, send_grad)) if on),
                        tuple(x for x, on in ((ACT, recv_act), (GRAD, recv_grad)) if on))

    steps: list[Step] = [exchange(False, False, not first, False)]
    for k in range(warmup):
        chunk = chunk_of(k, p, v, True)
        steps.append(Compute("F", chunk))
        recv_prev = not (first and chunk_of(k + 1, p, v, True) == 0) and k != total - 1
        send = not (last and chunk == v - 1)  # the virtual last stage's output is the loss
        if k == warmup - 1 and not all_warmup:
            steps.append(exchange(send, False, recv_prev, not last))
        else:
            steps.append(exchange(send, False, recv_prev, False))
    for k in range(remaining):
        forward_k, backward_k = k + warmup, k
        f_chunk, b_chunk = chunk_of(forward_k, p, v, True), chunk_of(backward_k, p, v, False)
        steps += [Compute("F", f_chunk), Compute("B", b_chunk)]
        send_act = not (last and f_chunk == v - 1)
        send_grad = not (first and b_chunk == 0)
        recv_prev = not (first and chunk_of(forward_k - (p - 1), p, v, True) == v - 1)
        recv_next = not (last and chunk_of(backward_k - (p - 1), p, v, False) == 0)
        if k == remaining - 1:
            recv_prev = False
        steps.append(exchange(send_act, send_grad, recv_prev, recv_next))
    if all_warmup:
        steps.append(exchange(False, False, False, not last))
    for k in range(remaining, total):
        chunk = chunk_of(k, p, v, False)
        steps.append(Compute("B", chunk))
        recv_next = not (last and chunk_of(k + 1, p, v, False) == v - 1) and k != total - 1
        steps.append(exchange(False, not (first and chunk == 0), False, recv_next))
    return steps


def megatron_programs(p: int, m: int, v: int) -> list[list[Step]]:
    return [one_f_one_b(p, m, r) if v == 1 else interleaved(p, m, v, r) for r in range(p)]


def run(programs: list[list[Step]], compute_time: Callable[[int, Compute], float],
        exchange_time: Callable[[int, int], float]) -> list[float]:
    """Each rank's finishing time. `compute_time(rank, step)`; `exchange_time(sends, receives)`: how long
    an exchange of that many messages takes once all its peers are there."""
    p = len(programs)
    clock = [0.0] * p
    pc = [0] * p
    posted: dict[tuple, float] = {}  # (src, dst, what, index, "send"|"recv") -> time posted
    counts: dict[tuple, int] = {}
    mine: list[list[tuple] | None] = [None] * p  # keys of the exchange a rank is blocked in

    def post(rank: int, step: Exchange) -> list[tuple]:
        keys = []
        for what, role in [(w, "send") for w in step.sends] + [(w, "recv") for w in step.recvs]:
            toward_next = (what == ACT) == (role == "send")
            peer = (rank + 1) % p if toward_next else (rank - 1) % p
            src, dst = (rank, peer) if role == "send" else (peer, rank)
            n = counts.get((src, dst, what, role), 0)
            counts[(src, dst, what, role)] = n + 1
            posted[(src, dst, what, n, role)] = clock[rank]
            keys.append((src, dst, what, n, "recv" if role == "send" else "send"))
        return keys

    remaining = sum(map(len, programs))
    while remaining:
        progressed = False
        for r in range(p):
            while pc[r] < len(programs[r]):
                step = programs[r][pc[r]]
                if isinstance(step, Compute):
                    clock[r] += compute_time(r, step)
                else:
                    if mine[r] is None:
                        mine[r] = post(r, step)
                    peers = [posted.get(key) for key in mine[r]]
                    if any(t is None for t in peers):
                        break
                    if step.sends or step.recvs:
                        clock[r] = max([clock[r], *peers]) + exchange_time(len(step.sends), len(step.recvs))
                    mine[r] = None
                pc[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked")
    return clock


# ---- the composition -----------------------------------------------------------------------------

def layer_times(device: Device, workload: Workload, samples: int, tp_topo: Topology, sequence_parallel: bool,
                recompute: str) -> tuple[float, float]:
    """(forward, backward) seconds of one layer on one TP rank, communication included."""
    t, sp = tp_topo.size, sequence_parallel
    comm = network.tp_layer_comm_time(workload, samples, tp_topo, sequence_parallel=sp)
    forward = costs.forward_time(device, workload, 1, samples, t, sequence_parallel=sp) + comm
    exposed, overlapped = network.tp_layer_backward_comm_time(workload, samples, tp_topo, sequence_parallel=sp)
    hidden_behind = costs.backward_weight_time(device, workload, 1, samples, t)
    backward = (costs.backward_time(device, workload, 1, samples, t, sequence_parallel=sp, recompute=recompute)
                + exposed + max(0.0, overlapped - hidden_behind))
    if recompute == "full":
        backward += comm  # the re-run forward repeats its communication
    return forward, backward


def compose(workload: Workload, gpus: int, tp: int, pp: int, global_batch: int, microbatch: int, chunks: int,
            selective_sp: bool, device: Device) -> float:
    """Iteration seconds of a DP-1 Megatron-LM run on `gpus // 8` DGX A100 nodes: one TP rank per stage
    running Megatron's own program; layer, head and embedding times and their TP communication from
    `dist_lib.costs.compute`; scatter-gather pipeline messages over InfiniBand; after the flush, the gradient
    averaging, the fp32 tied-embedding all-reduce between first and last stage, and the optimizer."""
    nodes = max(1, gpus // 8)
    cluster = Cluster.parse(f"{nodes}x8x{device.name}")
    tp_topo = cluster.topology(range(tp))
    p2p_link = cluster.p2p_link(0, 8) if nodes > 1 else cluster.p2p_link(0, 1)
    sp = selective_sp
    recompute = "selective" if sp else "full"
    b, t, p, v = microbatch, tp, pp, chunks
    m = global_batch // b
    layers_per_chunk = workload.num_layers / (p * v)

    f_layer, b_layer = layer_times(device, workload, b, tp_topo, sp, recompute)
    embedding_comm, head_comm = network.tp_embedding_comm_time(workload, b, tp_topo, sequence_parallel=sp)
    head = costs.loss_time(device, workload, b, t) + head_comm
    last = p * v - 1

    def compute_time(rank: int, step: Compute) -> float:
        stage = step.chunk * p + rank
        seconds = layers_per_chunk * (f_layer if step.kind == "F" else b_layer)
        if stage == last:  # the head's forward is a third of its FLOPs
            seconds += head / 3 if step.kind == "F" else 2 * head / 3
        if stage == 0 and step.kind == "F":
            seconds += embedding_comm
        return seconds

    def exchange_time(sends: int, receives: int) -> float:
        return network.pipeline_exchange_time(workload, b, p2p_link, tp_topo, sends=sends, receives=receives,
                                            sequence_parallel=sp)

    ends = run(megatron_programs(p, m, v), compute_time, exchange_time)
    word_embedding = workload.vocab * workload.hidden / t
    stage_params = workload.layer_params(1) * workload.num_layers / p / t + word_embedding \
        + workload.seq_len * workload.hidden
    done = [end + costs.grad_average_time(device, stage_params) for end in ends]
    if p > 1:  # the tied word-embedding gradient, fp32 (main_grad), all-reduced by the first and last stage
        tied = network.collective_time("all_reduce", 4 * word_embedding, cluster.topology([0, 8 * (nodes - 1)]))
        done[0] = done[-1] = max(done[0], done[-1]) + tied
    return max(done) + costs.update_time(device, stage_params)
