"""How many tokens each expert of an MoE layer receives from a microbatch: the workload's `routing`
distribution, deterministic by its seed (and by layer and microbatch, never by rank or run order).

* `uniform`: the k x T routed tokens spread evenly (what Megatron-Core's published MoE benchmarks force:
  "we force-balance the token distribution among experts");
* `zipf:S`: expert shares proportional to 1 / rank^S, the ranking of the experts drawn anew for each layer
  and microbatch from `routing_seed` (a router whose load-balancing loss has not yet balanced it);
* `measured:w1/w2/.../wE`: fixed relative shares per expert, e.g. from a router's logged token counts.

Shares become whole token counts by largest remainder; an expert takes at most every token of the
microbatch once (a token's k experts are distinct), the excess going to the least loaded. With a capacity
factor c > 0 an expert keeps at most c x T x k / E tokens (the rest are dropped: they skip the expert and
only the residual carries them, Fedus et al. 2022 sec. 2.2), and its buffer is padded to that capacity.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dist_lib.errors import SpecError
from dist_lib.specs import shown
from dist_lib.workload.moe import MoE

DISTRIBUTIONS = ("uniform", "zipf", "measured")


def check_routing(moe: MoE, where: str) -> None:
    """Refuse a routing string this module cannot read, naming the field."""
    _shares(moe.routing, moe.experts, where)


def _shares(routing: str, experts: int, where: str = "routing") -> tuple[float, ...] | None:
    """The fixed shares of `measured`, None for `uniform` and `zipf` (whose shares are drawn per microbatch)."""
    kind, _, argument = routing.partition(":")
    if kind == "uniform" and not argument:
        return None
    if kind == "zipf":
        try:
            exponent = float(argument)
        except ValueError:
            exponent = -1.0
        if not 0 < exponent <= 10:
            raise SpecError(f"{where}: routing {shown(routing)}: zipf takes an exponent in (0, 10], as zipf:1.2")
        return None
    if kind == "measured":
        try:
            weights = tuple(float(w) for w in argument.split("/"))
        except ValueError:
            weights = ()
        if len(weights) != experts or min(weights, default=-1) < 0 or not sum(weights) > 0:
            raise SpecError(f"{where}: routing {shown(routing)}: measured takes {experts} non-negative shares "
                            f"separated by '/', one per expert")
        return tuple(w / sum(weights) for w in weights)
    raise SpecError(f"{where}: routing must be uniform, zipf:S or measured:w1/.../wE, got {shown(routing)}")


def alike_in_every_replica(moe: MoE) -> bool:
    """Whether every data-parallel replica's microbatches route alike: uniform and measured shares do not
    depend on the microbatch; zipf draws its ranking per microbatch (from its first sample), so replicas that
    train on different samples load their experts differently and cannot stand for one another
    (`run/folding.py`)."""
    return moe.routing.partition(":")[0] != "zipf"


def shares(moe: MoE, layer: int, first_sample: int) -> np.ndarray:
    """Each expert's share of a microbatch's routed tokens (sums to 1)."""
    fixed = _shares(moe.routing, moe.experts)
    if fixed is not None:
        return np.array(fixed)
    if moe.routing == "uniform":
        return np.full(moe.experts, 1.0 / moe.experts)
    exponent = float(moe.routing.partition(":")[2])
    rng = np.random.default_rng([moe.routing_seed, layer, first_sample])
    weights = 1.0 / np.arange(1, moe.experts + 1) ** exponent
    return rng.permutation(weights) / weights.sum()


def expert_loads(moe: MoE, layer: int, first_sample: int, tokens: int) -> tuple[int, ...]:
    """Tokens each expert receives from a microbatch of `tokens` tokens whose first sample is `first_sample`
    (dropless: they sum to tokens x k; with a capacity factor, capped at the capacity). Only zipf's loads
    depend on the layer and the microbatch: the others are worked out once per microbatch size."""
    if moe.routing.startswith("zipf"):
        return _loads(moe, layer, first_sample, tokens)
    return _loads(moe, 0, 0, tokens)


@functools.lru_cache(maxsize=1 << 14)
def _loads(moe: MoE, layer: int, first_sample: int, tokens: int) -> tuple[int, ...]:
    routed = tokens * moe.top_k
    want = shares(moe, layer, first_sample) * routed
    counts = np.floor(want).astype(np.int64)
    order = np.argsort(-(want - counts), kind="stable")
    counts[order[:routed - int(counts.sum())]] += 1
    excess = int(np.maximum(counts - tokens, 0).sum())  # a token visits an expert at most once
    counts = np.minimum(counts, tokens)
    while excess:
        room = np.flatnonzero(counts < tokens)
        take = room[np.argsort(counts[room], kind="stable")[:excess]]
        counts[take] += 1
        excess -= len(take)
    cap = moe.capacity(tokens)
    if cap:
        counts = np.minimum(counts, cap)
    return tuple(int(c) for c in counts)



def tokens_reaching(moe: MoE, loads: tuple[int, ...], experts: range | list[int], tokens: int) -> int:
    """Tokens of a microbatch of `tokens` tokens that use at least one of `experts` (their expert loads
    `loads`): what a hierarchical dispatcher sends once to the node holding those experts (DeepSeek-AI
    2024, arXiv 2412.19437 sec. 3.2.2). The routing gives each expert's load, not each token's k experts;
    the count is the expectation when every token's k experts are drawn at random consistent with the
    loads, rounded to a whole token. `uniform`: each token's experts a uniform k-subset of the E, so a
    token misses g of them with probability C(E - g, k) / C(E, k) (hypergeometric). Other routings: each
    expert e taken independently with probability loads[e] / tokens, a miss prod(1 - loads[e] / tokens).
    Always between the busiest of `experts` and min(tokens, their total load)."""
    chosen = list(experts)
    total = sum(loads[e] for e in chosen)
    if not chosen or not tokens or not total:
        return 0
    if moe.routing == "uniform":
        miss = math.comb(moe.experts - len(chosen), moe.top_k) / math.comb(moe.experts, moe.top_k)
    else:
        miss = math.prod(1.0 - loads[e] / tokens for e in chosen)
    reached = round(tokens * (1.0 - miss))
    return min(max(reached, max(loads[e] for e in chosen)), tokens, total)
