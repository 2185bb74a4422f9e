"""Megatron-LM's pipeline exchange: a step's sends and receives issued together, and waited for together.

Megatron-LM moves pipeline messages in `_communicate` (megatron/p2p_communication.py, from December 2020;
megatron/core/pipeline_parallel/p2p_communication.py from 2023): one call takes what the stage sends to its
previous and next stage and what it receives from them, issues them all at once (`torch.distributed.
batch_isend_irecv` in `_batched_p2p_ops`, or separate `isend`/`irecv` in `_p2p_ops`) and, unless told
otherwise (`wait_on_reqs`), calls `wait()` on every request, sends included, before returning; with
`batch_p2p_comm` (and `batch_p2p_sync`, both on by default) it then runs `torch.cuda.synchronize()`. A send
is a rendezvous with the receive its neighbour issues in its own call, so the stage's next pass starts only
once every message of the call has crossed: each crossing is on the critical path, and the schedules call
it between every two passes:

* 1F1B (`forward_backward_pipelining_without_interleaving`): `recv_forward`, `send_forward` around each
  warm-up forward; then `send_forward_recv_backward` after each forward and `send_backward_recv_forward`
  after each backward; `recv_backward`, `send_backward` around each cool-down backward
  (`one_f_one_b.megatron_schedule`). The overlap option does not exist for it (megatron/arguments.py turns
  `overlap_p2p_comm` off without virtual stages).
* interleaved 1F1B (`forward_backward_pipelining_with_interleaving`), blocking (`overlap_p2p_comm` off):
  `send_forward_recv_forward` after each warm-up forward, `send_forward_backward_recv_forward_backward`
  after each steady-state forward-backward pair, `send_backward_recv_backward` after each cool-down
  backward; overlapped (`overlap_p2p_comm` on, added May 2023, commit f9283c5a, and on by default from then
  until `--no-overlap-p2p-communication`: argparse `store_false`): the same calls without the wait, whose
  handles are waited for before the next forward (the activation exchange) or the next backward (the
  gradient exchange), so a steady-state crossing overlaps the opposite pass, and blocking in the cool-down
  (`interleaved.megatron_schedule`).

A schedule writes this with the `EXCHANGES` actions (`dist_lib/schedules/actions.py`): it issues sends and receives ("XSA",
"XRA", "XSG", "XRG") and waits ("XWA", "XWG"); `ExchangeOrder` builds such a list and names each receive
after the pass that takes it, and `run_exchange_stage` runs it. The host-side `torch.cuda.synchronize()` is
not modelled (the simulator has no host launch queue): it costs the kernel-launch gap of the next pass.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from dist_lib import Model
from dist_lib.tensors import range_mask

from dist_lib.schedules.actions import EXCHANGES, Action
from ._pipeline import StagePlan, _Stage, run_stage

_RECEIVE = {"activation": Action("XRA", -1, -1), "activation gradient": Action("XRG", -1, -1)}  # unnamed yet


class ExchangeOrder:
    """A stage's passes and Megatron-LM exchanges, in order. Receives are named afterwards (`actions`): the
    i-th activation received is the input of the i-th forward that takes one from another virtual stage,
    the i-th gradient the output gradient of the i-th backward that takes one, since a neighbour sends them
    in the order the stage runs those passes (each pair of stages carries its messages in order)."""

    def __init__(self, stage: int, stages: int, chunks: int):
        self.stage, self.virtual = stage, stages * chunks
        self.stages = stages
        self.order: list[Action] = []
        self.pending = {"activation": False, "activation gradient": False}

    def run(self, kind: str, chunk: int, mb: int) -> None:
        self.order.append(Action(kind, chunk, mb))

    def issue(self, send_activation: tuple[int, int] | None = None, receive_activation: bool = False,
              send_gradient: tuple[int, int] | None = None, receive_gradient: bool = False, wait: bool = True) -> None:
        """One `_communicate` call: sends name the (chunk, microbatch) whose output goes; `wait=False` keeps
        the handles for a later `wait` (Megatron-LM's `overlap_p2p_comm`)."""
        if send_gradient is not None:
            self.order.append(Action("XSG", *send_gradient))
        if receive_activation:
            self.order.append(_RECEIVE["activation"])
        if send_activation is not None:
            self.order.append(Action("XSA", *send_activation))
        if receive_gradient:
            self.order.append(_RECEIVE["activation gradient"])
        self.pending["activation"] |= send_activation is not None or receive_activation
        self.pending["activation gradient"] |= send_gradient is not None or receive_gradient
        if wait:
            self.wait("activation")
            self.wait("activation gradient")

    def wait(self, what: str) -> None:
        """Wait for the `what` messages issued since the last wait (nothing if there are none)."""
        if self.pending[what]:
            self.order.append(Action("XWA" if what == "activation" else "XWG", 0, 0))
            self.pending[what] = False

    def actions(self) -> list[Action]:
        """The order with each receive named after the pass that takes it."""
        takers: dict[str, list[tuple[int, int]]] = {"activation": [], "activation gradient": []}
        for kind, chunk, mb in self.order:
            v = chunk * self.stages + self.stage
            if kind == "F" and v > 0:
                takers["activation"].append((chunk, mb))
            elif kind in ("B", "I") and v < self.virtual - 1:
                takers["activation gradient"].append((chunk, mb))
        count = {what: 0 for what in takers}
        out = []
        for action in self.order:
            what = next((w for w, r in _RECEIVE.items() if action is r), None)
            if what is not None:
                if count[what] == len(takers[what]):
                    raise ValueError(f"stage {self.stage}: more {what} receives issued than passes take")
                action = Action(action.kind, *takers[what][count[what]])
                count[what] += 1
            out.append(action)
        for what, taken in takers.items():
            if count[what] != len(taken):
                raise ValueError(f"stage {self.stage}: {len(taken)} passes take an {what} but {count[what]} "
                                 f"receives are issued")
        return out


def exchange_choice(megatron_exchange: str | None, plain: Callable, exchanges: dict[str, Callable], note: str = ""
                    ) -> tuple[Callable, Callable[[Model, StagePlan], Coroutine[Any, Any, None]]]:
    """(schedule, stage runner) for a strategy's `megatron_exchange` option: None runs `plain` with
    `_pipeline.run_stage`, a key of `exchanges` that schedule with `run_exchange_stage`; anything else is
    refused in one line naming the choices (and `note`, why there are no others)."""
    if megatron_exchange is None:
        return plain, run_stage
    if megatron_exchange not in exchanges:
        names = [repr(name) for name in exchanges]
        choices = ", ".join(["None"] + names[:-1]) + f" or {names[-1]}"
        raise ValueError(f"megatron_exchange must be {choices}{note}, got {megatron_exchange!r}")
    return exchanges[megatron_exchange], run_exchange_stage


def run_exchange_stage(model: Model, plan: StagePlan) -> Coroutine[Any, Any, None]:
    """This rank's part of a pipeline whose schedule exchanges its messages as Megatron-LM does, to await."""
    return _ExchangeStage(model, plan).run()


class _ExchangeStage(_Stage):
    """A pipeline stage that issues its messages in exchanges and waits for them together."""

    __slots__ = ("pending",)

    def __init__(self, model: Model, plan: StagePlan):
        super().__init__(model, plan)
        # what -> [(key of a receive or None for a send, Work or None for a tensor a stage hands itself,
        # peer, layer, samples)], issued and not yet waited for
        self.pending: dict[str, list] = {"activation": [], "activation gradient": []}

    async def exchange(self, action: Action) -> None:
        kind, chunk, mb = action
        what, model = EXCHANGES[kind], self.model
        if kind in ("XWA", "XWG"):
            ops, self.pending[what] = self.pending[what], []
            for key, work, peer, layer, samples in ops:
                if key is None:
                    await work
                    continue
                x = self.local[what].pop(0) if work is None else await work
                if x.layer != layer or x.samples != range_mask(samples.start, samples.stop):
                    self._unexpected(x, peer, layer, samples, what)
                self.arrived[key] = await self._gathered(x, peer)
            return
        k, key = self.virtuals[chunk], (what, chunk, mb)
        forward = kind in ("XSA", "XRA")
        if kind in ("XSA", "XSG"):
            x = self.outbox.pop(key)
            dst = self._peer(k + 1 if forward else k - 1)
            if dst == model.rank:
                self.local[what].append(x)
            else:
                work = model.send(self._piece(x, dst), dst)
                self.sends.append(work)
                self.pending[what].append((None, work, dst, 0, range(0)))
            return
        virtual = k - 1 if forward else k + 1
        if not 0 <= virtual < self.virtual:
            raise ValueError(f"rank {model.rank}: {action!r} receives the {what} of virtual stage {k} from virtual "
                             f"stage {virtual}, which does not exist (stages 0..{self.virtual - 1})")
        layers, src = self.plan.chunks[chunk], self._peer(virtual)
        work = None if src == model.rank else model.recv(src)
        self.pending[what].append((key, work, src, layers.start if forward else layers.stop,
                                   self.plan.microbatches[mb]))
