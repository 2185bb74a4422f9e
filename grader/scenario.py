"""A scenario: one cluster, one workload, one global batch and the options a strategy runs with.

Scenarios travel between processes as plain JSON (the worker that runs untrusted code gets one, the
parent rebuilds the `Cluster` and `Workload` from it itself and never trusts the worker's copy).
"""

from __future__ import annotations

import os
import sys
import tomllib
from dataclasses import asdict, dataclass, field
from typing import Any

from dist_lib import Cluster, SpecError, Workload
from dist_lib.run.simulator import DEFAULT_CLUSTER, DEFAULT_GLOBAL_BATCH, DEFAULT_WORKLOAD
from dist_lib.specs import absolute_spec
from dist_lib.workload.transformer import check_global_batch

from .errors import InputError


@dataclass(frozen=True)
class Scenario:
    name: str = "default"
    cluster: str = DEFAULT_CLUSTER
    workload: str = DEFAULT_WORKLOAD
    global_batch: int = DEFAULT_GLOBAL_BATCH
    options: dict[str, Any] = field(default_factory=dict)
    # per-strategy option overrides, keyed by the strategy file's stem (suites only)
    strategy_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    # True: an option the strategy does not take is an error (`run`); False: it is dropped (suites,
    # where one scenario serves strategies with different options)
    strict_options: bool = True
    memory_limit_bytes: float | None = None  # per rank; above it the run fails (suites)
    enforce_memory: bool = True
    # the runtime reserve (`dist_lib.hardware.reserve`) as a dict, or None: tensors may fill each GPU (suites)
    memory_reserve: dict[str, Any] | None = None
    # which of cluster, workload and batch the user named: a puzzles or lab file sets up its own ranks
    # and model, so only those are passed on to it
    given: tuple[str, ...] = ("cluster", "workload", "batch")

    def __post_init__(self) -> None:
        # Files a spec names are found from the working directory of whoever made the scenario: the
        # worker that runs it sits in a scratch folder of its own.
        for key in ("cluster", "workload"):
            if isinstance(getattr(self, key), str):
                object.__setattr__(self, key, absolute_spec(getattr(self, key)))
        # A plan file (`--set plan=plan.json`) is read here, in the grader, and goes to the worker as data:
        # the sandbox's user may not reach the file (a private /tmp, a 0700 home folder). It is checked
        # against the run here too, where a mistake can still name the file.
        if isinstance(self.options.get("plan"), str):
            from dist_lib.planner.hardware import fit_to
            from dist_lib.planner.plan import Plan
            path = os.path.expanduser(self.options["plan"])
            cluster, workload = self.load()
            try:
                plan = Plan.load(path)
                plan, note = fit_to(plan, cluster, f"plan file {path}")
                if note:
                    print(f"note: {note}", file=sys.stderr)
                plan.check(cluster.world_size, workload.num_layers, self.global_batch, cluster,
                           source=f"plan file {path}", workload=workload)
            except SpecError as exc:
                raise InputError(str(exc)) from None
            object.__setattr__(self, "options", {**self.options, "plan": plan.to_dict()})

    def options_for(self, strategy_stem: str) -> dict[str, Any]:
        return {**self.options, **self.strategy_options.get(strategy_stem, {})}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scenario:
        data = dict(data)
        if "given" in data:
            data["given"] = tuple(data["given"])
        return cls(**data)

    def load(self) -> tuple[Cluster, Workload]:
        """The cluster and workload, or an `InputError` naming the bad spec."""
        try:  # each message names the spec or file and the field
            cluster, workload = Cluster.load(self.cluster), Workload.load(self.workload)
            check_global_batch(self.global_batch, "global batch")
        except SpecError as exc:
            raise InputError(str(exc)) from None
        return cluster, workload


def parse_set(items: list[str] | None) -> dict[str, Any]:
    """`--set key=value` pairs; values are read as TOML literals (4, 2.5, true, "x"), else as text."""
    options: dict[str, Any] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise InputError(f"--set {item!r}: expected key=value with a Python identifier as key")
        if key in options:
            raise InputError(f"--set {key} is given twice")
        try:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = text.strip()
        options[key] = value
    return options
