"""Run a pipeline schedule: one rank's list of actions (`dist_lib/schedules/actions.py`), executed in order.

The schedule files (gpipe, one_f_one_b, interleaved, zero_bubble, ...) build each stage's list of
`Action`s; `run_stage` carries them out:

* a forward receives its input from the previous virtual stage (or embeds it on the first), keeps
  each layer's input (which carries the stash backward needs), and sends its output on (or computes the
  loss on the last); a backward receives the output gradient, walks the chunk's layers in reverse and
  sends the input gradient back. Sends are non-blocking, receives block only when the data is needed;
* tensor parallelism: every layer's forward and backward output is all-reduced in the TP group
  (Megatron-LM, Shoeybi et al. 2019), the backward's while the weight-gradient GEMMs run; the LM head is
  vocabulary-parallel and its input gradient all-reduced too;
* pipeline messages between TP groups (`scatter_gather`, Megatron-LM's default): each TP rank sends only
  its 1/t piece of the activation or gradient, which every TP rank holds whole, to the same TP rank of the
  neighbouring stage, and the receiving TP group all-gathers the pieces over its NVLink (Narayanan et al.
  2021, sec. 4.1: the inter-node links carry one copy of the message rather than t);
* sequence parallelism: each layer's backward first all-gathers the sequence-split output gradient for
  each of its two row-parallel GEMMs (attention projection, MLP down), which nothing overlaps (Korthikanti
  et al. 2022, sec. 4.2.2);
* activation recompute: forwards keep only each layer's input, and backward runs the forward again,
  TP all-reduces included;
* once a layer has the gradient of every local microbatch, its data-parallel all-reduce starts and
  overlaps the rest of the schedule (or, with `overlap_grad_reduce=False`, all start after the flush);
  updates follow at the end.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Coroutine, Sequence
from operator import itemgetter
from typing import Any

from dist_lib import Model, Work
from dist_lib.comm.tp_overlap import overlap_layer_collectives
from dist_lib.tensors import range_mask

from dist_lib.schedules.actions import EXCHANGES, MESSAGES, POSTS, Action

from ._blocking_messages import BlockingMessages
from ._stage_plan import StagePlan


def run_stage(model: Model, plan: StagePlan) -> Coroutine[Any, Any, None]:
    """This rank's part of the pipeline, to await. The stage's own `run` coroutine is returned rather than
    awaited inside another: every wait of the step passes through each coroutine frame between the
    strategy and the op, so one level fewer is that much less work per wait."""
    return _Stage(model, plan).run()


class _Stage(BlockingMessages):
    """One rank's pipeline stage as it runs its schedule. Its fields are slots: they sit in the object
    itself rather than in a separate values array, and every wait of the step resumes through them, on
    each of thousands of ranks."""

    __slots__ = ("model", "plan", "pp", "virtual", "virtuals", "tp", "tp_group", "scatter_gather", "weights", "left",
                 "grads", "reduced", "kept", "loss_grads", "deferred", "sends", "local", "explicit", "arrived",
                 "outbox", "partitioned_outputs", "modes", "gathers", "settling", "runs", "layer_runs", "direct")

    def __init__(self, model: Model, plan: StagePlan):
        self.model, self.plan = model, plan
        self.pp = len(plan.stage_ranks)
        self.virtual = self.pp * len(plan.chunks)
        self.virtuals = [self._virtual(chunk) for chunk in range(len(plan.chunks))]  # chunk -> virtual stage
        self.tp = tp = len(plan.tp_group)
        self.tp_group = model.group(plan.tp_group) if tp > 1 else None
        self.scatter_gather = plan.scatter_gather and tp > 1
        # a pass receives its input as `_receive_from` does, written out, when there is nothing to gather and the
        # method is not a subclass's own: a coroutine less for each message
        self.direct = not self.scatter_gather and type(self)._receive_from is _Stage._receive_from
        self.weights = {layer: self.load(layer) for chunk in plan.chunks for layer in chunk}
        self.left = {layer: len(plan.microbatches) for layer in self.weights}
        self.grads: dict = {}
        self.reduced: dict = {}
        # layer -> microbatch -> the layer's input, kept for its backward (the microbatch numbers are the
        # schedule's own ints, shared by the ranks of a stage: an entry per microbatch in flight and no key
        # object of its own, which matters at hundreds of microbatches in flight on thousands of ranks)
        self.kept: dict[int, dict[int, object]] = {layer: {} for layer in self.weights}
        # (chunk, mb) -> the inputs of the chunk's layers, where a plain forward ran them as one run
        # (`Model.forward_layers`), for the backward's run; in place of their entries in `kept`
        self.runs: dict[tuple[int, int], list] = {}
        self.layer_runs: bool | None = None  # whether chunks run as runs of layers (`_runs_layers`), once asked
        self.loss_grads: dict = {}  # microbatch -> gradient of the loss (on the last virtual stage)
        self.deferred: dict = {}  # (chunk, mb) -> [(layer, input, output grad)] awaiting W
        # sends in flight, to await before the step ends (a send's stream lets go of its tensor when it
        # completes, so a completed one is dropped from the front of the queue after each action)
        self.sends: deque[Work] = deque()
        self.local: dict[str, list] = {"activation": [], "activation gradient": []}  # pp == 1 with chunks
        # schedules that place their own messages (blocking, or exchanged): what arrived before its compute, and
        # what a compute produced for a later message, by (what, chunk, microbatch)
        kinds = set(map(itemgetter(0), plan.actions))  # (an action's kind, read in C: thousands an action list)
        self.explicit = not (kinds.isdisjoint(MESSAGES) and kinds.isdisjoint(EXCHANGES))
        self.arrived: dict = {}
        self.outbox: dict = {}
        self.partitioned_outputs: dict = {}  # (chunk, mb) -> this rank's piece of a sent output (DeepSpeed)
        # forward options: an option is left out when off, so that a plain stage calls `forward` without keywords
        self.modes: dict = {}
        if plan.selective_recompute:
            self.modes["selective_recompute"] = plan.selective_recompute
        if plan.sequence_parallel:
            self.modes["sequence_parallel"] = True
        if plan.fp8:
            self.modes["fp8"] = plan.fp8
        # sharded weights gathered before use (`_sharded.ParamGathers`), or None: each layer's weight is whole
        self.gathers = None
        self.settling = False  # a sharded stage that settles earlier reductions after each layer (`_sharded`)
        if plan.tp_comm_overlap and self.tp_group is not None:
            cp = max(1, len(plan.cp_group))  # (a CP rank's layer overlaps its s/cp tokens' collectives)
            for size in {len(samples) for samples in plan.microbatches}:
                overlap_layer_collectives(self.tp_group, model.device, model.workload, size, cp,
                                          plan.tp_comm_overlap, plan.fp8, plan.selective_recompute == "op")

    def load(self, layer: int) -> tuple:
        """(weight, optimizer state) this rank keeps for `layer`: its TP slice, whole."""
        return self.model.load_weights(layer, tp_rank=self.plan.tp_rank, tp_size=len(self.plan.tp_group))

    async def run(self) -> None:
        forward, backward, sends = self.forward, self.backward, self.sends
        for action in self.plan.actions:
            kind, chunk, mb = action
            if kind == "F":
                await forward(chunk, mb)
            elif kind == "B":
                await backward(chunk, mb, False)
            elif kind == "W":
                self.weight_grads(chunk, mb)
            elif kind in MESSAGES:
                await self.message(action)
            elif kind in EXCHANGES:
                await self.exchange(action)
            elif kind in POSTS:
                self.post(action)
            else:  # "I": the input-gradient half of a split backward
                await backward(chunk, mb, True)
            while sends and sends[0].end is not None:  # (`Work.done`, without the property's call)
                sends.popleft()
        await self.update_all()
        for work in self.sends:
            await work

    def post(self, action: Action) -> None:
        """A posted receive (`POSTS`) needs a stage that keeps it for the pass that takes it."""
        raise ValueError(f"rank {self.model.rank}: the schedule posts a receive ({action!r}); run it with "
                         f"run_posted_stage, whose passes take the posted receives")

    async def exchange(self, action: Action) -> None:
        """An exchange action (`EXCHANGES`) needs a stage that keeps the issued messages until their wait."""
        raise ValueError(f"rank {self.model.rank}: the schedule issues Megatron-LM's exchange ({action!r}); run it "
                         f"with _megatron_exchange.run_exchange_stage")

    async def finish_gradients(self) -> None:
        """After the schedule: the tied embeddings' gradient summed between the first and last stage, and
        the gradient reductions not overlapped with the backward issued, last layer first."""
        model, ranks = self.model, self.plan.stage_ranks
        if self.plan.tied_embeddings and len(ranks) > 1 and model.rank in (ranks[0], ranks[-1]):
            tied = model.tied_embedding_grad(tp_rank=self.plan.tp_rank, tp_size=len(self.plan.tp_group))
            await model.all_reduce(tied, (ranks[0], ranks[-1]))
            del tied
        if not self.plan.overlap_grad_reduce:
            for layer in sorted(self.grads, reverse=True):
                self._reduce(layer)

    @staticmethod
    async def step_layer(update, layer: int, reduced: dict, held: dict) -> tuple[Any, Any]:
        """One layer's optimizer step (`update`: `Model.update` or `update_experts`) on its reduced gradient,
        awaited if still in flight; returns what `update` returns. The layer's gradient, weights and state
        are taken out of `reduced` and `held`, so that only the results outlive the step."""
        grad = reduced.pop(layer)
        if isinstance(grad, Work):
            grad = await grad
        weight, opt_state = held.pop(layer)
        updated = update(layer, grad, weight, opt_state)
        del grad, weight, opt_state  # freed in this order, as the step's memory timeline records them
        return updated

    async def update_all(self) -> None:
        """After the schedule: each layer's optimizer step on its reduced gradient, then the hand-in."""
        await self.finish_gradients()
        model = self.model
        for layer in sorted(self.weights, reverse=True):
            grad = self.reduced.pop(layer)
            if isinstance(grad, Work):
                grad = await grad
            weight, opt_state = self.weights.pop(layer)
            new_weight, _ = model.update(layer, grad, weight, opt_state)
            del grad, weight, opt_state
            model.set_final_weight(layer, new_weight)

    def _virtual(self, chunk: int) -> int:
        return chunk * self.pp + self.plan.stage

    def _peer(self, virtual: int) -> int:
        return self.plan.stage_ranks[virtual % self.pp]

    def _send(self, x, dst: int, what: str) -> None:
        if dst == self.model.rank:  # one stage holding several chunks hands the tensor to itself
            self.local[what].append(x)
        else:
            self.sends.append(self.model.send(x, dst))

    def _send_to(self, x, virtual: int, what: str) -> None:
        """Hand `x` to virtual stage `virtual` (a subclass may route it to several ranks): with scatter-gather,
        this TP rank's piece of it. (`_send` of `_piece`, written out: this runs for every message.)"""
        dst = self.plan.stage_ranks[virtual % self.pp]  # self._peer(virtual)
        model = self.model
        if dst == model.rank:
            self.local[what].append(x)
            return
        if self.scatter_gather:
            x = model.split_tp(x, self.plan.tp_rank, self.tp)
        self.sends.append(model.send(x, dst))

    def _piece(self, x, dst: int):
        """What this rank sends of `x` to `dst`: with scatter-gather, its TP piece (DeepSpeed's pipeline engine
        partitions its messages over the model-parallel group the same way: `is_pipe_partitioned`)."""
        if self.scatter_gather and dst != self.model.rank:
            return self.model.split_tp(x, self.plan.tp_rank, len(self.plan.tp_group))
        return x

    async def _receive_from(self, virtual: int, layer: int, samples: range, what: str):
        """The `what` of `layer` for `samples` from virtual stage `virtual` (its pieces gathered in the TP
        group, with scatter-gather). (`_gathered` of `_receive`, written out: this runs for every message,
        and each coroutine it awaits would be a frame every wait of the message passes through.)"""
        src = self.plan.stage_ranks[virtual % self.pp]  # self._peer(virtual)
        model = self.model
        if src == model.rank:
            x = self.local[what].pop(0)
        else:
            x = await model.recv(src)
        if x.layer != layer or x.samples != range_mask(samples.start, samples.stop):
            self._unexpected(x, src, layer, samples, what)
        if self.scatter_gather and src != model.rank:
            x = await model.all_gather(x, self.tp_group)
        return x

    async def _gathered(self, x, src: int):
        """`x` as it arrived from `src`, made whole: with scatter-gather, the TP group all-gathers its
        ranks' pieces (the counterpart of `_piece`)."""
        if self.scatter_gather and src != self.model.rank:
            x = await self.model.all_gather(x, self.tp_group)
        return x

    async def _receive(self, src: int, layer: int, samples: range, what: str):
        x = self.local[what].pop(0) if src == self.model.rank else await self.model.recv(src)
        if x.layer != layer or x.samples != range_mask(samples.start, samples.stop):
            self._unexpected(x, src, layer, samples, what)
        return x

    def _unexpected(self, x, src: int, layer: int, samples: range, what: str) -> None:
        raise ValueError(f"rank {self.model.rank}: expected the {what} of layer {layer} for samples "
                         f"{samples.start}..{samples.stop - 1} from rank {src}, got {x!r}; the schedules of "
                         f"neighbouring stages disagree")

    async def _input(self, chunk: int, mb: int) -> Any:
        """What a forward of (chunk, mb) starts from: the microbatch's samples on the first stage, else the
        activation the stage before sent."""
        plan, k = self.plan, self.virtuals[chunk]
        if k == 0:
            return self.model.get_input_activation(plan.microbatches[mb])
        if self.explicit:
            return self.arrived.pop(("activation", chunk, mb))
        return await self._receive_from(k - 1, plan.chunks[chunk].start, plan.microbatches[mb], "activation")

    async def _output_grad(self, chunk: int, mb: int) -> Any:
        """What a backward of (chunk, mb) starts from: the loss's gradient on the last stage (its vocabulary
        slices' input gradients summed over TP), else the gradient the stage after sent."""
        plan, k = self.plan, self.virtuals[chunk]
        if k == self.virtual - 1:
            grad = self.loss_grads.pop(mb)
            if self.tp_group is not None:
                grad = await self.model.all_reduce(grad, self.tp_group)
            return grad
        if self.explicit:
            return self.arrived.pop(("activation gradient", chunk, mb))
        return await self._receive_from(k + 1, plan.chunks[chunk].stop, plan.microbatches[mb], "activation gradient")

    async def forward(self, chunk: int, mb: int) -> None:
        model, plan = self.model, self.plan
        layers, k = plan.chunks[chunk], self.virtuals[chunk]
        # (`_input`, written out: a coroutine less for every forward)
        if k == 0:
            x = model.get_input_activation(plan.microbatches[mb])
        elif self.explicit:
            x = self.arrived.pop(("activation", chunk, mb))
        elif self.direct:
            src, wanted = plan.stage_ranks[(k - 1) % self.pp], plan.microbatches[mb]
            x = self.local["activation"].pop(0) if src == model.rank else await model.recv(src)
            if x.layer != layers.start or x.samples != range_mask(wanted.start, wanted.stop):
                self._unexpected(x, src, layers.start, wanted, "activation")
        else:
            x = await self._receive_from(k - 1, layers.start, plan.microbatches[mb], "activation")
        runs = self.layer_runs
        if runs is None:
            runs = self.layer_runs = self._runs_layers()
        if runs:  # the chunk's layers in one run, their inputs kept with it for the backward's run
            xs = model.forward_layers(layers, x, self.weights)
            x = xs.pop()
            self.runs[chunk, mb] = xs
        else:
            weights, stash, modes, kept = self.weights, not plan.recompute, self.modes, self.kept
            forward, gathers, tp_group = model.forward, self.gathers, self.tp_group
            shard, plain = self._checkpoints_shard(), stash and not modes
            for layer in layers:
                # with sequence parallelism a checkpointed layer keeps its input as its sequence shard, 2sbh/t
                # bytes (the layer input lives split along the sequence between layers: Korthikanti et al. 2022,
                # sec. 4.2.2); whole otherwise, as the layer's own stash leaves the input out
                kept[layer][mb] = model.split_tp(x, plan.tp_rank, self.tp) if shard else x
                if plain and gathers is None:
                    x = forward(layer, x, weights[layer][0])
                elif gathers is None:
                    x = forward(layer, x, weights[layer][0], stash=stash, **modes)
                else:  # the layer's weight gathered whole first (the next one's gather prefetched)
                    x = forward(layer, x, await gathers.get(layer, layers, False), stash=stash, **modes)
                    gathers.after_forward(layer)
                if tp_group is not None:
                    x = await model.all_reduce(x, tp_group)
        if k == self.virtual - 1:
            # vocabulary-parallel LM head: each TP rank its V/t logits (Megatron-LM)
            self.loss_grads[mb] = model.loss(x, tp_rank=plan.tp_rank, tp_size=self.tp)
        elif self.explicit:
            self.outbox[("activation", chunk, mb)] = x
        else:
            self._send_to(x, k + 1, "activation")

    async def backward(self, chunk: int, mb: int, split: bool) -> None:
        model, plan = self.model, self.plan
        layers, k = plan.chunks[chunk], self.virtuals[chunk]
        if k == self.virtual - 1 or self.explicit:
            grad = await self._output_grad(chunk, mb)
        elif self.direct:  # (`_output_grad`'s commonest case, its `_receive_from` too, written out)
            src, wanted = plan.stage_ranks[(k + 1) % self.pp], plan.microbatches[mb]
            grad = self.local["activation gradient"].pop(0) if src == model.rank else await model.recv(src)
            if grad.layer != layers.stop or grad.samples != range_mask(wanted.start, wanted.stop):
                self._unexpected(grad, src, layers.stop, wanted, "activation gradient")
        else:  # (`_output_grad`'s commonest case, written out: a coroutine less for every backward)
            grad = await self._receive_from(k + 1, layers.stop, plan.microbatches[mb], "activation gradient")
        run = self.runs.pop((chunk, mb), None) if self.layer_runs else None
        if run is not None:
            left = self.left
            # every backward of a chunk (and every W of a split one) sums a gradient into each of its layers, so
            # they all have as many microbatches left: one layer's count is the chunk's
            if not split and (not layers or left[layers.start] > 1):
                # the chunk's plain backward as one run: no layer's gradient completes in it, so no reduction
                # starts between its ops (forward_layers ran only where nothing else runs between them)
                run.append(grad)
                del grad
                grad = model.backward_layers(layers, run, self.weights, self.grads)
                for layer in layers:
                    left[layer] -= 1
                if k > 0 and self.explicit:
                    self.outbox[("activation gradient", chunk, mb)] = grad
                elif k > 0:
                    self._send_to(grad, k - 1, "activation gradient")
                return
            for layer, x in zip(layers, run):  # one op at a time, from `kept`
                self.kept[layer][mb] = x
            run = x = None  # (an empty chunk binds no x)
        deferred = self.deferred.setdefault((chunk, mb), []) if split else None
        tp_group, weights, recompute, kept = self.tp_group, self.weights, plan.recompute, self.kept
        gather_grad = plan.sequence_parallel and tp_group is not None
        async_reduce = tp_group is not None and plan.async_tp_allreduce
        gathers = self.gathers
        shard = self._checkpoints_shard()
        regather = gather_grad and plan.selective_recompute == "op"
        for layer in reversed(layers):
            x = kept[layer].pop(mb)
            if shard:  # the checkpointed shard made whole again for the recompute
                x = await self.model.all_gather(x, tp_group)
            elif regather:
                await self._regather_norm_outputs(x)
            weight = weights[layer][0] if gathers is None else await gathers.get(layer, layers, True)
            if recompute:
                # rebuild the stash; the output is not needed again, but the re-run forward repeats its
                # TP all-reduces (Megatron-LM checkpoints whole layers, communication included)
                out = model.forward(layer, x, weight, **self.modes)
                if tp_group is not None:
                    await model.all_reduce(out, tp_group)
                del out
            if gather_grad:
                grad = await self._gather_sequence_parallel_grad(grad)
            if split:
                grad_in = model.backward_input(layer, x, grad, weight)
                deferred.append((layer, x, grad))
            elif async_reduce:
                # Megatron-LM all-reduces the input gradient while the weight-gradient GEMMs run
                # (async_tensor_model_parallel_allreduce; Korthikanti et al. 2022, sec. 4.2.2)
                reducing = model.all_reduce(model.backward_input(layer, x, grad, weight), tp_group)
                self._accumulate(layer, model.backward_weight(layer, x, grad, weight))
                grad_in = await reducing
            else:
                weight_grad, grad_in = model.backward(layer, x, grad, weight)
                self._accumulate(layer, weight_grad)
                del weight_grad
            del x
            if gathers is not None:
                del weight
                gathers.after_backward(layer, self.left[layer] == 0)
                if self.settling:
                    await self.settle()  # type: ignore[attr-defined]
            if tp_group is not None and (split or not async_reduce):
                # after the backward GEMMs (Megatron-LM before September 2021: autograd all-reduces the
                # input gradient once the column-parallel layer's backward has run)
                grad_in = await model.all_reduce(grad_in, tp_group)
            grad = grad_in
        if k > 0 and self.explicit:
            self.outbox[("activation gradient", chunk, mb)] = grad
        elif k > 0:
            self._send_to(grad, k - 1, "activation gradient")

    def _runs_layers(self) -> bool:
        """Whether a chunk's forward runs its layers as one run (`Model.forward_layers`), and its backward may:
        nothing runs between its layers' ops (no TP collectives, weight gathers or settling reductions) and
        each is the plain op (no recompute, no compute modes). Asked at the first forward, once a subclass's
        constructor has set the gathers."""
        return not (self.plan.recompute or self.modes or self.gathers is not None or self.tp_group is not None
                    or self.settling)

    def _checkpoints_shard(self) -> bool:
        """Whether a checkpointed layer input is kept as this TP rank's sequence shard: full recompute with
        sequence parallelism. The recompute then all-gathers it first; Megatron-LM's layer forward starts from
        the shard and gathers its layernorm output before the QKV GEMM, the same bytes, so this all-gather is
        charged on top of the re-run layer's TP collectives (one all-gather of b*s*h more than Megatron-LM
        moves in the recompute)."""
        return self.plan.recompute and self.plan.sequence_parallel and self.tp_group is not None

    async def _regather_norm_outputs(self, x) -> None:
        """torchtitan's per-op selective checkpointing with sequence parallelism: its recompute runs the layer's
        two all-gathers of the norms' sequence-split outputs again (`all_gather_into_tensor` is not in its
        `_save_list`; `workload/per_op_checkpoint.py`), b*s*h each, before the backward."""
        model, tp_rank, tp = self.model, self.plan.tp_rank, self.tp
        for _ in range(2):
            await model.all_gather(model.split_tp(x, tp_rank, tp), self.tp_group)

    async def _gather_sequence_parallel_grad(self, grad):
        """Megatron-LM's sequence-parallel backward: the output gradient is split along the sequence, and
        each of the two row-parallel GEMMs (MLP down, then attention projection) needs it whole before its
        input-gradient GEMM, so two all-gathers of b*s*h run exposed (Korthikanti et al. 2022, sec. 4.2.2;
        the other all-gathers and the reduce-scatters of the backward hide behind the weight-gradient GEMMs
        and are the all-reduce issued beside them)."""
        model, tp_rank, tp = self.model, self.plan.tp_rank, len(self.plan.tp_group)
        for _ in range(2):
            grad = await model.all_gather(model.split_tp(grad, tp_rank, tp), self.tp_group)
        return grad

    def weight_grads(self, chunk: int, mb: int) -> None:
        for layer, x, grad in self.deferred.pop((chunk, mb)):
            self._accumulate(layer, self.model.backward_weight(layer, x, grad, self.weights[layer][0]))

    def _accumulate(self, layer: int, weight_grad) -> None:
        total = self.grads.get(layer)
        self.grads[layer] = weight_grad if total is None else total + weight_grad
        self.left[layer] -= 1
        if self.left[layer] == 0 and self.plan.overlap_grad_reduce:  # every local microbatch is in
            self._reduce(layer)

    def _reduce(self, layer: int) -> None:
        """Start the reduction of a layer's accumulated gradient over the replicas."""
        group = self.plan.dp_group(layer)
        grad = self.grads.pop(layer)
        self.reduced[layer] = self.reduce(grad, group) if len(group) > 1 else grad

    def reduce(self, grad, group: Sequence[int]):
        """Start the data-parallel reduction of a layer's accumulated gradient (a subclass may shard it)."""
        return self.model.all_reduce(grad, group)
