"""The planner's closed-form estimate beside the simulator, plan by plan, under 1F1B, ZB-H1, full recompute
and interleaving with selective recompute.

    python -m benchmarks.planner_estimate [SET ...]   (equal, widths, commodity by default; per-op, context,
                                                        sharded, moe)

Three sets of pipelines:

* equal widths: two stages of one node each at TP 1, 2 and 4, on per-GPU NICs (A100 nodes) and behind
  one 10 Gb/s NIC a node (V100 nodes);
* different widths, the shape of heterogeneous plans: neighbouring stages that differ in DP degree
  (12 then 4, 8 then 4, 4 then 2 replicas), in TP degree (2 then 1), in device type (A100 beside V100,
  T4 or A10 nodes) and in node layout (per-GPU NICs, one shared NIC a node, two stages on one node,
  a stage over two nodes), with uneven replica shares where a stage mixes device types;
* a commodity cloud of twelve one-NIC nodes (V100 and T4): the plans its search ranks best, each under
  its own schedule, many stages' crossings meeting on the nodes' NICs;
* per-op (only when named): torchtitan plans of Llama blocks, two stages of one node each at TP 1, 2 and 4,
  without recompute, with its per-op selective checkpointing (recompute "op") and with full recompute, each
  simulated as torchtitan runs it (`planner/framework_run.py`: sequence-parallel with TP);
* context (only when named): the plans with context parallelism that a Megatron-LM and a torchtitan search of
  Llama 3 8B's 8 layers at 131,072 tokens on one 8-GPU H100 node keep, one for each (cp, recompute, sharding,
  precision), each simulated as its framework runs it (PyTorch's context-parallel SDPA for torchtitan);
* sharded (only when named): the FSDP plans beside pipeline stages and the HSDP plans a torchtitan search of
  Llama 3 70B's 16 layers on 16 nodes of 8 H100s keeps, one for each (stages, replicate groups, recompute, TP);
* moe (only when named): Mixtral 8x7B's first four layers on one 8-GPU H100 node, one stage of 8 ranks at
  TP 2 and 4 (sequence-parallel) with expert-parallel degree ep and expert TP etp (1, or dividing TP), 16-bit
  without recompute and with selective recompute and the distributed optimizer, each simulated as Megatron-LM
  runs it (hybrid's expert stage: `strategies/_expert_stage.py`, `_expert_sharded.py`).

Prints one row per plan (estimated and simulated step, their ratio, estimated memory share against the
simulated peak share) and, per set and over both, the mean and largest |estimate / simulated - 1|. The
estimate must never count less memory than the simulator holds; its time is what ranks the search's
candidates before the simulator runs the best few (`dist_lib/planner/estimate.py`, `step.py`,
`messages.py`, `playout.py` for interleaved plans, and `contention.py` where two stages' crossings meet
on a node's shared NIC).
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Sequence

from dist_lib import Cluster, Workload
from dist_lib.hardware.reserve import memory_reserve
from dist_lib.planner import plan
from dist_lib.planner.evaluate import simulate_candidate
from dist_lib.planner.step import step_estimate
from dist_lib.planner.expert_modes_cost import with_etp
from dist_lib.planner.search import Candidate, to_plan
from dist_lib.planner.stage_space import StageSpace

SETTINGS = [("toy:layers=4", "2x2xA100-80GB", 8), ("gpt-1.3b:layers=8", "2x2xA100-80GB", 8),
            ("gpt-350m", "2x4xA100-80GB", 16), ("gpt-1.3b:layers=8", "2x4xV100-32GB:nics=1x1.25", 16)]
SETS = ("equal", "widths", "commodity")  # equal widths, different widths, a commodity cloud
VARIANTS = [("1f1b", "none"), ("zero-bubble", "none"), ("1f1b", "full"), ("interleaved", "selective")]
PER_OP = [("llama-3-8b:layers=4,seq=2048,vocab=32000", "2x4xA100-80GB", 16),
          ("llama-3-8b:layers=8,seq=4096,vocab=32000", "2x8xH100-80GB", 32)]
PER_OP_VARIANTS = [("1f1b", "none"), ("1f1b", "op"), ("1f1b", "full")]
MOE = ("mixtral-8x7b:layers=4", "1x8xH100-80GB", 16, 4)  # (workload, cluster, batch, microbatch)
MOE_GRIDS = [(2, 2, 1), (2, 8, 1), (4, 2, 1), (4, 8, 1), (2, 4, 2), (4, 4, 2), (4, 2, 4)]  # (tp, ep, etp)
MOE_VARIANTS = [("none", 0), ("selective", 1)]  # (recompute, ZeRO-1: the distributed optimizer)

FASOP = "1x4xA100-40GB:intra=230:nics=1x5+3x4xA10:intra=16:nics=1x5"  # one 40 Gb/s NIC a node
BERT = "gpt-350m:seq=512,vocab=30522"
SHARED = "1x4xA100-80GB:nics=1x1.25+2x4xV100-32GB:nics=1x1.25"  # one 10 Gb/s NIC a node
A, V, T = range(0, 4), range(4, 8), range(8, 12)

# (workload, cluster, batch, microbatch, [(stage ranks, tp, layers)]) of pipelines whose neighbouring
# stages differ in width
WIDTHS = [
    # FASOP's cloud: twelve A10 replicas over three nodes beside the four A100s of one node, both ways
    (BERT, FASOP, 256, 32, [(tuple(range(4, 16)), 1, 13), (tuple(A), 1, 11)]),
    (BERT, FASOP, 256, 64, [(tuple(A), 1, 14), (tuple(range(4, 16)), 1, 10)]),
    (BERT, FASOP, 256, 32, [(tuple(A), 1, 14), (tuple(range(4, 10)), 1, 6), (tuple(range(10, 16)), 1, 4)]),
    # per-GPU NICs: TP 1 beside TP 2, V100 beside A100
    ("gpt-1.3b", "1x4xA100-80GB+1x4xV100-32GB", 32, 8, [(tuple(V), 1, 10), ((0, 1, 2, 3), 2, 14)]),
    ("gpt-1.3b", "1x4xA100-80GB+1x4xV100-32GB", 32, 8, [(tuple(V), 2, 9), ((0, 1), 1, 15)]),
    # one shared NIC a node: 8 V100 replicas over two nodes, then 4 A100s, and back; 4 then 2
    ("gpt-1.3b:layers=8", SHARED, 32, 8, [(tuple(range(4, 12)), 1, 4), (tuple(A), 1, 4)]),
    ("gpt-1.3b:layers=8", SHARED, 32, 8, [(tuple(A), 2, 4), (tuple(range(4, 12)), 1, 4)]),
    ("gpt-1.3b:layers=8", SHARED, 16, 4, [(tuple(V), 1, 4), ((0, 1), 1, 4)]),
    # T4 nodes of one 50 Gb/s NIC beside an A100 node at TP 2
    ("gpt-350m", "1x4xA100-80GB+2x4xT4:nics=1x6.25", 32, 8, [(tuple(range(4, 12)), 1, 10), (tuple(A), 2, 14)]),
    # a stage of an A100 and a V100 node (uneven shares) beside a T4 node
    ("gpt-350m", "1x4xA100-80GB+1x4xV100-32GB+1x4xT4:nics=1x6.25", 32, 16,
     [(tuple(T), 1, 6), (tuple(range(8)), 1, 18)]),
    # two stages on one node behind its one NIC, between whole-node stages
    ("gpt-1.3b:layers=8", "3x4xV100-32GB:nics=1x1.25", 32, 8,
     [(tuple(range(4)), 1, 2), ((4, 5), 1, 2), ((6, 7), 1, 2), (tuple(range(8, 12)), 1, 2)]),
    # two stages of six GPUs that meet on the middle node's NIC (their gradient reductions too)
    ("gpt-1.3b:layers=8", "3x4xV100-32GB:nics=1x1.25", 24, 6, [(tuple(range(6)), 1, 4), (tuple(range(6, 12)), 1, 4)]),
    # two T4s of a T4 + V100 cluster, m = p: the last chunk's loss outweighs the two layers beside it
    ("gpt-350m:layers=6", "1x2xT4+1x1xV100-16GB", 12, 6, [((0,), 1, 4), ((1,), 1, 2)]),
]

# A commodity cloud of twelve one-NIC nodes (eight of V100s at 10 Gb/s, four of T4s at 50 Gb/s), GPT 1.3B
# at batch 64: plans `python -m grader plan --cluster COMMODITY --workload gpt-1.3b --batch 64 --top 0`
# ranked best, before and after the crossings that meet on a NIC were played out, each under its own
# schedule: (microbatch, [(stage ranks, tp, layers)], schedule). Every stage boundary crosses nodes.
COMMODITY = "8x4xV100-32GB:nics=1x1.25+4x4xT4:nics=1x6.25"
_PAIRS = [tuple(range(2 * s, 2 * s + 2)) for s in range(16)]  # the V100s two by two: 2 layers, then 1
_T4_FIRST = [(tuple(range(32, 40)), 1), (tuple(range(40, 48)), 1)] + \
    [(tuple(range(8 * s, 8 * s + 8)), n) for s, n in enumerate((6, 6, 6, 4))]  # two nodes a stage
CHOSEN = [
    (1, [(r, 2, 2 if s < 8 else 1) for s, r in enumerate(_PAIRS)], "1f1b"),
    (1, [(r, 2, 2 if s < 8 else 1) for s, r in enumerate(_PAIRS)], "zero-bubble"),
    (2, [(r, 1, 2 if s < 8 else 1) for s, r in enumerate(_PAIRS)], "zero-bubble"),
    (4, [(r, 2, n) for r, n in _T4_FIRST], "zero-bubble"),
    (4, [(r, 2, n) for r, n in _T4_FIRST], "1f1b"),
    (8, [(r, 1, n) for r, n in _T4_FIRST], "zero-bubble"),
    (8, [(tuple(range(32, 48)), 2, 2)] + [(r, 1, n) for r, n in _T4_FIRST[2:]], "zero-bubble"),
]


def _plans():
    """(set, workload, cluster, batch, microbatch, stage ranks, TP degrees and layers, [(schedule, recompute)])
    of every pipeline."""
    for name, spec, batch in SETTINGS:
        gpus = Cluster.load(spec).nodes[0].gpus
        for tp in sorted({1, 2, gpus}):
            stages = [(tuple(range(gpus)), tp, None), (tuple(range(gpus, 2 * gpus)), tp, None)]
            yield "equal", name, spec, batch, 2 * gpus // tp, stages, VARIANTS  # two samples a replica
    for name, spec, batch, microbatch, stages in WIDTHS:
        yield "widths", name, spec, batch, microbatch, stages, VARIANTS
    for microbatch, stages, schedule in CHOSEN:
        yield "commodity", "gpt-1.3b", COMMODITY, 64, microbatch, stages, [(schedule, "none")]
    for name, spec, batch in PER_OP:
        gpus = Cluster.load(spec).nodes[0].gpus
        for tp in (1, 2, 4):
            stages = [(tuple(range(gpus)), tp, None), (tuple(range(gpus, 2 * gpus)), tp, None)]
            yield "per-op", name, spec, batch, 2 * gpus // tp, stages, PER_OP_VARIANTS


def moe_rows():
    """The rows of the moe set (`rows`)."""
    name, spec, batch, microbatch = MOE
    workload, cluster = Workload.load(name), Cluster.load(spec)
    options, ranks, m = StageSpace(cluster, workload), tuple(range(cluster.world_size)), batch // microbatch
    for tp, ep, etp in MOE_GRIDS:
        for recompute, zero in MOE_VARIANTS:
            placed = [(workload.num_layers, next(o for o in options.options(ranks, microbatch, recompute, zero, "",
                                                                               ep, 1, etp) if o.tp == tp))]
            seconds, memory = step_estimate(cluster, workload, placed, m, "1f1b", 1)
            plan = with_etp(to_plan(placed, microbatch, m, "1f1b", recompute, zero, 1, "", ep), workload, etp)
            ran = simulate_candidate(cluster, workload, batch, Candidate(plan, seconds, memory, 0.0), framework="megatron")
            if ran.simulated is not None:
                shape = f"{len(ranks) // tp}x{tp}:{workload.num_layers}L ep={ep} etp={etp}" + (" zero=1" if zero else "")
                yield "moe", name, spec, f"{shape} {m}x{microbatch}", "1f1b", recompute, seconds, ran.simulated, \
                    memory, ran.peak_fraction


SEARCHED = {  # set: [(framework, cluster, workload, batch)] whose kept candidates it simulates
    "context": [("megatron", "1x8xH100-80GB", "llama-3-8b:layers=8,seq=131072", 8),
                ("torchtitan", "1x8xH100-80GB", "llama-3-8b:layers=8,seq=131072", 8)],
    "sharded": [("torchtitan", "16x8xH100-80GB", "llama-3-70b:layers=16,seq=8192", 128)],
}


def searched_rows(kind: str):
    """The rows of a set of searched plans (`SEARCHED`): the best estimate of each kind the set is about."""
    for framework, spec, name, batch in SEARCHED[kind]:
        cluster, workload = Cluster.load(spec), Workload.load(name)
        picked: dict = {}
        for c in sorted(plan(cluster, workload, batch, framework=framework, top=0).candidates, key=lambda c: c.estimate):
            p = c.plan
            if kind == "context" and p.cp > 1:
                picked.setdefault((p.cp, p.recompute, p.zero, p.fp8), c)
            elif kind == "sharded" and (p.replicate > 1 or p.zero == 3 and len(p.stages) > 1):
                picked.setdefault((len(p.stages), p.replicate, p.recompute, p.stages[0].tp), c)
        for c in picked.values():
            ran = simulate_candidate(cluster, workload, batch, c, reserve=memory_reserve(True, "reserve"),
                                     framework=framework)
            if ran.simulated is not None:
                yield kind, name, spec, c.plan.describe(), c.plan.schedule, c.plan.recompute, c.estimate, \
                    ran.simulated, c.memory, ran.peak_fraction


def rows(sets: Collection[str] = SETS):
    """(set, workload, cluster, plan, schedule, recompute, estimate s, simulated s, estimated memory share,
    simulated peak share) of every plan of `sets`."""
    if "moe" in sets:
        yield from moe_rows()
    for kind in SEARCHED:
        if kind in sets:
            yield from searched_rows(kind)
    for kind, name, spec, batch, microbatch, stages, variants in _plans():
        if kind not in sets:
            continue
        workload, cluster = Workload.load(name), Cluster.load(spec)
        m = batch // microbatch
        for schedule, recompute in variants:
            options = StageSpace(cluster, workload)
            placed = [(layers or workload.num_layers // len(stages),
                       {o.tp: o for o in options.options(ranks, microbatch, recompute, 0)}[tp])
                      for ranks, tp, layers in stages]
            chunks = 2 if schedule == "interleaved" else 1
            if chunks > 1 and (m % len(placed) or any(n < chunks for n, _ in placed)):
                continue
            seconds, memory = step_estimate(cluster, workload, placed, m, schedule, chunks)
            plan = to_plan(placed, microbatch, m, schedule, recompute, 0, chunks)
            ran = simulate_candidate(cluster, workload, batch, Candidate(plan, seconds, memory, 0.0),
                                     framework="torchtitan" if kind == "per-op" else None)
            if ran.simulated is None:
                continue  # out of memory in the simulator: nothing to compare
            shape = "+".join(f"{len(r) // tp}x{tp}:{n}L" for n, (r, tp, _) in
                             zip((n for n, _ in placed), stages)) + f" {m}x{microbatch}"
            yield kind, name, spec, shape, schedule, recompute, seconds, ran.simulated, memory, ran.peak_fraction


def main(sets: Sequence[str] = ()) -> None:
    extra = ("per-op", *SEARCHED, "moe")
    unknown = set(sets) - {*SETS, *extra}
    if unknown:
        raise SystemExit(f"planner_estimate: unknown set {sorted(unknown)[0]!r} ({', '.join((*SETS, *extra))})")
    print("| set | workload | cluster | plan | schedule | recompute | estimate | simulated | estimate / simulated "
          "| memory: estimate / simulated peak |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    errors: dict[str, list[float]] = {kind: [] for kind in (*SETS, *extra)}
    for kind, name, spec, shape, schedule, recompute, seconds, simulated, memory, peak in rows(sets or SETS):
        errors[kind].append(abs(seconds / simulated - 1))
        print(f"| {kind} | {name} | {spec} | {shape} | {schedule} | {recompute} | {seconds * 1e3:.1f} ms | "
              f"{simulated * 1e3:.1f} ms | {seconds / simulated:.3f} | {memory:.3f} / {peak:.3f} |")
    print()
    for label, values in (*errors.items(), ("all", [e for values in errors.values() for e in values])):
        if not values:
            continue
        print(f"{label}: mean |estimate / simulated - 1| {sum(values) / len(values) * 100:.1f} %, "
              f"largest {max(values) * 100:.1f} % over {len(values)} plans")


if __name__ == "__main__":
    main(sys.argv[1:])
