"""Jobs per second in this process, in a local process pool and on a local Ray instance, and what Ray
costs per job.

Two kinds of job: an empty one (returns its argument: all that is measured is the backend's own cost
per job) and a real leaderboard run (`grader.portable.grade_job`: the honest test submission on a small
scenario, in the sandbox when the machine has it, its trace shipped back as bytes). A backend's cost
per empty job is the slope between N and 2N empty jobs, and what is left of N jobs' time is its fixed
cost per call (a local pool starts its processes on every call, as a leaderboard run does; Ray keeps
its workers). Starting the local Ray instance is timed apart: a board pays it once.

    python benchmarks/ray_jobs.py [--workers 2] [--empty 2000] [--grades 8]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from grader.jobs import RAY_LOCAL, Backend, JobFailed, connect, import_ray, run_jobs
from grader.leaderboard import submission_files
from grader.portable import GradeJob, grade_job
from grader.runner import Limits, sandbox_problem
from grader.scenario import Scenario

ROOT = Path(__file__).resolve().parents[1]
SUBMISSION = ROOT / "tests" / "submissions" / "honest.py"
SCENARIO = Scenario(name="toy4", cluster="4xA100-80GB", workload="toy:layers=4", global_batch=8, strict_options=False)


def echo(item: int) -> int:
    return item


def grading_jobs(count: int, out: Path) -> list[GradeJob]:
    source, helpers = submission_files(SUBMISSION)
    limits = asdict(Limits(timeout_s=60))
    confine = sandbox_problem() is None
    return [GradeJob(str(SUBMISSION), source, helpers, SCENARIO.to_dict(), limits,
                     str(out / f"run{i}" / "toy4.json"), plots=False, confine=confine) for i in range(count)]


def timed(fn, items, backend: Backend) -> float:
    started = time.perf_counter()
    results = list(run_jobs(fn, items, backend))
    seconds = time.perf_counter() - started
    failed = [r for _, r in results if isinstance(r, JobFailed)]
    if failed or len(results) != len(items):
        raise SystemExit(f"{len(failed)} of {len(items)} jobs failed: {failed[:1]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="pool processes and Ray CPUs (default 2)")
    parser.add_argument("--empty", type=int, default=2000, help="N, empty jobs (default 2000)")
    parser.add_argument("--grades", type=int, default=8, help="leaderboard runs per backend (default 8)")
    args = parser.parse_args()
    console = Console(width=120)
    empty = list(range(args.empty))
    grades = grading_jobs(args.grades, ROOT / "traces" / "bench-ray")
    backends = {"this process": Backend(), f"pool of {args.workers}": Backend(workers=args.workers),
                f"Ray, {args.workers} CPUs": Backend(workers=args.workers, ray=RAY_LOCAL)}
    ray = import_ray()
    started = time.perf_counter()
    connect(backends[f"Ray, {args.workers} CPUs"])  # held for the rows below, so each row times jobs only
    ray_start = time.perf_counter() - started
    table = Table(title=f"{args.empty} and {2 * args.empty} empty jobs, {args.grades} leaderboard runs "
                        f"({SCENARIO.cluster}, {SCENARIO.workload}, sandbox {'on' if grades[0].confine else 'off'})")
    for column in ("backend", "fixed per call (s)", "per empty job (ms)", "empty jobs/s", "runs/s", "per run (s)"):
        table.add_column(column, justify="right" if column != "backend" else "left")
    per_job = {}
    for name, backend in backends.items():
        timed(echo, empty[:args.workers * 4], backend)  # warm: Ray's workers and their imports
        once, twice = timed(echo, empty, backend), timed(echo, empty + empty, backend)
        per_job[name] = max(twice - once, 0.0) / len(empty)
        seconds_grades = timed(grade_job, grades, backend)
        table.add_row(name, f"{once - per_job[name] * len(empty):.2f}", f"{per_job[name] * 1e3:.3f}",
                      f"{1 / per_job[name]:,.0f}" if per_job[name] else "-",
                      f"{len(grades) / seconds_grades:.2f}", f"{seconds_grades / len(grades):.2f}")
    ray.shutdown()
    console.print(table)
    ray_name, pool_name = f"Ray, {args.workers} CPUs", f"pool of {args.workers}"
    console.print(f"Ray overhead per job: {per_job[ray_name] * 1e3:.3f} ms "
                  f"({(per_job[ray_name] - per_job[pool_name]) * 1e3:+.3f} ms against the local pool); "
                  f"starting the local Ray instance: {ray_start:.1f} s, once per board")


if __name__ == "__main__":
    main()
