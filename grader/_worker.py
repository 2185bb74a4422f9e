"""The process that runs one untrusted strategy on one scenario: `python -m grader._worker JOB`.

It sets its resource limits, imports the strategy, simulates one step while recording the strategy's
decisions (`dist_lib.run.recording`), and writes two things to file descriptors the parent opened:

* the first of the job's two `fds`, a small JSON header: the status, and for a run that finished the
  length of each rank's program and the option names the strategy takes (or the error of a run that
  did not); a `--api` run's holds its recorded toy-API program instead (`dist_lib.compat.recording`);
* the second, the program itself: each rank's 8-byte words, one rank after the other.

Nothing it writes is trusted: the parent re-executes the program through the simulator (`replay`, or
`dist_lib.compat.replay` for a `--api` run) and reads only a failure's message as text; a `--api` run
whose calls could not be recorded hands back its figures, which the parent checks and marks unverified. Never pickle: the parent must not run anything shaped here.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path
from typing import Any



def _limit(job: dict[str, Any]) -> None:
    """rlimits for everything this process and its children do from here on (the strategy included)."""
    def cap(which: int, value: Any) -> None:
        if value:
            resource.setrlimit(which, (int(value), int(value)))
    cap(resource.RLIMIT_AS, job.get("address_space_bytes"))
    if job.get("timeout_s"):
        seconds = int(job["timeout_s"]) + 2  # backstop for the parent's wall-clock timeout
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
    cap(resource.RLIMIT_FSIZE, job.get("file_bytes"))
    cap(resource.RLIMIT_NOFILE, job.get("open_files"))
    cap(resource.RLIMIT_NPROC, job.get("processes"))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def execute(job: dict[str, Any]) -> dict[str, Any]:
    """The header of a finished run; its program goes to the job's second fd."""
    from dist_lib.run.recording import record
    from dist_lib.run.simulator import accepted_options, load_strategy
    scenario = job["scenario"]
    path = job["strategy"]
    options = {**scenario["options"], **scenario["strategy_options"].get(Path(path).stem, {})}
    if job.get("api"):
        return {"status": "ok", "compat": _run_compat(job, scenario, options)}
    train, _ = load_strategy(path)
    if not scenario["strict_options"]:
        accepted = accepted_options(train)  # a suite's shared options reach only the strategies that take them
        if accepted is not None:
            options = {k: v for k, v in options.items() if k in accepted}
    _, programs = record(train, scenario["cluster"], scenario["workload"], scenario["global_batch"],
                         enforce_memory=scenario["enforce_memory"],
                         memory_reserve=scenario.get("memory_reserve"), **options)
    size = 8 * sum(len(p) for p in programs)
    if job.get("file_bytes") and size > job["file_bytes"]:
        raise _TooLarge(f"the recorded program takes {size / 2**20:.1f} MiB, over the {job['file_bytes'] / 2**20:.0f} "
                        f"MiB a run may hand back (a step this long cannot be graded under these limits)")
    with os.fdopen(job["fds"][1], "wb", closefd=False) as out:
        for program in programs:
            out.write(program.tobytes())
    return {"status": "ok", "lengths": [len(p) for p in programs], "options": sorted(options)}


def _run_compat(job: dict[str, Any], scenario: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """A puzzles or lab file, run as `compat.run_file` runs it while its toy-API calls are recorded
    (`dist_lib.compat.recording`): {"program": ...}, which the parent re-executes, or, for a run the
    program cannot describe, {"unreplayable": why, "result": its figures}, which the parent takes as
    reported (and marks unverified)."""
    try:
        from dist_lib.compat.recording import record_file
    except ImportError:
        raise _BadInput("--api needs the puzzles/lab compatibility layer (dist_lib.compat), "
                        "which this installation does not have") from None
    given = scenario.get("given", ("cluster", "workload", "batch"))
    result, program, reason = record_file(
        job["strategy"], job["api"], function=job.get("function"),
        cluster=scenario["cluster"] if "cluster" in given else None,
        workload=scenario["workload"] if "workload" in given else None,
        global_batch_size=scenario["global_batch"] if "batch" in given else None,
        check=False, enforce_memory=scenario["enforce_memory"],
        **{**options, "exact_memory": True})  # the originals' sum, whatever the file does
    if program is not None:
        from grader.runner.isolation import HEADER_BYTES
        size = len(json.dumps(program))
        if size > HEADER_BYTES - 2**16:  # (room for the rest of the header)
            raise _TooLarge(f"the recorded program takes {size / 2**20:.1f} MiB, over the {HEADER_BYTES / 2**20:.0f} "
                            f"MiB a --api run may hand back (a step this long cannot be graded under these limits)")
        return {"program": program}
    return {"unreplayable": reason, "result": reported(result)}


def reported(result: Any) -> dict[str, Any]:
    """A `--api` run's figures as plain data (what `grader.compat_payload.compat_result` reads back)."""
    from dist_lib import Result
    if not isinstance(result, Result):
        raise RuntimeError(f"dist_lib.compat.run_file returned {type(result).__name__}, not a Result")
    return {"strategy": result.strategy, "options": result.options, "time_s": result.time_s,
            "rank_times": list(result.rank_times), "memory_bytes": list(result.memory_bytes),
            "model_flops": result.model_flops, "hardware_flops": result.hardware_flops,
            "correct": result.correct, "problems": list(result.problems),
            "events": [list(e[:9]) + [list(e[9]) if e[9] is not None else None, e[10], e[11]]
                       for e in result.raw_events],
            "timelines": [[list(t), list(v)] for t, v in result.timelines],
            "cluster": result.cluster.name,
            "workload": {f: getattr(result.workload, f) for f in ("name", "num_layers", "hidden", "heads", "seq_len",
                                                                   "vocab", "bytes_per_element")},
            "global_batch": result.global_batch_size}


class _BadInput(Exception):
    pass


class _TooLarge(Exception):
    pass


def main(job_path: str) -> int:
    worker = os.getpid()
    job = json.loads(Path(job_path).read_text())
    _limit(job)
    from dist_lib import SimulationError, SpecError
    from dist_lib.engine.waits import user_frame
    try:
        header = execute(job)
    except (SpecError, _BadInput) as exc:
        header = {"status": "bad_input", "kind": type(exc).__name__, "message": str(exc)}
    except (SimulationError, _TooLarge) as exc:
        header = {"status": "failed", "kind": type(exc).__name__.lstrip("_"), "message": str(exc)}
    except MemoryError:
        header = {"status": "failed", "kind": "MemoryError",
                  "message": f"the strategy exhausted the worker's address space limit "
                             f"({job.get('address_space_bytes', 0) / 2**30:.1f} GiB of real memory)"}
    except RecursionError as exc:
        header = {"status": "failed", "kind": "RecursionError", "message": f"{exc}{user_frame(exc)}"}
    except BaseException as exc:  # noqa: BLE001 - anything the submission throws is its failure
        header = {"status": "failed", "kind": type(exc).__name__, "message": f"{exc}{user_frame(exc)}"}
    if os.getpid() != worker:  # a process the strategy forked, come back up through the worker's frames
        os._exit(1)
    try:
        text = json.dumps(header)
    except (TypeError, ValueError) as exc:
        text = json.dumps({"status": "failed", "kind": "SerializationError",
                           "message": f"the run produced values that are not plain data ({exc})"})
    with os.fdopen(job["fds"][0], "wb", closefd=False) as out:
        out.write(text.encode())
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (and any atexit hook a submission registered)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
