"""A grading job that carries its inputs and returns its outputs, so it can run on any machine.

The leaderboard's driver may be the only machine that holds the submissions and the output folder: a
Ray worker node shares no file system with it. So a `GradeJob` carries the submission's source, and
`grade_job` returns the row together with the files it made (the trace and its plots) as bytes,
which the driver writes with `save`. Paths in the row are the driver's, wherever the job ran, so a
board graded on Ray is the same, byte for byte, as one graded locally.
"""

from __future__ import annotations

import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputError
from .grade import grade_one
from .runner.isolation import rebase_paths


@dataclass(frozen=True, slots=True)
class GradeJob:
    submission: str  # the path on the driver
    source: bytes  # its contents when the board was planned (what the resume fingerprint covers)
    helpers: tuple[tuple[str, bytes], ...]  # the _*.py files beside it, which it may import, by name
    scenario: dict[str, Any]
    limits: dict[str, Any]
    trace: str | None  # where the driver keeps the trace
    plots: bool = True
    confine: bool = True  # run the submission in the OS sandbox of the machine the job runs on


@dataclass(frozen=True, slots=True)
class Graded:
    row: dict[str, Any]
    files: dict[str, bytes]  # path on the driver -> contents


def grade_job(job: GradeJob) -> Graded:
    """Grade `job` here; every file it writes is made in a private folder and returned as bytes."""
    if job.confine:
        _require_sandbox()
    with tempfile.TemporaryDirectory(prefix="grade-job-") as tmp:
        here = {}
        strategy = Path(job.submission)
        if not all(_holds(strategy.parent / name, data) for name, data in ((strategy.name, job.source), *job.helpers)):
            # not on this node (or changed since): run the shipped copies under the same file names (the
            # submission's name selects the suite's per-strategy options; the helpers' are imported)
            strategy = Path(tmp) / "src" / strategy.name
            strategy.parent.mkdir()
            strategy.write_bytes(job.source)
            for name, data in job.helpers:
                (strategy.parent / name).write_bytes(data)
            here[str(strategy.parent)] = str(Path(job.submission).parent)
        out = Path(tmp) / "out"
        out.mkdir()
        trace = str(out / Path(job.trace).name) if job.trace else None
        if job.trace:
            here[str(out)] = str(Path(job.trace).parent)
        row = grade_one(str(strategy), job.scenario, job.limits, trace, job.plots, confine=job.confine)
        files = {str(Path(here[str(out)]) / p.relative_to(out)): p.read_bytes()
                 for p in sorted(out.rglob("*")) if p.is_file()} if job.trace else {}
    return Graded(rebase_paths(row, here), files)


def _require_sandbox() -> None:
    """Refuse, in one line naming this machine, to run an untrusted submission where it cannot be confined
    (a Ray node set up without bubblewrap): every row of the board would be a crash."""
    from .runner import sandbox_problem
    problem = sandbox_problem()
    if problem:
        raise InputError(f"node {socket.gethostname()}: cannot confine untrusted submissions: {problem}; "
                         f"set up every node alike, or pass --trusted to run them unconfined")


def save(graded: Graded) -> dict[str, Any]:
    """Write the job's files on the driver; the row."""
    for path, data in graded.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)
    return graded.row


def _holds(path: Path, source: bytes) -> bool:
    try:
        return path.is_file() and path.read_bytes() == source
    except OSError:
        return False
