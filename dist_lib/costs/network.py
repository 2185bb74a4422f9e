"""Durations of communication on links (seconds, bytes): alpha-beta ring models of collectives, flat or
hierarchical as NCCL's tuner picks; point-to-point messages; the flow-level share of a link concurrent
transfers get; and what Megatron-LM's tensor and pipeline parallelism send."""

from __future__ import annotations

from collections.abc import Iterable

from dist_lib.hardware.devices import Link
from dist_lib.hardware.topology import Topology, ring_bandwidth
from dist_lib.workload.transformer import Workload


# ---- communication: alpha-beta ring models (Thakur et al. 2005; NCCL's nccl-tests PERFORMANCE.md
# gives the same bus-bandwidth factors: all-reduce 2(p-1)/p, all-gather and reduce-scatter (p-1)/p).
# B is the bandwidth NCCL achieves on the link (`Link.achieved_bandwidth`: line rate x protocol efficiency).

def all_reduce_time(nbytes: float, p: int, link: Link) -> float:
    """Ring all-reduce of an n-byte buffer over p ranks: 2(p-1)/p * n/B + 2(p-1) * alpha."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) / p * nbytes / link.achieved_bandwidth + 2 * (p - 1) * link.latency


def all_gather_time(nbytes: float, p: int, link: Link) -> float:
    """Ring all-gather producing an n-byte buffer: (p-1)/p * n/B + (p-1) * alpha."""
    if p <= 1:
        return 0.0
    return (p - 1) / p * nbytes / link.achieved_bandwidth + (p - 1) * link.latency


def reduce_scatter_time(nbytes: float, p: int, link: Link) -> float:
    """Ring reduce-scatter of an n-byte input buffer: (p-1)/p * n/B + (p-1) * alpha."""
    return all_gather_time(nbytes, p, link)


def p2p_time(nbytes: float, link: Link) -> float:
    """One point-to-point message: alpha + n/B."""
    return link.latency + nbytes / link.achieved_bandwidth


def shared_speed(usage: tuple[tuple[int, int], ...], capacity: list[int], load: list[int]) -> float:
    """Share of its own full speed a transfer gets from the links it shares. `usage` lists its (link,
    bytes/s it wants there); a link carries `capacity` bytes/s and the transfers on it want `load` in
    all. Concurrent transfers split a link in proportion to what they want, so on a link asked for L
    more than its capacity c each gets c / L of its own rate; a transfer moves at its share of its most
    loaded link (a flow-level model: Velho et al. 2013)."""
    speed = 1.0
    for link, _ in usage:
        wanted, carried = load[link], capacity[link]
        if wanted > carried and carried / wanted < speed:
            speed = carried / wanted
    return speed


# ---- collectives over groups that span nodes: flat ring or hierarchical, whichever is faster -------

def _ring_latency(op: str, topo: Topology) -> float:
    """Latency of a flat ring, composed as NCCL's tuner does (src/graph/tuning.cc, ring algorithm):
    all-reduce takes 2(p-1) steps of which 2(N-1) cross nodes, all-gather and reduce-scatter p-1 of
    which N-1 cross nodes; each step costs its link's latency."""
    p, n = topo.size, topo.nodes
    steps, inter_steps = (2 * (p - 1), 2 * (n - 1)) if op == "all_reduce" else (p - 1, n - 1)
    intra = topo.intra.latency if topo.intra is not None else topo.ring.latency
    inter = topo.inter.latency if topo.inter is not None else topo.ring.latency
    return (steps - inter_steps) * intra + inter_steps * inter


def flat_ring_time(op: str, nbytes: float, topo: Topology) -> float:
    """One ring over every member: bus-bandwidth factor 2(p-1)/p (all-reduce) or (p-1)/p, per-link latencies."""
    p = topo.size
    if p <= 1:
        return 0.0
    factor = 2 * (p - 1) / p if op == "all_reduce" else (p - 1) / p
    return factor * nbytes / ring_bandwidth(topo) + _ring_latency(op, topo)


def hierarchical_time(op: str, nbytes: float, topo: Topology) -> float | None:
    """Two-level collective for N nodes of g members each (None when the group is not N x g, g > 1,
    N > 1). All-reduce: reduce-scatter inside each node, g parallel all-reduces of n/g across nodes
    (one per local rank, each on its own NIC), all-gather inside each node. All-gather: the
    inter-node all-gather of each local rank's n/g slice, then the intra-node all-gather of n;
    reduce-scatter is the mirror image. (Thakur et al. 2005; NCCL's tree/CollNet split the same way.)"""
    g, n = topo.per_node, topo.nodes
    if g <= 1 or n <= 1 or topo.intra is None or topo.inter is None:
        return None
    intra = reduce_scatter_time(nbytes, g, topo.intra)
    # the g inter-node collectives share the node's NICs when it has fewer than g (node NICs)
    shared = g / topo.nics if topo.nics < g else 1.0
    if op == "all_reduce":
        return 2 * intra + shared * all_reduce_time(nbytes / g, n, topo.inter)
    return intra + shared * all_gather_time(nbytes / g, n, topo.inter)


def collective_algorithm(op: str, nbytes: float, topo: Topology) -> tuple[str, float]:
    """The algorithm NCCL's tuner would pick (the lowest predicted time) and its time."""
    if op not in ("all_reduce", "all_gather", "reduce_scatter"):
        raise ValueError(f"unknown collective {op!r}")
    best = ("ring", flat_ring_time(op, nbytes, topo))
    hier = hierarchical_time(op, nbytes, topo)
    if hier is not None and hier < best[1]:
        best = ("hierarchical", hier)
    return best


def collective_time(op: str, nbytes: float, topo: Topology) -> float:
    return collective_algorithm(op, nbytes, topo)[1]


# ---- Megatron tensor and pipeline parallelism ----------------------------------------------------

def tp_layer_comm_time(workload: Workload, samples: int, topo: Topology, *,
                       sequence_parallel: bool = False) -> float:
    """TP communication of one layer's forward (the backward moves the same): two all-reduces of the
    b*s*h activation (after attention and after the MLP; Shoeybi et al. 2019, sec. 3). With
    sequence parallelism each becomes a reduce-scatter plus an all-gather of the same buffer, the
    same volume as a ring all-reduce (Korthikanti et al. 2022, sec. 4.2.2)."""
    if topo.size <= 1:
        return 0.0
    nbytes = samples * workload.activation_bytes()
    if sequence_parallel:
        return 2 * (collective_time("reduce_scatter", nbytes, topo) + collective_time("all_gather", nbytes, topo))
    return 2 * collective_time("all_reduce", nbytes, topo)


def tp_layer_backward_comm_time(workload: Workload, samples: int, topo: Topology, *,
                                sequence_parallel: bool = False) -> tuple[float, float]:
    """(exposed, overlappable) seconds of one layer's backward TP communication in Megatron-LM
    (LinearWithGradAccumulationAndAsyncCommunication; Korthikanti et al. 2022, sec. 4.2.2).
    Without SP: the input gradients of QKV and MLP-up are all-reduced asynchronously while the
    weight-gradient GEMMs run. With SP: the gradients entering the two row-parallel layers are
    all-gathered before their GEMMs (exposed); the re-gather of each column-parallel layer's input
    for its weight gradient runs beside the input-gradient GEMM, and the reduce-scatter of that input
    gradient beside the weight-gradient GEMM."""
    if topo.size <= 1:
        return 0.0, 0.0
    nbytes = samples * workload.activation_bytes()
    gather = collective_time("all_gather", nbytes, topo)
    if sequence_parallel:
        return 2 * gather, 2 * (gather + collective_time("reduce_scatter", nbytes, topo))
    return 0.0, 2 * collective_time("all_reduce", nbytes, topo)


def tp_embedding_comm_time(workload: Workload, samples: int, topo: Topology, *,
                           sequence_parallel: bool = False) -> tuple[float, float]:
    """(first stage, last stage) TP communication per microbatch, forward plus backward, of Megatron-LM's
    vocabulary-parallel embedding and LM head. Embedding: its partial lookups are all-reduced in
    forward, or reduce-scattered with SP (their gradient all-gathered in backward). Head: every rank
    needs the full hidden states, so with SP they are all-gathered in forward and their gradient
    reduce-scattered in backward; without SP the gradient is all-reduced in backward. The
    cross-entropy adds three all-reduces of b*s fp32 values (max logit, target logit, sum of exps)."""
    if topo.size <= 1:
        return 0.0, 0.0
    nbytes = samples * workload.activation_bytes()
    if sequence_parallel:
        pair = collective_time("reduce_scatter", nbytes, topo) + collective_time("all_gather", nbytes, topo)
        embedding = head = pair
    else:
        embedding = head = collective_time("all_reduce", nbytes, topo)
    return embedding, head + 3 * collective_time("all_reduce", 4 * samples * workload.seq_len, topo)


def pipeline_message_bytes(workload: Workload, samples: int, tp: int = 1) -> float:
    """Bytes one TP rank of a pipeline stage sends its neighbour per microbatch. With sequence
    parallelism each rank holds and sends its 1/t slice of the b*s*h 16-bit values; without it
    Megatron-LM still sends 1/t from each rank and all-gathers the message on arrival (its
    scatter-gather optimization, on by default; Narayanan et al. 2021, sec. 4.1)."""
    return samples * workload.activation_bytes() / max(tp, 1)


def pipeline_crossing_time(workload: Workload, messages: Iterable[tuple[float, int, Link]]) -> float:
    """Seconds a pipeline schedule's timing model counts for one microbatch crossing a stage boundary
    (Zero Bubble's `cost_comm`, Qi et al. 2023, sec. 3.1): the longest of the boundary's messages, each
    alone on its link. A message is (samples, TP pieces it is cut into, link): `p2p_time` of
    `pipeline_message_bytes`. The pass that takes the input waits for its last message; the messages of
    one crossing are sent at once, so the slowest alone is when the input can be there at the earliest.
    0 for no messages (a stage handing the tensor to itself)."""
    return max((p2p_time(pipeline_message_bytes(workload, samples, pieces), link)
                for samples, pieces, link in messages), default=0.0)


# What else DeepSpeed's pipeline engine (0.3.x, the engine AMP ran: DachengLi1/AMP DeepSpeed/version.txt 0.3.13)
# sends between stages, beside the hidden states (deepspeed/runtime/pipe/engine.py, `_exec_send_activations`,
# and runtime/utils.py, `PartitionedTensor`):
# * Megatron-LM v1.1.5's GPT2ModelPipe passes the causal attention mask from stage to stage with the hidden
#   states: one 1 x 1 x s x s mask per microbatch whatever its size (`get_ltor_masks_and_position_ids`
#   without `reset_attention_mask`), which the engine casts to 16 bits (`.half()`) because NCCL sends no bools;
# * with model parallelism the engine sends each TP rank's 1/t piece of the hidden states
#   (`is_pipe_partitioned`) preceded by the piece's metadata, an int64 tensor of the number of dimensions,
#   the shape, the number of parts, the rank and the t + 1 partition offsets (`PartitionedTensor.to_meta`).
MASK_BYTES_PER_ELEMENT = 2  # the engine's .half() copy of the boolean mask
META_BYTES_PER_ENTRY = 8  # torch.LongTensor
HIDDEN_DIMS = 3  # b x s x h


def attention_mask_bytes(workload: Workload) -> int:
    """Bytes of the 16-bit 1 x 1 x s x s attention mask a GPT stage sends with each activation under
    DeepSpeed's pipeline engine (see above): s^2 x 2, independent of the microbatch."""
    return workload.seq_len * workload.seq_len * MASK_BYTES_PER_ELEMENT


def partition_meta_bytes(tp: int) -> int:
    """Bytes of the metadata DeepSpeed sends before a message partitioned over `tp` ranks (see above):
    1 + 3 (dims, shape) + 2 (parts, rank) + tp + 1 (offsets) int64 entries."""
    return META_BYTES_PER_ENTRY * (1 + HIDDEN_DIMS + 2 + tp + 1)


def pipeline_exchange_time(workload: Workload, samples: int, link: Link, tp_topo: Topology, *, sends: int,
                           receives: int, sequence_parallel: bool = False) -> float:
    """One Megatron-LM pipeline exchange (a batch of sends and receives with the neighbour stages) once
    every peer has posted its side: the messages sent share the rank's link one way and those received
    the other way (full duplex), so alpha + max(sends, receives) x message / B; without SP each received
    message is then all-gathered in the TP group (scatter-gather; Narayanan et al. 2021, sec. 4.1)."""
    if sends == 0 and receives == 0:
        return 0.0
    seconds = p2p_time(max(sends, receives) * pipeline_message_bytes(workload, samples, tp_topo.size), link)
    if receives and not sequence_parallel and tp_topo.size > 1:
        seconds += receives * collective_time("all_gather", samples * workload.activation_bytes(), tp_topo)
    return seconds
