"""The subprocess that runs one untrusted strategy on one scenario: `python -m grader._worker JOB OUT`.

It limits its own address space, imports the strategy, simulates one step and writes the raw event
log, the memory allocation log and the hand-in summary as JSON (never pickle: the parent must not
execute anything the submission could have shaped). The parent trusts none of it; see `verify.py`.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path
from typing import Any


def _limit(address_space_bytes: int | None, cpu_seconds: float | None) -> None:
    if address_space_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (int(address_space_bytes), int(address_space_bytes)))
    if cpu_seconds:
        seconds = int(cpu_seconds) + 2  # backstop for the parent's wall-clock timeout
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))


def execute(job: dict[str, Any]) -> Any:
    from dist_lib.simulator import accepted_options, check_options, load_strategy
    scenario = job["scenario"]
    path = job["strategy"]
    stem = Path(path).stem
    options = {**scenario["options"], **scenario["strategy_options"].get(stem, {})}
    common = dict(check=False, enforce_memory=scenario["enforce_memory"])
    if job.get("api"):
        try:
            from dist_lib import compat  # type: ignore[attr-defined]
        except ImportError:
            raise _BadInput("--api needs the puzzles/lab compatibility layer (dist_lib.compat), "
                            "which this installation does not have") from None
        given = scenario.get("given", ("cluster", "workload", "batch"))
        result = compat.run_file(path, api=job["api"], function=job.get("function"),
                                 cluster=scenario["cluster"] if "cluster" in given else None,
                                 workload=scenario["workload"] if "workload" in given else None,
                                 global_batch_size=scenario["global_batch"] if "batch" in given else None,
                                 **common, **options)
        from dist_lib import Result
        if not isinstance(result, Result):
            raise RuntimeError(f"dist_lib.compat.run_file returned {type(result).__name__}, not a Result")
        return result
    train, name = load_strategy(path)
    if not scenario["strict_options"]:
        accepted = accepted_options(train)  # a suite's shared options reach only the strategies that take them
        if accepted is not None:
            options = {k: v for k, v in options.items() if k in accepted}
    check_options(train, options, name)
    return _simulate_named(train, name, scenario, common, options)


def _simulate_named(train: Any, name: str, scenario: dict, common: dict, options: dict) -> Any:
    from dist_lib import simulate
    result = simulate(train, scenario["cluster"], scenario["workload"], scenario["global_batch"], **common, **options)
    result.strategy = name
    return result


class _BadInput(Exception):
    pass


def serialize(result: Any) -> dict[str, Any]:
    return {
        "strategy": result.strategy, "options": result.options, "time_s": result.time_s,
        "rank_times": list(result.rank_times), "memory_bytes": list(result.memory_bytes),
        "model_flops": result.model_flops, "hardware_flops": result.hardware_flops,
        "correct": result.correct, "problems": list(result.problems),
        "events": [list(e[:9]) + [list(e[9]) if e[9] is not None else None, e[10], e[11]]
                   for e in result.raw_events],
        "timelines": [[list(t), list(v)] for t, v in result.timelines],
        "memory_log": [[list(d), list(i), list(k)] for d, i, k in result.memory_log],
        "final_weights": [list(w) for w in result.final_weights],
        "cluster": result.cluster.name,
        "workload": {f: getattr(result.workload, f) for f in ("name", "num_layers", "hidden", "heads", "seq_len",
                                                               "vocab", "bytes_per_element")},
        "global_batch": result.global_batch_size,
    }


def main(job_path: str, out_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    _limit(job.get("address_space_bytes"), job.get("timeout_s"))
    from dist_lib import SimulationError, SpecError
    from dist_lib.engine import user_frame
    try:
        payload = {"status": "ok", "result": serialize(execute(job))}
    except (SpecError, _BadInput) as exc:
        payload = {"status": "bad_input", "kind": type(exc).__name__, "message": str(exc)}
    except SimulationError as exc:
        payload = {"status": "failed", "kind": type(exc).__name__, "message": str(exc)}
    except MemoryError:
        payload = {"status": "failed", "kind": "MemoryError",
                   "message": f"the strategy exhausted the worker's address space limit "
                              f"({job.get('address_space_bytes', 0) / 2**30:.1f} GiB of real memory)"}
    except RecursionError as exc:
        payload = {"status": "failed", "kind": "RecursionError", "message": f"{exc}{user_frame(exc)}"}
    except BaseException as exc:  # noqa: BLE001 - anything the submission throws is its failure
        payload = {"status": "failed", "kind": type(exc).__name__, "message": f"{exc}{user_frame(exc)}"}
    try:
        text = json.dumps(payload)
    except (TypeError, ValueError) as exc:
        text = json.dumps({"status": "failed", "kind": "SerializationError",
                           "message": f"the run produced values that are not plain data ({exc})"})
    Path(out_path).write_text(text)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (and any atexit hook a submission registered)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
