"""Independent re-verification of a run from its event log, in the parent process.

The worker that ran the submission is untrusted: the submission may have monkeypatched the simulator,
moved clocks, hidden tensors or deleted events. This module never imports the submission. It rebuilds
the cluster and workload from the scenario and re-derives everything the grade depends on:

* every compute, update, collective and point-to-point duration, from the same `dist_lib.costs`
  functions the simulator uses (`model._compute_cost` for compute);
* one op at a time on each rank's compute stream, on its collective stream, and on each p2p channel;
* collectives: one event per group member, sharing start, end, op, bytes and group;
* point-to-point: one send and one receive per message, sharing op id and times;
* work: every layer forwarded and backwarded for every sample, backward after its forward, every
  update fed by gradients the log shows being computed or received for the whole batch;
* memory: live bytes re-derived from the allocation log (each buffer allocated once, freed at most
  once, with the same size), and compute ops must show the buffers they create;
* correctness from the hand-in summary, and the step time as the latest event end.

`integrity` problems mean the log cannot be what the simulator produced (the run is invalid, never
ranked); `problems` mean an honest log of an incorrect step.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from dist_lib import Cluster, Result, Workload, costs
from dist_lib.check import check_final_weights
from dist_lib.memory import KINDS
from dist_lib.model import COMPUTE_MODES, SEQUENCE_PARALLEL, WEIGHT_BYTES, _compute_cost
from dist_lib.tensors import describe_mask, full_mask

_MODE_NAMES = frozenset(COMPUTE_MODES.values())

COMPUTE_OPS = ("forward", "backward", "backward_input", "backward_weight", "loss")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
REL, ABS = 1e-9, 1e-12
MAX_REPORTED = 8  # integrity problems listed per run (the first ones tell the story)


@dataclass
class Verified:
    integrity: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    result: Result | None = None

    @property
    def valid(self) -> bool:
        return not self.integrity


def _close(a: float, b: float, rel: float = REL) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b)) + ABS


class _Checker:
    def __init__(self, payload: dict[str, Any], cluster: Cluster, workload: Workload, global_batch: int):
        self.p, self.cluster, self.workload, self.gb = payload, cluster, workload, global_batch
        self.world = cluster.world_size
        self.full = full_mask(global_batch)
        self.integrity: list[str] = []
        self._costs: dict[tuple, list[tuple[int, float, float]]] = {}

    def flag(self, message: str) -> None:
        self.integrity.append(message)

    # ---- shape ------------------------------------------------------------------------------

    def events(self) -> list[tuple]:
        events = []
        for i, raw in enumerate(self.p.get("events", [])):
            try:
                rank, op, stream, start, end, layer, samples, nbytes, flops, peers, op_id, detail = raw
                e = (int(rank), str(op), str(stream), float(start), float(end), int(layer), int(samples),
                     int(nbytes), float(flops), tuple(int(x) for x in peers) if peers is not None else None,
                     int(op_id), str(detail))
            except (TypeError, ValueError):
                self.flag(f"event {i} is malformed")
                continue
            if not 0 <= e[0] < self.world or not 0 <= e[5] <= self.workload.num_layers or e[6] < 0 \
                    or e[6] > self.full or not (math.isfinite(e[3]) and math.isfinite(e[4])) \
                    or e[3] < 0 or e[4] < e[3]:
                self.flag(f"event {i} ({e[1]} on rank {e[0]}) has an impossible rank, layer, sample set or time")
                continue
            events.append(e)
        return events

    # ---- durations ----------------------------------------------------------------------------

    def compute(self, e: tuple) -> int:
        """Check one compute event's duration and FLOPs; return its tensor-parallel degree (0 if bad)."""
        rank, op, _, start, end, layer, samples, nbytes, flops = e[:9]
        device = self.cluster.device_of(rank)
        n = samples.bit_count()
        where = f"rank {rank} {op}(layer {layer}) at {start * 1e3:.3f} ms"
        if op == "update":
            params = nbytes / costs.ADAM_BYTES_PER_PARAM
            if params <= 0 or params > self.workload.layer_params(layer) * (1 + 1e-9):
                self.flag(f"{where}: updates {params:.0f} parameters; the layer has "
                          f"{self.workload.layer_params(layer)}")
                return 0
            if not _close(end - start, costs.update_time(device, params), 1e-6):
                self.flag(f"{where}: lasted {(end - start) * 1e6:.3f} us, the cost model gives "
                          f"{costs.update_time(device, params) * 1e6:.3f} us")
            return 1
        if op not in COMPUTE_OPS or n == 0 or (op == "loss") != (layer == self.workload.num_layers):
            self.flag(f"{where}: not an op the simulator records")
            return 0
        # a backward's detail is its forward's compute mode (selective recompute, sequence parallelism);
        # a forward's says only whether it is a recompute, so both sequence-parallel modes are tried
        if op in ("backward", "backward_input"):
            modes = [e[11] if e[11] in _MODE_NAMES else "none"]
        else:
            modes = ["none", SEQUENCE_PARALLEL] if op == "forward" else ["none"]
        tp = 0
        for recompute in modes:
            tp = tp or self._match(device, op, layer, n, end - start, flops, recompute)
        if not tp:
            expect, _ = _compute_cost(device, self.workload, op, layer, n, 1, recompute)
            self.flag(f"{where}: lasted {(end - start) * 1e6:.3f} us with {flops:.4g} FLOPs; the cost model "
                      f"gives {expect * 1e6:.3f} us on a {device.name} (or 1/t of it with tensor parallelism)")
        return tp

    def _match(self, device: Any, op: str, layer: int, n: int, duration: float, flops: float,
               recompute: str = "none") -> int:
        """The tensor-parallel degree whose cost-model duration and FLOPs match the event (0: none)."""
        key = (device.name, op, layer, n, recompute)
        options = self._costs.get(key)
        if options is None:
            options = self._costs[key] = [(tp, *_compute_cost(device, self.workload, op, layer, n, tp, recompute))
                                          for tp in range(1, self.world + 1)]
        for tp, expect, expect_flops in options:
            if _close(duration, expect) and _close(flops, expect_flops):
                return tp
        return 0

    def collectives(self, events: list[tuple]) -> None:
        by_id: dict[int, list[tuple]] = defaultdict(list)
        for e in events:
            by_id[e[10]].append(e)
        for op_id, members in by_id.items():
            first = members[0]
            op, peers, nbytes = first[1], first[9], first[7]
            where = f"{op} #{op_id} (layer {first[5]})"
            if op not in COLLECTIVES or not peers or list(peers) != sorted(set(peers)) \
                    or any(not 0 <= r < self.world for r in peers):
                self.flag(f"{where}: not a collective on a valid group")
                continue
            if sorted(e[0] for e in members) != list(peers):
                self.flag(f"{where}: the group is {list(peers)} but the log has it on ranks "
                          f"{sorted(e[0] for e in members)}")
            if any((e[1], e[3], e[4], e[5], e[7], e[9], e[11]) != (op, first[3], first[4], first[5], nbytes, peers,
                                                                   first[11]) for e in members):
                self.flag(f"{where}: members disagree on the op, its times or its size")
            duration = costs.collective_time(op, nbytes, self.cluster.topology(peers))
            if op == "all_reduce" and "TP partial sums" in first[11]:
                duration *= 2
            if not _close(first[4] - first[3], duration):
                self.flag(f"{where}: lasted {(first[4] - first[3]) * 1e6:.3f} us, the cost model gives "
                          f"{duration * 1e6:.3f} us for {nbytes} bytes over {len(peers)} ranks")

    def messages(self, events: list[tuple]) -> None:
        by_id: dict[int, list[tuple]] = defaultdict(list)
        for e in events:
            by_id[e[10]].append(e)
        for op_id, ends in by_id.items():
            ops = sorted(e[1] for e in ends)
            if ops != ["recv", "send"]:
                self.flag(f"message #{op_id}: the log has {ops or 'nothing'}, not one send and one recv")
                continue
            send = next(e for e in ends if e[1] == "send")
            recv = next(e for e in ends if e[1] == "recv")
            src, dst = send[9] if send[9] and len(send[9]) == 2 else (-1, -1)
            if send[0] != src or recv[0] != dst or recv[9] != send[9] or src == dst:
                self.flag(f"message #{op_id}: send on rank {send[0]} and recv on rank {recv[0]} do not match "
                          f"the pair {send[9]}")
                continue
            if (send[3], send[4], send[7], send[5], send[6]) != (recv[3], recv[4], recv[7], recv[5], recv[6]):
                self.flag(f"message #{op_id} from rank {src} to {dst}: send and recv disagree on times or tensor")
            if recv[4] < send[3]:
                self.flag(f"message #{op_id}: received before it was sent")
            duration = costs.p2p_time(send[7], self.cluster.p2p_link(src, dst))
            if not _close(send[4] - send[3], duration):
                self.flag(f"message #{op_id} from rank {src} to {dst}: lasted {(send[4] - send[3]) * 1e6:.3f} us, "
                          f"the cost model gives {duration * 1e6:.3f} us")

    def one_at_a_time(self, events: list[tuple], what: str) -> None:
        """Ops of one stream may not overlap."""
        streams: dict[Any, list[tuple]] = defaultdict(list)
        for e in events:
            streams[e[0] if what != "p2p channel" else (e[9], e[1])].append(e)
        for key, ops in streams.items():
            ops.sort(key=lambda e: (e[3], e[4]))
            for a, b in zip(ops, ops[1:]):
                if b[3] < a[4] - ABS - REL * a[4]:
                    where = f"rank {key}" if what != "p2p channel" else f"channel {key[0]}"
                    self.flag(f"{where}: {b[1]}(layer {b[5]}) starts at {b[3] * 1e3:.3f} ms while "
                              f"{a[1]}(layer {a[5]}) runs until {a[4] * 1e3:.3f} ms on the {what} stream")
                    break

    # ---- work and data flow ------------------------------------------------------------------

    def work(self, compute: list[tuple], tps: list[int], comms: list[tuple]) -> None:
        layers = self.workload.num_layers
        done: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0])  # (kind, layer) -> [n/tp, union]
        forwards: dict[tuple[int, int, int], float] = {}
        inputs_done: dict[tuple[int, int, int], float] = {}
        for e, tp in zip(compute, tps):
            rank, op, layer, samples = e[0], e[1], e[5], e[6]
            if op == "update" or not tp:
                continue
            share = samples.bit_count() / tp
            kinds = {"forward": ["F"], "backward": ["B", "W"], "backward_input": ["B"], "backward_weight": ["W"],
                     "loss": ["loss"]}[op]
            for kind in kinds:
                if e[11] == "recompute":
                    continue
                acc = done[(kind, layer)]
                acc[0] += share
                acc[1] |= samples
            key = (rank, layer, samples)
            if op == "forward":
                forwards[key] = min(forwards.get(key, math.inf), e[4])
            elif op in ("backward", "backward_input"):
                if forwards.get(key, math.inf) > e[3] + ABS:
                    self.flag(f"rank {rank} {op}(layer {layer}) of samples {describe_mask(samples)} at "
                              f"{e[3] * 1e3:.3f} ms has no earlier forward of those samples on that rank")
                inputs_done[key] = min(inputs_done.get(key, math.inf), e[4])
            elif op == "backward_weight" and inputs_done.get(key, math.inf) > e[3] + ABS:
                self.flag(f"rank {rank} backward_weight(layer {layer}) at {e[3] * 1e3:.3f} ms has no earlier "
                          f"backward_input of samples {describe_mask(samples)}")
        wanted = [(k, layer) for layer in range(layers) for k in ("F", "B", "W")] + [("loss", layers)]
        names = {"F": "forward", "B": "input-gradient backward", "W": "weight-gradient backward", "loss": "loss"}
        for key in wanted:
            share, union = done.get(key, (0.0, 0))
            if union != self.full or share < self.gb * (1 - 1e-9):
                missing = describe_mask(self.full & ~int(union))
                self.flag(f"layer {key[1]}: the log shows {names[key[0]]} work for {share:g} of {self.gb} samples "
                          f"(missing {missing}): work was skipped or its events removed")
        self._gradients(compute, comms)

    def _gradients(self, compute: list[tuple], comms: list[tuple]) -> None:
        """Every update must be fed, before it starts, by gradients for the whole batch that the log shows
        computed on that rank or arriving there."""
        sources: dict[tuple[int, int], list[tuple[float, int]]] = defaultdict(list)
        for e in compute:
            if e[1] in ("backward", "backward_weight"):
                sources[(e[0], e[5])].append((e[4], e[6]))
        for e in comms:
            if e[11].startswith("weight_grad") and e[1] != "send":
                sources[(e[0], e[5])].append((e[4], e[6]))
        updated = set()
        for e in compute:
            if e[1] != "update":
                continue
            rank, layer, start = e[0], e[5], e[3]
            updated.add(layer)
            have = 0
            for end, samples in sources.get((rank, layer), ()):
                if end <= start + ABS:
                    have |= samples
            if e[6] != self.full or have != self.full:
                self.flag(f"rank {rank} update(layer {layer}) at {start * 1e3:.3f} ms: the log shows gradients of "
                          f"samples {describe_mask(have)} reaching it; it claims {describe_mask(e[6])}")
        for layer in range(self.workload.num_layers):
            if layer not in updated:
                self.flag(f"layer {layer}: the log has no update")

    # ---- memory ------------------------------------------------------------------------------

    def memory(self, compute: list[tuple], tps: list[int]) -> tuple[list[int], list[dict[str, int]], list]:
        peaks, at_peak, timelines = [], [], []
        logs, times_all = self.p.get("memory_log", []), self.p.get("timelines", [])
        if len(logs) != self.world or len(times_all) != self.world:
            self.flag("the memory log does not cover every rank")
            return [0] * self.world, [{} for _ in range(self.world)], [([], []) for _ in range(self.world)]
        made: dict[tuple[int, float, int, int], int] = {}  # (rank, time, kind, bytes) -> live after it
        for rank in range(self.world):
            deltas, ids, kinds = logs[rank]
            times = times_all[rank][0]
            if not (len(deltas) == len(ids) == len(kinds) == len(times)):
                self.flag(f"rank {rank}: the memory log and timeline disagree in length")
                deltas, ids, kinds, times = [], [], [], []
            live, peak, by_kind, best = 0, 0, dict.fromkeys(KINDS, 0), dict.fromkeys(KINDS, 0)
            open_buffers: dict[int, int] = {}
            values, last = [], 0.0
            for t, d, i, k in zip(times, deltas, ids, kinds):
                kind = KINDS[k] if 0 <= k < len(KINDS) else "?"
                if t < last - ABS:
                    self.flag(f"rank {rank}: memory is allocated or freed at {t * 1e3:.3f} ms after "
                              f"{last * 1e3:.3f} ms: the rank's clock went backwards")
                    last = t
                last = max(last, t)
                if d > 0 or (d == 0 and i not in open_buffers):
                    if i < 0:
                        self.flag(f"rank {rank}: an allocation of {d} bytes at {t * 1e3:.3f} ms is not a "
                                  f"fresh buffer")
                    open_buffers[i] = d
                    made[(rank, t, k, d)] = live + d
                else:
                    if open_buffers.pop(i, None) != -d:
                        self.flag(f"rank {rank}: {-d} bytes of {kind} freed at {t * 1e3:.3f} ms that no "
                                  f"buffer of that size held (a tensor was hidden from memory accounting)")
                live += d
                by_kind[kind] = by_kind.get(kind, 0) + d
                values.append(live)
                if live > peak:
                    peak, best = live, dict(by_kind)
            peaks.append(peak)
            at_peak.append(best)
            timelines.append((list(times), values))
            claimed = self.p.get("memory_bytes", [None] * self.world)
            if rank < len(claimed) and claimed[rank] != peak:
                self.flag(f"rank {rank}: reported peak memory {claimed[rank]} bytes, the allocation log gives {peak}")
        self._buffers_made(compute, tps, made)
        return peaks, at_peak, timelines

    def _buffers_made(self, compute: list[tuple], tps: list[int], made: dict) -> None:
        w = self.workload
        act, grad_kind, act_grad = KINDS.index("activation"), KINDS.index("weight_grad"), \
            KINDS.index("activation_grad")
        for e, tp in zip(compute, tps):
            rank, op, end, layer, n = e[0], e[1], e[4], e[5], e[6].bit_count()
            if not tp or op == "update":
                continue
            need = []
            if op == "forward":
                need.append((act, n * w.activation_bytes()))
            if op in ("backward", "backward_input", "loss"):
                need.append((act_grad, n * w.activation_bytes()))
            if op in ("backward", "backward_weight"):
                need.append((grad_kind, int(w.layer_params(layer) / tp * WEIGHT_BYTES * w.grad_bytes_per_element
                                            / w.bytes_per_element)))
            for kind, nbytes in need:
                live = made.get((rank, end, kind, nbytes))
                if live is None:
                    self.flag(f"rank {rank} {op}(layer {layer}) at {end * 1e3:.3f} ms: the {KINDS[kind]} it "
                              f"creates ({nbytes} bytes) is missing from the memory log")
                    return
                if op == "forward" and live < w.layer_params(layer) / tp * WEIGHT_BYTES * 0.99:
                    self.flag(f"rank {rank} forward(layer {layer}) at {end * 1e3:.3f} ms: only {live} bytes live, "
                              f"less than the layer's weights")
                    return


def verify(payload: dict[str, Any], cluster: Cluster, workload: Workload, global_batch: int,
           options: dict[str, Any] | None = None) -> Verified:
    """Re-derive a run from the worker's untrusted `payload`; see the module docstring."""
    c = _Checker(payload, cluster, workload, global_batch)
    events = c.events()
    compute = [e for e in events if e[2] == "compute"]
    collective = [e for e in events if e[2] == "collective"]
    p2p = [e for e in events if e[2] == "p2p"]
    if len(events) != len(compute) + len(collective) + len(p2p):
        c.flag("the log has events on streams the simulator does not have")
    tps = [c.compute(e) for e in compute]
    c.collectives(collective)
    c.messages(p2p)
    c.one_at_a_time(compute, "compute")
    c.one_at_a_time(collective, "collective")
    c.one_at_a_time(p2p, "p2p channel")
    c.work(compute, tps, collective + p2p)
    peaks, at_peak, timelines = c.memory(compute, tps)
    time_s = max((e[4] for e in events), default=0.0)
    if not _close(float(payload.get("time_s", -1)), time_s):
        c.flag(f"reported step time {payload.get('time_s')} s, the event log ends at {time_s} s")
    finals = []
    for f in payload.get("final_weights", []):
        rank, layer, step, samples, shards, num_shards, tp_rank, tp_size = (int(x) for x in f)
        if not 0 <= layer < workload.num_layers:
            c.flag(f"rank {rank} handed in a weight of layer {layer}, which does not exist")
            continue
        finals.append((rank, layer, step, samples, shards, num_shards, tp_rank, tp_size))
    problems = check_final_weights(finals, workload.num_layers, global_batch)
    if bool(payload.get("correct")) != (not problems) and not c.integrity:
        c.flag("the run reported itself " + ("correct" if payload.get("correct") else "incorrect") +
               " but its hand-ins say otherwise")
    rank_times = [0.0] * cluster.world_size
    for e in events:
        rank_times[e[0]] = max(rank_times[e[0]], e[4])
    result = Result(cluster=cluster, workload=workload, global_batch_size=global_batch, options=dict(options or {}),
                    time_s=time_s, rank_times=rank_times, memory_bytes=peaks, memory_by_kind=at_peak,
                    model_flops=workload.model_flops_per_sample() * global_batch,
                    hardware_flops=sum(e[8] for e in compute), correct=not problems, problems=problems,
                    raw_events=events, timelines=timelines, strategy=str(payload.get("strategy", "")))
    integrity = c.integrity[:MAX_REPORTED]
    if len(c.integrity) > MAX_REPORTED:
        integrity.append(f"... and {len(c.integrity) - MAX_REPORTED} more")
    return Verified(integrity, problems, result)
