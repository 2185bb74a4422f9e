"""What a context-parallel layer costs: each of `cp` ranks holds s/cp tokens of every sample and the attention
of its queries runs against every rank's keys and values, a block at a time.

Megatron-Core's context parallelism (`--context-parallel-size`, TransformerEngine's
`AttnFuncWithCPAndKVP2P`): the sequence is cut into 2 cp chunks and rank r holds chunks r and 2 cp - 1 - r,
so that under the causal mask every rank has the same work. Counted in (s / 2cp)^2 chunk blocks, a rank's
queries meet its own keys in 2 of them (two causal diagonals and one full block) and every other rank's keys
in 2 (the early rank's first chunk against both query chunks, or the late rank's two chunks against the
second query chunk): cp steps of equal work, each the causal attention of an s/cp-token sequence. That is
what `block_workload` times: the attention core of a sample of s/cp tokens, at the kernel's speed for that
length (FlashAttention runs once per block).

The weight GEMMs, the elementwise kernels, the stash and the hidden states all scale with the tokens: 1/cp
of the layer's (the attention's s^2 terms too, as cp blocks of (s/cp)^2). The FLOPs are the layer's over cp.

Ring attention passes the key/value blocks around the CP group: cp - 1 exchanges per forward, each overlapped
with the attention of the block at hand; the backward passes the key/value blocks again and, beside them, the
gradients dK, dV accumulated for each block, which end with one more hop at the block's owner (the ring's
`send_recv_kv` and `send_recv_dkv` steps). Llama 3 instead all-gathers the keys and values before the
attention (Dubey et al. 2024, sec. 3.3.2: all-gather K/V, then compute the local queries' attention; in
backward, reduce-scatter their gradients); with grouped-query attention K/V are small. PyTorch's own
context-parallel SDPA, which torchtitan runs, all-gathers the keys and values too but keeps the ring's loop of
cp kernel calls, merging each step's output in fp32 and passing the fp32 gradients dK, dV around the ring in
backward (`kv_exchange="torch_all_gather"`, `costs.torch_context`).

Every compute mode of a plain layer (`costs.ops.COMPUTE_MODES`) runs here too, at s/cp tokens: FP8 linear
layers (TransformerEngine's CP attention is the 16-bit `DotProductAttention`, the linear layers around it
are FP8 as without CP), and selective recompute, whose backward re-runs each block's attention core before
its gradient (Megatron-Core's `--recompute-granularity selective` checkpoints `core_attention`, which is
where TE's CP ring runs: the recompute of block k happens in step k of the backward ring).
"""

from __future__ import annotations

from dataclasses import replace

from dist_lib.costs import compute as costs
from dist_lib.costs.ops import parse_mode
from dist_lib.errors import SpecError
from dist_lib.hardware.devices import Device
from dist_lib.workload import architecture as arch
from dist_lib.workload.transformer import Workload

# "torch_all_gather": PyTorch's context-parallel SDPA with its all-gather rotater, as torchtitan runs it (the
# ring's merges, fp32 accumulations and fp32 dk, dv ring beside the all-gather: `costs.torch_context`)
KV_EXCHANGES = ("ring", "all_gather", "torch_all_gather")


def block_workload(workload: Workload, cp: int) -> Workload:
    """The workload as one CP rank sees it: s/cp tokens a sample. A measured profile times whole sequences
    only, and the sequence must split into 2 cp chunks (Megatron-Core asserts seq_len % (2 cp) == 0)."""
    if workload.profile is not None:
        raise SpecError(f"workload {workload.name}: a measured profile times whole sequences; context "
                        f"parallelism needs the formula model")
    if workload.moe is not None:
        raise SpecError(f"workload {workload.name}: context parallelism is modelled for dense layers only")
    if workload.seq_len % (2 * cp):
        raise SpecError(f"cp={cp}: the sequence of {workload.seq_len} tokens does not split into 2 x cp = {2 * cp} "
                        f"equal chunks (Megatron-Core's load-balanced causal split); choose a cp with "
                        f"seq_len % (2 cp) == 0")
    return replace(workload, seq_len=workload.seq_len // cp)


def attention_block_time(device: Device, workload: Workload, samples: int, tp: int, cp: int,
                         backward: bool = False) -> float:
    """Seconds of one ring step's attention on a CP rank: the attention core (and, unfused, its softmax and
    dropout traffic) of `samples` samples of s/cp tokens, forward or backward."""
    block = block_workload(workload, cp)
    kernels = costs.attention_core_time(device, block, samples, tp, backward) \
        + samples * block.elementwise_bytes(tp, attention_only=True, backward=backward) / device.hbm_bandwidth
    return workload.kernel_time_scale * kernels


def layer_times(device: Device, workload: Workload, layer: int, samples: int, tp: int, cp: int,
                backward: bool = False, mode: str = "none") -> tuple[float, float]:
    """(seconds of everything but the attention blocks, seconds of one attention block) of a CP rank's
    forward (or backward) of a layer in compute mode `mode`: the layer pass at s/cp tokens less its one
    block, then cp blocks; with selective recompute a backward block re-runs its forward first."""
    selective, sequence_parallel, fp8 = parse_mode(mode)
    block = block_workload(workload, cp)
    one = attention_block_time(device, workload, samples, tp, cp, backward)
    if backward and selective:
        one += attention_block_time(device, workload, samples, tp, cp)
    whole = costs.backward_time(device, block, layer, samples, tp, sequence_parallel=sequence_parallel,
                                recompute="selective" if selective else "none", fp8=fp8) if backward \
        else costs.forward_time(device, block, layer, samples, tp, sequence_parallel=sequence_parallel, fp8=fp8)
    return max(0.0, whole - one), one


def layer_flops(workload: Workload, op: str, layer: int, samples: int, tp: int, cp: int,
                mode: str = "none") -> float:
    """FLOPs of a CP rank's `op` ("forward", "backward", "loss"): the whole sequence's over cp (a backward
    after a selective-recompute forward re-runs the attention core, as without CP)."""
    selective = parse_mode(mode)[0] and op == "backward"
    return costs.compute_flops(workload, op, layer, samples, tp, recompute="selective" if selective else "none") / cp


def stash_bytes(workload: Workload, layer: int, samples: int, tp: int, cp: int, mode: str = "none") -> int:
    """What a CP rank's forward keeps for backward: the layer's stash over cp (Korthikanti et al. 2022,
    Table 2, at s/cp tokens; the s^2 attention terms as cp blocks of (s/cp)^2), without the attention core's
    with selective recompute."""
    selective, sequence_parallel, _ = parse_mode(mode)
    return samples * workload.stash_bytes(layer, tp, recompute="selective" if selective else "none",
                                          sequence_parallel=sequence_parallel) // cp


def activation_bytes(workload: Workload, samples: int, cp: int) -> int:
    """Bytes of a CP rank's hidden states of `samples` samples: s/cp tokens each."""
    return samples * workload.activation_bytes() // cp


def kv_block_bytes(workload: Workload, samples: int, tp: int, cp: int) -> int:
    """Bytes of the keys and values of one CP rank's s/cp tokens of `samples` samples, on one TP rank: its
    kv_heads / t heads (a TP rank with fewer key/value heads than TP ranks keeps one, as Megatron replicates
    them), 2 x s/cp x heads x head_dim elements a sample."""
    heads = max(1, arch.kv_heads(workload) // tp)
    return 2 * samples * (workload.seq_len // cp) * heads * arch.head_dim(workload) * workload.bytes_per_element


def loss_time(device: Device, workload: Workload, samples: int, tp: int, cp: int) -> float:
    """The LM head and loss over a CP rank's s/cp tokens."""
    return costs.loss_time(device, block_workload(workload, cp), samples, tp)
