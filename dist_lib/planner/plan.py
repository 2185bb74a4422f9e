"""A plan is data: the pipeline stages (which ranks, their own data- and tensor-parallel degrees, their
layer blocks, each replica's share of every microbatch), the microbatches, the schedule, the recompute
mode and the ZeRO stage. One strategy (`strategies/planned.py`) runs any valid plan; the planner
searches them and writes the winner as JSON.

Per-stage (dp, tp) and uneven shares follow Metis (Um et al., ATC'24, sec. 4): every stage runs every
microbatch, cut among its replicas by `shares`; where two neighbouring stages cut it differently, the
activations are split and joined by samples on the way (`Model.split_samples`, `Model.join_samples`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dist_lib.errors import SpecError
from dist_lib.specs import shown
from dist_lib.workload import per_op_checkpoint as per_op

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero-bubble")
# "selective": Megatron-LM's attention-core recompute (Korthikanti et al. 2022); "op": torchtitan's per-op
# selective activation checkpointing (`workload/per_op_checkpoint.py`), which runs through hybrid only
RECOMPUTE = ("none", "selective", "full", "op")
ZERO_STAGES = (0, 1, 3)  # 3: FSDP (torchtitan's data_parallel_shard_degree; hybrid's fsdp)
# "" (16-bit GEMMs) or an FP8 scaling recipe for the linear layers' GEMMs (`costs.fp8.RECIPES`)
FP8_CHOICES = ("", "delayed", "tensorwise", "rowwise")


@dataclass(frozen=True, slots=True)
class Stage:
    """One pipeline stage: `ranks` hold `dp = len(ranks) / tp` replicas of `tp` consecutive ranks each;
    `blocks` are its layer ranges (start, stop), one per model chunk; replica r takes `shares[r]` samples
    of every microbatch, in replica order."""

    ranks: tuple[int, ...]
    tp: int
    blocks: tuple[tuple[int, int], ...]
    shares: tuple[int, ...]

    @property
    def dp(self) -> int:
        return len(self.ranks) // self.tp

    def replica_ranks(self, replica: int) -> tuple[int, ...]:
        return self.ranks[replica * self.tp:(replica + 1) * self.tp]

    def offsets(self) -> list[int]:
        """First sample of each replica's slice within a microbatch."""
        out, total = [], 0
        for share in self.shares:
            out.append(total)
            total += share
        return out

    @property
    def layers(self) -> int:
        return sum(stop - start for start, stop in self.blocks)


@dataclass(frozen=True, slots=True)
class Plan:
    stages: tuple[Stage, ...]
    microbatch_size: int  # samples of one microbatch, over all replicas of a stage
    microbatches: int
    schedule: str = "1f1b"
    recompute: str = "none"
    zero: int = 0  # 1: each stage's optimizer state sharded over its replicas (Rajbhandari et al. 2020); 3: FSDP
    # the linear layers' GEMMs in FP8 with this scaling recipe ("delayed", "tensorwise", "rowwise"; `costs.fp8`), or ""
    fp8: str = ""
    # expert parallelism of a mixture-of-experts workload: each stage's replicas form EP groups of `ep`
    # consecutive replicas, each holding E/ep routed experts (`strategies/_expert_stage.py`); 1: every replica
    # holds every expert
    ep: int = 1
    # context parallelism: each stage's ranks are dp x cp x tp, TP fastest, then CP, then DP (Megatron-Core's
    # order); a CP group's cp ranks hold s/cp tokens of their replica's samples (`strategies/_context.py`), and
    # `shares` has one entry per replica (dp of them)
    cp: int = 1
    # expert tensor parallelism of an MoE plan with TP: each EP position's experts split over `etp` consecutive
    # ranks (Megatron-Core's `--expert-tensor-parallel-size`); 0: not set, the TP degree (Megatron-Core's
    # default), as every plan without experts or TP has it
    etp: int = 0
    # HSDP (zero 3 only): each stage's dp replicas in `replicate` groups of dp / replicate consecutive ones, FSDP
    # sharding inside a group and the shards' gradients all-reduced across the groups (torchtitan's
    # data_parallel_replicate_degree beside data_parallel_shard_degree; hybrid's `replicate`); 1: FSDP over them all
    replicate: int = 1
    # the hardware the plan was made for: (node, device, first rank, last rank) of each node (`hardware.py`);
    # None: not recorded (then any cluster of the right size runs it). Not part of the plan's identity.
    hardware: tuple[tuple[int, str, int, int], ...] | None = field(default=None, compare=False)

    @property
    def chunks(self) -> int:
        return len(self.stages[0].blocks)

    @property
    def global_batch_size(self) -> int:
        return self.microbatch_size * self.microbatches

    @property
    def ranks(self) -> list[int]:
        return [r for stage in self.stages for r in stage.ranks]

    def describe(self) -> str:
        """One line: each stage as dp x tp and its layer count, then the microbatching and options."""
        stages = "+".join(f"{len(s.shares)}x{s.tp}:{s.layers}L" for s in self.stages)
        extra = "".join(f" {k}={v}" for k, v in (("recompute", self.recompute), ("zero", self.zero),
                                                 ("fp8", self.fp8)) if v not in ("none", 0, ""))
        extra += "".join(f" {k}={v}" for k, v in (("ep", self.ep), ("cp", self.cp)) if v != 1)
        extra += f" etp={self.etp}" if self.etp else ""
        extra += f" replicate={self.replicate}" if self.replicate != 1 else ""
        return f"{stages}  {self.microbatches}x{self.microbatch_size} {self.schedule}{extra}"

    # ---- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.fp8:  # 16-bit: the field left out, so files read the same as before it existed
            del data["fp8"]
        for name in ("ep", "cp", "replicate"):  # likewise without expert or context parallelism or HSDP
            if getattr(self, name) == 1:
                del data[name]
        if not self.etp:
            del data["etp"]
        if self.hardware is None:
            del data["hardware"]
        else:
            data["hardware"] = [list(entry) for entry in self.hardware]
        data["stages"] = list(data["stages"])
        for stage in data["stages"]:
            stage["ranks"], stage["shares"] = list(stage["ranks"]), list(stage["shares"])
            stage["blocks"] = [list(b) for b in stage["blocks"]]
        return data

    def save(self, path: str | Path) -> None:
        """JSON with one line per stage."""
        data = self.to_dict()
        stages = ",\n".join("  " + json.dumps(stage) for stage in data.pop("stages"))
        hardware = data.pop("hardware", None)
        rest = "".join(f',\n {json.dumps(k)}: {json.dumps(v)}' for k, v in data.items())
        if hardware is not None:  # one line a node
            rest += ',\n "hardware": [\n' + ",\n".join("  " + json.dumps(e) for e in hardware) + "\n ]"
        Path(path).write_text(f'{{\n "stages": [\n{stages}\n ]{rest}\n}}\n')

    @classmethod
    def from_dict(cls, data: Any, source: str = "<plan>") -> Plan:
        if not isinstance(data, dict):
            raise SpecError(f"{source}: a plan is a JSON object, got {type(data).__name__}")
        unknown = set(data) - {"stages", "microbatch_size", "microbatches", "schedule", "recompute", "zero", "fp8",
                                   "ep", "cp", "etp", "replicate", "hardware"}
        if unknown:
            raise SpecError(f"{source}: unknown field(s) {', '.join(sorted(unknown))}")
        missing = [name for name in ("stages", "microbatch_size", "microbatches") if name not in data]
        if missing:  # (schedule, recompute, zero, fp8, ep and cp have defaults)
            raise SpecError(f"{source}: missing field(s) {', '.join(missing)}")
        stages = data.get("stages")
        if not isinstance(stages, list) or not stages:
            raise SpecError(f"{source}: field stages must be a non-empty list")
        built = []
        for i, stage in enumerate(stages):
            where = f"{source}: stages[{i}]"
            if not isinstance(stage, dict) or set(stage) != {"ranks", "tp", "blocks", "shares"}:
                raise SpecError(f"{where} must be an object with ranks, tp, blocks and shares")
            ranks = _ints(stage["ranks"], f"{where}.ranks", 0)
            blocks = stage["blocks"]
            if not isinstance(blocks, list) or not blocks or any(
                    not isinstance(b, list) or len(b) != 2 for b in blocks):
                raise SpecError(f"{where}.blocks must list [start, stop] layer ranges, got {blocks!r}")
            built.append(Stage(tuple(ranks), _int(stage["tp"], f"{where}.tp", 1),
                               tuple(tuple(_ints(b, f"{where}.blocks", 0)) for b in blocks),
                               tuple(_ints(stage["shares"], f"{where}.shares", 1))))
        return cls(tuple(built), _int(data.get("microbatch_size"), f"{source}: microbatch_size", 1),
                   _int(data.get("microbatches"), f"{source}: microbatches", 1), data.get("schedule", "1f1b"),
                   data.get("recompute", "none"), _int(data.get("zero", 0), f"{source}: zero", 0),
                   data.get("fp8", ""), _int(data.get("ep", 1), f"{source}: ep", 1),
                   _int(data.get("cp", 1), f"{source}: cp", 1), _int(data.get("etp", 0), f"{source}: etp", 0),
                   _int(data.get("replicate", 1), f"{source}: replicate", 1),
                   hardware=_hardware(data.get("hardware"), f"{source}: hardware"))

    @classmethod
    def load(cls, plan: Plan | dict | str | Path) -> Plan:
        """A plan from a `Plan`, its dict, or a JSON file path."""
        if isinstance(plan, Plan):
            return plan
        if isinstance(plan, dict):
            return cls.from_dict(plan)
        if not isinstance(plan, (str, Path)):
            raise SpecError(f"plan must be a Plan, its dict or the path of a plan file, got {shown(plan)}")
        if not str(plan).strip():
            raise SpecError("plan: empty; give the path of a plan file (python -m grader plan --out writes one)")
        path = Path(plan)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise SpecError(f"plan file {path}: cannot be read ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            raise SpecError(f"plan file {path}: not UTF-8 text (byte {exc.start})") from None
        except json.JSONDecodeError as exc:
            raise SpecError(f"plan file {path}: not JSON ({exc.msg} at line {exc.lineno})") from None
        except RecursionError:
            raise SpecError(f"plan file {path}: not a plan (lists or objects nested too deep)") from None
        except ValueError:  # json reads whole numbers through int(), which refuses over 4300 digits
            raise SpecError(f"plan file {path}: not a plan (a whole number of more than "
                            f"{sys.get_int_max_str_digits()} digits)") from None
        return cls.from_dict(data, f"plan file {path}")

    # ---- validation ---------------------------------------------------------------------------

    def _foreign(self, cluster: Any) -> bool:
        """Whether the plan recorded hardware that `cluster` is not (node by node)."""
        if not self.hardware:
            return False
        from dist_lib.planner.hardware import mismatch
        return bool(mismatch(self.hardware, cluster))

    def _check_types(self, source: str) -> None:
        """What `from_dict` checks of a file, for a `Plan` built in Python: whole numbers where the plan
        counts ranks, layers and samples (a share of 0 or a tp of "2" would fail deep inside the run)."""
        if not isinstance(self.stages, (list, tuple)) or not self.stages:
            raise SpecError(f"{source}: stages must be a non-empty list of Stage, got {self.stages!r}")
        for i, stage in enumerate(self.stages):
            where = f"{source}: stages[{i}]"
            if not isinstance(stage, Stage):
                raise SpecError(f"{where} must be a Stage, got {type(stage).__name__}")
            _ints(stage.ranks, f"{where}.ranks", 0)
            _int(stage.tp, f"{where}.tp", 1)
            if not isinstance(stage.blocks, (list, tuple)) or not stage.blocks or any(
                    not isinstance(b, (list, tuple)) or len(b) != 2 for b in stage.blocks):
                raise SpecError(f"{where}.blocks must list (start, stop) layer ranges, got {stage.blocks!r}")
            for block in stage.blocks:
                _ints(block, f"{where}.blocks", 0)
            _ints(stage.shares, f"{where}.shares", 1)
        _int(self.microbatch_size, f"{source}: microbatch_size", 1)
        _int(self.microbatches, f"{source}: microbatches", 1)
        _int(self.ep, f"{source}: ep", 1)
        _int(self.cp, f"{source}: cp", 1)
        _int(self.etp, f"{source}: etp", 0)
        _int(self.replicate, f"{source}: replicate", 1)

    def check(self, world_size: int, num_layers: int, global_batch_size: int, cluster: Any = None,
              source: str = "plan", workload: Any = None) -> None:
        """Raise `SpecError` naming the field (after `source`, e.g. the plan's file) when this plan cannot
        run on the world, model and batch (and, given the workload, split its attention heads)."""
        self._check_types(source)
        if cluster is not None and self._foreign(cluster):
            from dist_lib.planner.hardware import mismatch
            raise SpecError(f"{source}: made for other hardware: {mismatch(self.hardware, cluster)}; plan on this "
                            f"cluster again, or run it with `python -m grader run planned --set plan=FILE`, which "
                            f"remaps a plan whose nodes the cluster lists in another order")
        if self.schedule not in SCHEDULES:
            raise SpecError(f"{source}: schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.recompute not in RECOMPUTE:
            raise SpecError(f"{source}: recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if isinstance(self.zero, bool) or not isinstance(self.zero, int) or self.zero not in ZERO_STAGES:
            raise SpecError(f"{source}: zero must be 0, 1 or 3, got {self.zero!r}")
        if self.fp8.__class__ is not str or self.fp8 not in FP8_CHOICES:
            raise SpecError(f"{source}: fp8 must be one of {', '.join(map(repr, FP8_CHOICES))} ('': 16-bit GEMMs), "
                            f"got {self.fp8!r}")
        if self.global_batch_size != global_batch_size:
            raise SpecError(f"{source}: microbatch_size {self.microbatch_size} x microbatches {self.microbatches} = "
                            f"{self.global_batch_size}, but the global batch is {global_batch_size}")
        self._check_experts(source, workload)
        self._check_per_op(source, workload)
        seen: set[int] = set()
        for i, stage in enumerate(self.stages):
            where = f"{source}: stages[{i}]"
            if stage.tp < 1 or len(stage.ranks) % stage.tp:
                raise SpecError(f"{where}: tp={stage.tp} does not divide its {len(stage.ranks)} ranks")
            if workload is not None and workload.tp_problem(stage.tp):
                raise SpecError(f"{where}: {workload.tp_problem(stage.tp)}")
            for r in stage.ranks:
                if not 0 <= r < world_size:
                    raise SpecError(f"{where}.ranks: rank {r} is not in the cluster's 0..{world_size - 1}")
                if r in seen:
                    raise SpecError(f"{where}.ranks: rank {r} is in two places")
                seen.add(r)
            if len(stage.ranks) % (stage.tp * self.cp):
                raise SpecError(f"{where}: cp={self.cp} x tp={stage.tp} does not divide its {len(stage.ranks)} ranks")
            dp = len(stage.ranks) // (stage.tp * self.cp)
            if self.replicate != 1 and (self.zero != 3 or dp % self.replicate):
                raise SpecError(f"{where}: replicate={self.replicate} (HSDP) needs zero=3 (FSDP) and replicate groups "
                                f"that divide its dp={dp} replicas")
            if len(stage.shares) != dp or sum(stage.shares) != self.microbatch_size:
                raise SpecError(f"{where}.shares: {list(stage.shares)} must give each of its dp={dp} "
                                f"replicas >= 1 sample, {self.microbatch_size} in all (the microbatch size)")
            if len(stage.blocks) != self.chunks:
                raise SpecError(f"{where}.blocks: every stage needs {self.chunks} block(s), one per chunk")
            if cluster is not None and stage.tp > 1 and not self._foreign(cluster):
                for d in range(stage.dp):
                    nodes = {cluster.node_of(r) for r in stage.replica_ranks(d)}
                    if len(nodes) > 1:
                        raise SpecError(f"{where}: the TP group {list(stage.replica_ranks(d))} spans nodes "
                                        f"{sorted(nodes)}; keep each TP group in one node")
        order = [block for c in range(self.chunks) for block in (s.blocks[c] for s in self.stages)]
        start = 0
        for block in order:
            if block[0] != start or block[1] <= block[0]:
                raise SpecError(f"{source}: blocks {[list(b) for b in order]} (chunk-major) must tile layers "
                                f"0..{num_layers - 1} in order, each non-empty")
            start = block[1]
        if start != num_layers:
            raise SpecError(f"{source}: blocks cover {start} layers but the model has {num_layers}")
        if self.schedule == "interleaved" and (self.chunks < 2 or self.microbatches % len(self.stages)):
            raise SpecError(f"{source}: interleaved needs >= 2 blocks per stage and microbatches a multiple of "
                            f"the {len(self.stages)} stages")
        if self.schedule != "interleaved" and self.chunks != 1:
            raise SpecError(f"{source}: schedule {self.schedule} runs one block per stage; use interleaved")
        if self.fp8 and cluster is not None and not self._foreign(cluster):
            lacking = sorted({cluster.device_of(r).name for r in self.ranks if not cluster.device_of(r).fp8_flops})
            if lacking:
                raise SpecError(f"{source}: fp8 {self.fp8!r}, but {', '.join(lacking)} has no FP8 tensor cores; "
                                f"plan without fp8")


    def _check_per_op(self, source: str, workload: Any) -> None:
        """recompute 'op' on what hybrid models it for (`strategies/_plan.check_per_op`): a dense Llama block as
        torchtitan builds it, timed by formula, without context parallelism."""
        if self.recompute != "op" or workload is None:
            return
        why = per_op.workload_problem(workload)
        if why:
            raise SpecError(f"{source}: recompute 'op' (torchtitan's per-op selective activation checkpointing) is "
                            f"modelled for a Llama block as torchtitan builds it; workload {workload.name}: {why}")

    def _check_experts(self, source: str, workload: Any) -> None:
        """An MoE plan as `hybrid` runs it (Megatron-Core's expert grid, `strategies/_expert_stage.py`): ep x etp
        divides every stage's dp x tp ranks, `ep` the experts, `etp` the experts' width; no FSDP or zero-bubble
        schedule; `ep` and `etp` only with experts."""
        if self.cp != 1 and (self.recompute == "op" or self.schedule == "zero-bubble"
                             or workload is not None and (workload.moe is not None or workload.profile is not None)
                             or workload is not None and workload.seq_len % (2 * self.cp)):
            raise SpecError(f"{source}: cp={self.cp} runs a dense workload timed by formula, its sequence cut into "
                            f"2 x cp chunks, without per-op recompute and the zero-bubble schedule (hybrid's "
                            f"context-parallel stage, strategies/_context.py)")
        moe = getattr(workload, "moe", None) if workload is not None else None
        if moe is None:
            for name, value, plain in (("ep", self.ep, 1), ("etp", self.etp, 0)):
                if value != plain and workload is not None:
                    raise SpecError(f"{source}: {name}={value}, but workload {workload.name} has no experts ({name} "
                                    f"is for mixtures of experts; leave it out)")
            return
        for i, stage in enumerate(self.stages):
            etp = self.etp or stage.tp
            if len(stage.ranks) % (self.ep * etp) or moe.expert_ffn_hidden % etp:
                raise SpecError(f"{source}: stages[{i}]: ep={self.ep} x etp={etp} must divide its dp x tp = "
                                f"{len(stage.ranks)} ranks, and etp the experts' width {moe.expert_ffn_hidden}")
        if moe.experts % self.ep:
            raise SpecError(f"{source}: ep={self.ep} does not divide the {moe.experts} experts")
        if self.zero == 3 or self.schedule == "zero-bubble":
            raise SpecError(f"{source}: an MoE plan runs without zero=3 (FSDP) and the zero-bubble schedule "
                            f"(hybrid's expert stage does not shard the experts' weights and runs whole backwards)")


def _hardware(value: Any, where: str) -> tuple[tuple[int, str, int, int], ...] | None:
    """A plan file's `hardware`: None, or [node, device, first rank, last rank] of each node."""
    if value is None:
        return None
    if not isinstance(value, list) or not value or any(
            not isinstance(e, list) or len(e) != 4 or not isinstance(e[1], str) for e in value):
        raise SpecError(f"{where} must list [node, device, first rank, last rank] of each node, got {shown(value)}")
    return tuple((_int(e[0], where, 0), e[1], _int(e[2], where, 0), _int(e[3], where, 0)) for e in value)


def _int(value: Any, where: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SpecError(f"{where} must be a whole number >= {low}, got {value!r}")
    return value


def _ints(value: Any, where: str, low: int) -> list[int]:
    if not isinstance(value, (list, tuple)) or not value:
        raise SpecError(f"{where} must be a non-empty list of whole numbers, got {value!r}")
    return [_int(v, where, low) for v in value]
