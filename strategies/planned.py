"""Run any plan: pipeline stages of their own widths, each with its own data- and tensor-parallel
degrees, layer blocks and per-replica shares of every microbatch (a `dist_lib.planner.Plan`, or the JSON
file `python -m grader plan --out` writes).

Every stage runs every microbatch, cut among its replicas by the stage's `shares` (Metis, Um et al.
ATC'24, sec. 4: per-stage (dp, tp) and uneven data shares). Between two stages that cut a microbatch
differently, a sender splits its output by samples into one piece per overlapping receiver replica
(`Model.split_samples`) and a receiver joins the pieces it gets (`Model.join_samples`); backward does
the same with the gradients. Tensor rank j of a receiving replica gets its input from tensor rank
j mod t of the sending one (every TP rank holds the whole activation after its all-reduce). Between two
stages of the same TP degree t > 1 that pairing is rank j to rank j, and each TP rank sends only its 1/t
piece of every message, which the receiving TP group all-gathers, as `hybrid` does (Megatron-LM's
scatter-gather, Narayanan et al. 2021, sec. 4.1); between stages of different degrees messages go
whole. The schedule
(GPipe, 1F1B, interleaved, ZB-H1), recompute and ZeRO-1 are the plan's; layer gradients are reduced
among a stage's replicas as soon as the last microbatch has passed, as in the other pipeline strategies.
Bubble and memory are those of the plan's schedule (gpipe.py, one_f_one_b.py, interleaved.py,
zero_bubble.py), with the stage times the plan's widths and shares give; ZB-H1 also counts each
boundary's crossing as the planner does (`dist_lib.planner.messages.schedule_crossing`: the slowest of its
messages alone), so that the plan runs the order the planner played out. ZB-H1 posts each receive where
`zero_bubble` does (`_early_receives.py`): before the pass during which the sending pass is predicted to
end, from the plan's stage and crossing times; the posted receive takes every piece of the message at once, one
receive per sending rank of its route. The other schedules receive each input as its pass begins.
"""

from __future__ import annotations

from pathlib import Path

from dist_lib import Model, ReplicaGrid, planner
from dist_lib.tensors import range_mask
from dist_lib.planner.messages import schedule_crossing
from dist_lib.planner.plan import Plan, Stage

from . import gpipe, interleaved, one_f_one_b, zero_bubble
from dist_lib.schedules.actions import Action, check_schedule
from ._early_receives import post_target
from ._pipeline import StagePlan, _Stage
from ._plan import stage_times

SCHEDULES = {"gpipe": gpipe.schedule, "1f1b": one_f_one_b.schedule, "interleaved": interleaved.schedule,
             "zero-bubble": zero_bubble.posted_schedule}


async def train(model: Model, *, plan=None) -> None:
    """Run `plan` (a `Plan`, its dict, or a plan file); without one, the planner's best estimate."""
    source = f"plan file {plan}" if isinstance(plan, (str, Path)) else "plan"
    plan = estimated_plan(model) if plan is None else Plan.load(plan)
    plan.check(model.world_size, model.num_layers, model.global_batch_size, model.cluster, source,
               model.workload)
    if plan.cp != 1 or plan.zero == 3 or plan.recompute == "op" or getattr(model, "moe", None) is not None:
        # (hybrid runs them: recompute 'op' with TP beside the sequence parallelism torchtitan always adds)
        what, to = ("cp", "megatron") if plan.cp != 1 else ("zero=3", "torchtitan") if plan.zero == 3 else \
            ("recompute 'op'", "torchtitan") if plan.recompute == "op" else ("experts", "megatron")
        raise ValueError(f"{source}: a plan with {what} runs through hybrid: export it (python -m grader export PLAN "
                         f"--to {to}) and run the export with `run --from`")
    where = locate(plan, model.rank)
    if where is None:
        return  # a rank the plan leaves idle
    s, replica, tp_rank = where
    stage, pp, b = plan.stages[s], len(plan.stages), plan.microbatch_size
    first = stage.offsets()[replica]
    mbs = [range(k * b + first, k * b + first + stage.shares[replica]) for k in range(plan.microbatches)]
    chunks = [range(*block) for block in stage.blocks]
    extra = {}
    if plan.schedule == "zero-bubble":  # every replica of a stage orders its work the same way
        extra["times"] = [stage_times(model, st.ranks[0], [range(*blk) for blk in st.blocks], max(st.shares),
                                      st.tp, last=i == pp - 1) for i, st in enumerate(plan.stages)]
        for i in range(pp - 1):  # "C": the crossing to the next stage, as the planner orders the plan by
            extra["times"][i]["C"] = schedule_crossing(model.cluster, model.workload, plan.stages[i],
                                                       plan.stages[i + 1])
    actions = list(SCHEDULES[plan.schedule](s, pp, plan.microbatches, plan.chunks, **extra))
    check_schedule(actions, plan.chunks, plan.microbatches)
    dp_ranks = [stage.ranks[d * stage.tp + tp_rank] for d in range(stage.dp)]
    stage_plan = StagePlan(stage=s, stage_ranks=[st.ranks[0] for st in plan.stages], chunks=chunks,
                           microbatches=mbs, actions=actions, dp_group=lambda layer: dp_ranks,
                           tp_group=list(stage.replica_ranks(replica)), tp_rank=tp_rank,
                           recompute=plan.recompute == "full", selective_recompute=plan.recompute == "selective",
                           fp8=plan.fp8)
    runner = _PostedPlannedStage if plan.schedule == "zero-bubble" else _PlannedStage
    await runner(model, stage_plan, plan, replica).run()


def replica_grid(world_size: int, global_batch_size: int, *, plan=None) -> ReplicaGrid | None:
    """The plan's replicas as one grid (`dist_lib.run.folding`): when every stage has the same number of
    replicas and cuts every microbatch evenly among them, replica j of each stage runs replica 0's program
    on block j of each microbatch, and exchanges messages only with replica j of its neighbours. Else
    (uneven shares, stages of different widths, no plan given) None: the step runs rank for rank."""
    if plan is None:
        return None
    plan = Plan.load(plan)
    dp = plan.stages[0].dp
    if dp < 2 or plan.microbatch_size % dp:
        return None
    share = plan.microbatch_size // dp
    if any(stage.dp != dp or set(stage.shares) != {share} for stage in plan.stages):
        return None
    return ReplicaGrid(dp, stages=tuple((stage.ranks, stage.tp) for stage in plan.stages),
                       microbatch=plan.microbatch_size)


_ESTIMATED: dict = {}


def estimated_plan(model: Model) -> Plan:
    """The plan the closed-form estimate ranks first (no simulation: this runs inside one), once per
    cluster, workload and batch."""
    key = (model.cluster, model.workload, model.global_batch_size)
    if key not in _ESTIMATED:
        _ESTIMATED[key] = planner.plan(model.cluster, model.workload, model.global_batch_size, top=0).best.plan
    return _ESTIMATED[key]


def locate(plan: Plan, rank: int) -> tuple[int, int, int] | None:
    """(stage, replica, tensor rank) of `rank` in the plan, or None when the plan does not use it."""
    for s, stage in enumerate(plan.stages):
        if rank in stage.ranks:
            i = stage.ranks.index(rank)
            return s, i // stage.tp, i % stage.tp
    return None


def overlaps(mine: Stage, replica: int, other: Stage) -> list[tuple[int, int, int]]:
    """(other replica, first, stop) of each piece, in microbatch-relative samples, where `other`'s cut of
    a microbatch overlaps `mine`'s replica's slice."""
    lo = mine.offsets()[replica]
    hi = lo + mine.shares[replica]
    out = []
    for e, (first, share) in enumerate(zip(other.offsets(), other.shares)):
        a, z = max(lo, first), min(hi, first + share)
        if a < z:
            out.append((e, a, z))
    return out


class _PlannedStage(_Stage):
    """`_Stage` whose neighbours are whole stages of their own widths, and (with ZeRO-1) whose optimizer
    state is sharded over the stage's replicas: gradients reduce-scattered, updated shards all-gathered."""

    def __init__(self, model: Model, stage_plan: StagePlan, plan: Plan, replica: int):
        self.full = plan
        self.mine = plan.stages[stage_plan.stage]
        self.replica = replica
        self.dp_ranks = sorted(stage_plan.dp_group(0))
        self.zero = plan.zero == 1 and len(self.dp_ranks) > 1
        super().__init__(model, stage_plan)
        self.base = self.mine.offsets()[replica]
        self.share = self.mine.shares[replica]
        self.routes: dict[int, list] = {}

    def load(self, layer: int) -> tuple:
        if not self.zero:
            return super().load(layer)
        tp, tp_rank = len(self.plan.tp_group), self.plan.tp_rank
        shard = self.dp_ranks.index(self.model.rank)
        return self.model.load_sharded_state(layer, shard, len(self.dp_ranks), tp_rank=tp_rank, tp_size=tp)

    def reduce(self, grad, group):
        return self.model.reduce_scatter(grad, group) if self.zero else super().reduce(grad, group)

    async def update_all(self) -> None:
        if not self.zero:
            await super().update_all()
            return
        model, gathered = self.model, {}
        for layer in sorted(self.weights, reverse=True):
            grad = await self.reduced.pop(layer)
            weight, opt_state = self.weights.pop(layer)
            new_shard, _ = model.update(layer, grad, weight, opt_state)
            del grad, weight, opt_state
            gathered[layer] = model.all_gather(new_shard, self.dp_ranks)
            del new_shard
        for layer in sorted(gathered, reverse=True):
            model.set_final_weight(layer, await gathered.pop(layer))

    def _routes(self, other: int) -> list[tuple[int, int, int, tuple[int, ...], int]]:
        """Per piece of this replica's slice that stage `other` holds in one of its replicas:
        (first, stop) relative to the slice, the ranks of that replica this tensor rank sends to (those
        of another tensor rank get their copy from it), and the rank it receives from. Worked out once
        per neighbouring stage: every microbatch is cut the same way."""
        found = self.routes.get(other)
        if found is None:
            stage = self.full.stages[other]
            t, tp, lo = self.plan.tp_rank, len(self.plan.tp_group), self.base
            found = self.routes[other] = [
                (a - lo, z - lo, tuple(stage.ranks[e * stage.tp + j] for j in range(stage.tp) if j % tp == t),
                 stage.ranks[e * stage.tp + t % stage.tp])
                for e, a, z in overlaps(self.mine, self.replica, stage)]
        return found

    def _scatters(self, other: int) -> bool:
        """Whether messages to and from stage `other` go as TP pieces (`_piece`, `_gathered`): only when
        both stages have this TP degree, so that `_routes` pairs tensor rank j with tensor rank j of each
        overlapping replica and the receiving group holds every piece. Between degrees t and t' the
        pairing is j mod t: with t' > t several receivers share one sender and would each need all t
        pieces, with t' < t some senders have no receiver, so those messages stay whole."""
        return self.scatter_gather and self.full.stages[other].tp == self.mine.tp

    def _send_to(self, x, virtual: int, what: str) -> None:
        other = virtual % self.pp
        routes, scatter = self._routes(other), self._scatters(other)
        if len(routes) == 1 and routes[0][1] - routes[0][0] == self.share:  # the receiver takes it whole
            for dst in routes[0][2]:
                self._send(self._piece(x, dst) if scatter else x, dst, what)
            return
        start = x.samples.bit_length() - self.share  # first sample of the slice
        for a, z, targets, _ in routes:
            if targets:
                piece = self.model.split_samples(x, range(start + a, start + z))
                for dst in targets:
                    self._send(self._piece(piece, dst) if scatter else piece, dst, what)

    async def _receive_from(self, virtual: int, layer: int, samples: range, what: str):
        other = virtual % self.pp
        routes, scatter = self._routes(other), self._scatters(other)
        start = samples.start
        if len(routes) == 1 and routes[0][1] - routes[0][0] == self.share:  # the sender sent it whole
            x = await self._receive(routes[0][3], layer, samples, what)
            return await self._gathered(x, routes[0][3]) if scatter else x
        pieces = []
        for a, z, _, src in routes:
            # each sample piece is gathered whole before the join (TP pieces have no rows to join)
            piece = await self._receive(src, layer, range(start + a, start + z), what)
            pieces.append(await self._gathered(piece, src) if scatter else piece)
        return self.model.join_samples(pieces)


class _PostedPlannedStage(_PlannedStage):
    """`_PlannedStage` whose schedule posts its receives (ZB-H1): a post receives every piece of the
    message from its route's sending ranks at once, and the pass that takes it awaits those receives.
    Only zero-bubble plans run it, so the other schedules' receive path is unchanged."""

    def __init__(self, model: Model, stage_plan: StagePlan, plan: Plan, replica: int):
        super().__init__(model, stage_plan, plan, replica)
        self.posted: dict = {}  # (what, layer, samples) -> the posted receives of its pieces, in route order

    def post(self, action: Action) -> None:
        key, virtual = post_target(self, action)
        recv = self.model.recv
        self.posted[key] = [recv(src) for _, _, _, src in self._routes(virtual % self.pp)]

    async def _receive_from(self, virtual: int, layer: int, samples: range, what: str):
        works = self.posted.pop((what, layer, samples), None)
        if works is None:  # not posted: received now
            return await super()._receive_from(virtual, layer, samples, what)
        other = virtual % self.pp
        routes, scatter = self._routes(other), self._scatters(other)
        whole = len(routes) == 1 and routes[0][1] - routes[0][0] == self.share
        pieces = []
        for (a, z, _, src), work in zip(routes, works):
            piece = await work
            expected = samples if whole else range(samples.start + a, samples.start + z)
            if piece.layer != layer or piece.samples != range_mask(expected.start, expected.stop):
                self._unexpected(piece, src, layer, expected, what)
            pieces.append(await self._gathered(piece, src) if scatter else piece)
        return pieces[0] if whole else self.model.join_samples(pieces)
