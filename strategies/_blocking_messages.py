"""DeepSpeed's blocking pipeline messages (`MESSAGES`: RA, SA, RG, SG), for a schedule that places its own:
the stage waits for each transfer, and sends what DeepSpeed 0.3's pipeline engine sends. A mixin of
`_pipeline._Stage`, which calls `message` for those actions."""

from __future__ import annotations

from dist_lib.schedules.actions import MESSAGES, Action


class BlockingMessages:
    """`_Stage`'s blocking messages (the stage's fields and its `_receive`, `_virtual`, `_peer` are used)."""

    async def message(self, action: Action) -> None:
        """One blocking message of a schedule that places its own (DeepSpeed's broadcast in a two-rank
        group): the stage waits until each transfer has completed. What goes over the wire is what
        DeepSpeed 0.3's pipeline engine sends (deepspeed/runtime/pipe/engine.py, the version AMP ran):

        * an activation: with TP (`is_pipe_partitioned`), the int64 metadata of the partition and then this
          TP rank's 1/t piece, which the receiving TP group all-gathers (`PartitionedTensor.full`); without,
          the whole tensor; with `attention_mask_messages`, then the 16-bit attention mask;
        * a gradient: the whole tensor from every TP rank (`is_grad_partitioned` is off), gathered by no one;
        * before a stage with TP takes a gradient in, it rebuilds its own partitioned output of that
          microbatch with an all-gather in the TP group (`_exec_recv_grads`), and until then it keeps that
          1/t piece alive (the engine drops the whole output once sent, `outputs[0].data = torch.zeros(1)`).
        """
        what, k = MESSAGES[action.kind], self._virtual(action.chunk)
        layers, samples = self.plan.chunks[action.chunk], self.plan.microbatches[action.mb]
        key = (what, action.chunk, action.mb)
        model, partitioned = self.model, self.scatter_gather
        if action.kind == "RA":
            src = self._peer(k - 1)
            if src == model.rank:
                self.arrived[key] = self.local[what].pop(0)
                return
            if partitioned:
                await self._receive_extra(src, "partition_meta")
            x = await self._receive(src, layers.start, samples, what)
            if self.plan.attention_mask_messages:
                await self._receive_extra(src, "attention_mask")
            if partitioned:
                x = await model.all_gather(x, self.tp_group)
            self.arrived[key] = x
        elif action.kind == "RG":
            own = self.partitioned_outputs.pop((action.chunk, action.mb), None)
            if own is not None:
                await model.all_gather(own, self.tp_group)
                del own
            self.arrived[key] = await self._receive(self._peer(k + 1), layers.stop, samples, what)
        else:
            x = self.outbox.pop(key)
            dst = self._peer(k + 1 if action.kind == "SA" else k - 1)
            if dst == model.rank:
                self.local[what].append(x)
            elif action.kind == "SG" or not partitioned:
                await model.send(x, dst)
            else:
                tp = len(self.plan.tp_group)
                await model.send(model.pipe_extra("partition_meta", tp_size=tp), dst)
                piece = model.split_tp(x, self.plan.tp_rank, tp)
                await model.send(piece, dst)
                self.partitioned_outputs[(action.chunk, action.mb)] = piece
                del piece
            if action.kind == "SA" and dst != model.rank and self.plan.attention_mask_messages:
                await model.send(model.pipe_extra("attention_mask"), dst)
            del x

    async def _receive_extra(self, src: int, what: str) -> None:
        """Take in a `PipeExtra` buffer `what` from `src` (its bytes cost their transfer; it is then dropped)."""
        x = await self.model.recv(src)
        if getattr(x, "what", None) != what:
            raise ValueError(f"rank {self.model.rank}: expected the {what} from rank {src}, got {x!r}; the "
                             f"schedules of neighbouring stages disagree")
