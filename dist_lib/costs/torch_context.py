"""What PyTorch's context-parallel SDPA does around its attention kernels (`kv_exchange="torch_all_gather"`): the
HBM traffic of its per-step merges and gradient accumulations, and the sizes of what it exchanges.

torchtitan (late 2024) runs `torch.distributed.tensor.experimental.context_parallel` (PyTorch 2.6,
torch/distributed/tensor/experimental/_attention.py) with its defaults: the causal round-robin load balancer
(`_RoundRobinLoadBalancer.shard`: rank r keeps chunks r and 2 cp - 1 - r of the sequence, sharded once per step
for the input ids, labels and rotary table, not per layer) and the `allgather` rotater (`_AllGatherRotater`).
Each layer's SDPA becomes `_templated_ring_attention`, a loop of cp steps on a rank r:

* the keys and values are made contiguous (`key.contiguous()`, `value.contiguous()`) and, flattened and
  concatenated (`torch.cat([key.flatten(), value.flatten()])`), all-gathered once (`ft_c.all_gather_tensor`,
  waited for at step 1, so it runs beside step 0's kernel). torchtitan's Llama attention calls SDPA after
  `repeat_kv`, so these are at the query heads, not the key/value heads (torchtitan/models/llama/model.py);
* step 0 is a causal flash call on the local s/cp tokens; step i >= 1 one non-causal call of equal work: all
  queries against the first half of the other rank's keys (i <= r), or the second half of the queries
  against all of them (i > r), `_is_causal_behavior` and the `if/elif/else` of the loop. Each call is timed as
  `costs.context.attention_block_time` (the same FLOPs, one FlashAttention call of s/cp tokens' work);
* `_SDPAMerger.step` upcasts the step's output to fp32 (`convert_to_f32=True`) and merges it into the running
  fp32 output with `out - sigmoid(lse_new - lse) * (out - out_new)`; a half-query step then rebuilds the whole
  fp32 output with `_partial_update` (`torch.cat` of its two halves); `results()` casts back to 16 bits.

The backward (`_templated_ring_attention_backward`) all-gathers the keys and values again and runs one flash
backward call per step, the same shapes; it accumulates dq, dk, dv in fp32 (`torch.zeros_like(...,
dtype=torch.float32)`, `+=` or `_partial_update(add=True)` for the half-size ones), and passes the running dk, dv
around the ring in fp32 whatever the rotater (`dkv_rotater` is `_RotateMethod.ALL_TO_ALL`: `ft_c.permute_tensor`
to the next rank at every step, waited for at the next step, the last one after the loop), concatenated first
(`torch.cat([grad_key.flatten(), grad_value.flatten()])`); at the end dq and the received dk, dv are cast to 16
bits.

Counted in bytes per element of the rank's queries (E = samples x s/cp x heads/t x head_dim; the keys and values
are as large, being repeated), 16-bit tensors 2 bytes and fp32 ones 4. Run eagerly (`kernels="eager"`), every op
is a kernel of its own reading its inputs and writing its output. Compiled, the ring is traced into the graph
(its collectives are traceable functional ones, `_maybe_wait`), and Inductor fuses each step's elementwise ops
into one kernel reading each input and writing each output once, folds the casts into the neighbouring merge,
drops the concatenations of keys and values after the first (the all-gather rotater never sends them) and the
zero-filled accumulators. The log-sum-exp tensors (1/head_dim of the output) and PyTorch's host work are not
counted. With cp = 1 there is no ring (torchtitan applies `context_parallel` only with cp > 1): nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from dist_lib.hardware.devices import Device
from dist_lib.workload import architecture as arch
from dist_lib.workload.transformer import Workload

FP32 = 4
# eager PyTorch, per element of the step's queries: the upcast (read 2, write 4), out - out_new (8 + 4), the product
# with the broadcast sigmoid (4 + 4), out minus it (8 + 4)
EAGER_MERGE = 38
FUSED_MERGE = 10  # one kernel: read the running fp32 output and the step's 16-bit one, write the fp32 output
CAT_FP32 = 8  # `_partial_update`'s torch.cat, per element copied: read and write fp32
KV_COPY = 8  # per element of E: K and V read and written in 16 bits (`contiguous()`, or the flattening `cat`)
ADD_BF16_INTO_FP32 = 10  # `acc += grad` with a 16-bit grad: read 4 + 2, write 4
CAST_DOWN = 6  # fp32 to 16 bits: read 4, write 2


@dataclass(frozen=True)
class RingBytes:
    """HBM bytes a CP rank's PyTorch ring moves outside its SDPA kernels in one layer pass: `prologue` before the
    first kernel (and before the keys and values are sent), `steps[i]` after kernel i, `epilogue` after the
    ring (for a backward: once the last dk, dv have arrived)."""

    prologue: int
    steps: tuple[int, ...]
    epilogue: int

    def total(self) -> int:
        return self.prologue + sum(self.steps) + self.epilogue


def elements(workload: Workload, samples: int, tp: int, cp: int) -> int:
    """E: elements of a CP rank's queries (and attention output) on one TP rank, s/cp tokens x heads/t x head_dim."""
    return samples * (workload.seq_len // cp) * (workload.heads // tp) * arch.head_dim(workload)


def kv_bytes(workload: Workload, samples: int, tp: int, cp: int) -> int:
    """Bytes of the keys and values a rank all-gathers: 2E in 16 bits, at the query heads (after `repeat_kv`)."""
    return 2 * elements(workload, samples, tp, cp) * workload.bytes_per_element


def dkv_bytes(workload: Workload, samples: int, tp: int, cp: int) -> int:
    """Bytes of the running dk, dv passed to the next rank at each backward step: 2E in fp32."""
    return 2 * elements(workload, samples, tp, cp) * FP32


def _half_step(step: int, cp_rank: int) -> bool:
    """True when step `step` runs the second half of the queries against all the keys (step > rank)."""
    return step > cp_rank


def forward_bytes(workload: Workload, samples: int, tp: int, cp: int, cp_rank: int) -> RingBytes:
    """The forward's traffic beside its kernels (module docstring): the keys and values copied and flattened,
    each step's merge (a half-query step merges E/2, then torch.cat rebuilds the whole fp32 output: compiled,
    only the untouched half is copied), the casts."""
    if cp == 1:
        return RingBytes(0, (0,), 0)
    e, eager = elements(workload, samples, tp, cp), workload.kernels == "eager"
    merge = EAGER_MERGE if eager else FUSED_MERGE
    steps = []
    for step in range(cp):
        if step == 0:  # eager: the first output's upcast (fused: part of step 1's merge)
            nbytes = 6 * e if eager else 0
        elif _half_step(step, cp_rank):  # eager, torch.cat copies both halves; fused, the untouched one
            nbytes = merge * e // 2 + (CAT_FP32 * e if eager else CAT_FP32 * e // 2)
        else:
            nbytes = merge * e
        if eager and 0 < step < cp - 1:  # the flattening cat runs every step but the last, used or not
            nbytes += KV_COPY * e
        steps.append(nbytes)
    return RingBytes(2 * KV_COPY * e, tuple(steps), CAST_DOWN * e if eager else 0)


def backward_bytes(workload: Workload, samples: int, tp: int, cp: int, cp_rank: int) -> RingBytes:
    """The backward's traffic beside its kernels: the keys and values copied and flattened again, the fp32
    accumulators (eager: zero-filled), each step's dq and dk, dv accumulation and the dk, dv concatenation for
    the next rank, and the final casts of dq and of the received dk, dv."""
    if cp == 1:
        return RingBytes(0, (0,), 0)
    e, eager = elements(workload, samples, tp, cp), workload.kernels == "eager"
    steps = []
    for step in range(cp):
        half_q = _half_step(step, cp_rank)
        half_kv = 0 < step and not half_q  # all queries against the first half of the keys: dk, dv of half size
        if eager:
            # dk, dv: `+=` over the whole, or the half's add (5E each) and `_partial_update`'s cat (8E each);
            # their cat for the next rank (read and write 2E in fp32); dq likewise
            dkv = 2 * (5 * e + CAT_FP32 * e) if half_kv else 2 * ADD_BF16_INTO_FP32 * e
            dq = 5 * e + CAT_FP32 * e if half_q else ADD_BF16_INTO_FP32 * e
            nbytes = dkv + 2 * CAT_FP32 * e + dq + (KV_COPY * e if 0 < step < cp - 1 else 0)
        else:
            # dk, dv: read what arrived (2E fp32, none at step 0) and the step's 16-bit grads, write 2E fp32;
            # dq: the add over the queries it covers, plus the copy of the other half for a half step
            received = 0 if step == 0 else 2 * e * FP32
            dkv = received + (e if half_kv else 2 * e) * 2 + 2 * e * FP32
            if step == 0:  # the zero-filled accumulator folded in: read 2, write 4
                dq = (2 + FP32) * e
            elif half_q:
                dq = ADD_BF16_INTO_FP32 * e // 2 + CAT_FP32 * e // 2
            else:
                dq = ADD_BF16_INTO_FP32 * e
            nbytes = dkv + dq
        steps.append(nbytes)
    zeros = 3 * FP32 * e if eager else 0
    return RingBytes(2 * KV_COPY * e + zeros, tuple(steps), CAST_DOWN * e + 2 * CAST_DOWN * e)


def seconds(device: Device, workload: Workload, ring: RingBytes) -> tuple[float, tuple[float, ...], float]:
    """(prologue, per step, epilogue) seconds of `ring`'s traffic at HBM bandwidth (memory-bound kernels)."""
    scale = workload.kernel_time_scale / device.hbm_bandwidth
    return ring.prologue * scale, tuple(b * scale for b in ring.steps), ring.epilogue * scale
