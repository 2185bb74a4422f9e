"""Many submissions x a suite's scenarios: a job list, graded in parallel, saved as each run finishes.

Every finished row is appended to `results.jsonl` in the output folder (by this process only: runs
are confined and cannot write there) with a fingerprint of the submission's source and the helpers
beside it, the scenario, the suite's limits, and the grader's and simulator's own code (Python and C)
and Python version, and `leaderboard.json` / `.csv` are rewritten. Running again skips rows whose
fingerprint matches, so an interrupted leaderboard resumes where it stopped, and a changed grader,
simulator, helper or limit grades again. A line of `results.jsonl` that is not a well-formed row is
ignored (and graded again).

Scaling past one machine: the job list is a list of `(grade_one, args)` calls on picklable plain
data, and each call is independent and returns a plain dict. The same list can be submitted with
`ray.remote(grade_one).remote(*args)` or `dask.distributed.Client.submit(grade_one, *args)` instead
of the local process pool; the parent (this module) keeps only the collection, the resume file and
the ranking, so no scheduler of our own is involved.
"""

from __future__ import annotations

import csv
import hashlib
import json
import multiprocessing
import signal
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .errors import InputError
from .grade import grade_one, slug
from .suites import Suite

ROOT = Path(__file__).resolve().parents[1]
CODE = ("dist_lib", "grader", "strategies")  # what a grade depends on besides the submission (strategies:
# helpers a submission may import)
CSV_COLUMNS = ("rank", "submission", "scenario", "status", "score", "time_s", "mfu", "hfu", "peak_memory_bytes",
               "peak_memory_rank", "bubble_fraction", "correct", "error", "trace")


@dataclass(frozen=True)
class Job:
    submission: str
    label: str
    scenario: dict[str, Any]
    key: str
    fingerprint: str
    trace: str | None


def collect_submissions(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            files = sorted(p for p in path.glob("*.py") if not p.name.startswith("_"))
            if not files:
                raise InputError(f"submission folder {path}: holds no .py files")
            found.extend(files)
        elif path.is_file():
            found.append(path)
        else:
            raise InputError(f"submission {path}: no such file or folder")
    return list(dict.fromkeys(p.resolve() for p in found))


def labels_for(submissions: list[Path]) -> dict[Path, str]:
    stems = [p.stem for p in submissions]
    return {p: p.stem if stems.count(p.stem) == 1 else f"{p.parent.name}/{p.stem}" for p in submissions}


def code_hash() -> str:
    """Of the grader's and simulator's source (Python, C and suite files, by path and content) and the
    Python version."""
    digest = hashlib.sha256(sys.version.encode())  # and the interpreter that runs it
    for folder in CODE:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".c", ".h", ".toml") and path.is_file():
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def submission_source(path: Path) -> bytes:
    """What a submission's grade depends on among its own files: the file, and the helpers beside it
    (files named with a leading underscore, which are not submissions themselves)."""
    parts = [path.read_bytes()]
    for helper in sorted(path.parent.glob("_*.py")):
        parts += [helper.name.encode(), helper.read_bytes()]
    return b"\0".join(parts)


def make_jobs(submissions: list[Path], suite: Suite, out: Path, traces: bool) -> list[Job]:
    code = code_hash()
    limits = json.dumps(asdict(suite.limits), sort_keys=True)
    jobs = []
    for path, label in labels_for(submissions).items():
        source = submission_source(path)
        for scenario in suite.scenarios:
            data = scenario.to_dict()
            fingerprint = hashlib.sha256(b"\0".join((source, json.dumps(data, sort_keys=True).encode(),
                                                     limits.encode(), code.encode()))).hexdigest()
            trace = str(out / slug(label) / f"{slug(scenario.name)}.json") if traces else None
            jobs.append(Job(str(path), label, data, f"{path}::{scenario.name}", fingerprint[:16], trace))
    return jobs


def load_done(results: Path, jobs: list[Job]) -> dict[str, dict[str, Any]]:
    wanted = {job.key: job.fingerprint for job in jobs}
    done: dict[str, dict[str, Any]] = {}
    if results.exists():
        for line in results.read_text().splitlines():
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                continue  # a line cut short by an interruption
            if isinstance(row, dict) and isinstance(row.get("key"), str) and _well_formed(row) \
                    and wanted.get(row["key"]) == row.get("fingerprint"):
                done[row["key"]] = row
    return done


def _well_formed(row: dict[str, Any]) -> bool:
    """A row this grader could have written: the fields ranking and reports read, of their types."""
    number = (int, float, type(None))
    return isinstance(row.get("status"), str) and isinstance(row.get("error"), str) \
        and all(isinstance(row.get(k), number) and not isinstance(row.get(k), bool)
                for k in ("time_s", "peak_memory_bytes", "mfu", "hfu", "bubble_fraction")) \
        and isinstance(row.get("global_batch"), int) and isinstance(row.get("problems"), list)


def _pool_worker_init() -> None:
    """A pool worker dies with the leaderboard process (Linux), so that no grading outlives it."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_leaderboard(submissions: list[Path], suite: Suite, out: Path, jobs: int = 1, plots: bool = True,
                    console: Console | None = None, fresh: bool = False, confine: bool = True) -> dict[str, Any]:
    """Grade every submission x scenario not graded yet; `confine=False` runs submissions without the
    OS sandbox (for trusted code only)."""
    from .runner.isolation import clean_stale
    console = console or Console()
    clean_stale()
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    if fresh and results.exists():
        results.unlink()
    job_list = make_jobs(submissions, suite, out, traces=True)
    done = load_done(results, job_list)
    todo = [job for job in job_list if job.key not in done]
    if done:
        console.print(f"resuming: {len(done)} of {len(job_list)} runs already graded in {results}")
    limits = asdict(suite.limits)

    def finished(job: Job, row: dict[str, Any]) -> None:
        row.update(key=job.key, fingerprint=job.fingerprint, label=job.label)
        done[job.key] = row
        with results.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        write_outputs(out, suite, job_list, done)

    columns = (TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.description}"))
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("", total=len(todo))
        if jobs <= 1:
            for job in todo:
                progress.update(task, description=f"{job.label} / {job.scenario['name']}")
                try:
                    row = grade_one(job.submission, job.scenario, limits, job.trace, plots, confine=confine)
                except Exception as exc:  # noqa: BLE001 - one row's failure never stops the board
                    row = _grader_error(job, exc)
                finished(job, row)
                progress.advance(task)
        else:
            def advance(job: Job) -> None:
                progress.update(task, description=f"{job.label} / {job.scenario['name']}")
                progress.advance(task)
            left = _run_pool(todo, jobs, limits, plots, confine, finished, advance, blame=False)
            for job in left:  # a pool worker was killed: each unfinished job alone, so a break names its job
                _run_pool([job], 1, limits, plots, confine, finished, advance, blame=True)
    return write_outputs(out, suite, job_list, done)


def _run_pool(todo: list[Job], jobs: int, limits: dict[str, Any], plots: bool, confine: bool,
              finished: Any, advance: Any, blame: bool) -> list[Job]:
    """Grade `todo` on a pool of `jobs` processes. If the pool breaks (a pool worker killed from
    outside), the jobs it did not finish are returned to run again, or with `blame` (one job alone)
    recorded as crashed."""
    context = multiprocessing.get_context("spawn")
    left: list[Job] = []
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_pool_worker_init) as pool:
        pending: dict[Future, Job] = {pool.submit(grade_one, j.submission, j.scenario, limits, j.trace, plots,
                                                  confine=confine): j for j in todo}
        try:
            while pending:
                ready, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in ready:
                    job = pending.pop(future)
                    try:
                        row = future.result()
                    except BrokenProcessPool as exc:
                        if not blame:
                            left.append(job)
                            continue
                        row = _grader_error(job, exc)
                    except Exception as exc:  # noqa: BLE001 - one row's failure never stops the board
                        row = _grader_error(job, exc)
                    finished(job, row)
                    advance(job)
        except BaseException:
            for future in pending:
                future.cancel()
            raise
    return left


def _grader_error(job: Job, exc: BaseException) -> dict[str, Any]:
    return {"submission": job.submission, "strategy": Path(job.submission).stem, "scenario": job.scenario["name"],
            "cluster": job.scenario["cluster"], "workload": job.scenario["workload"],
            "global_batch": job.scenario["global_batch"], "status": "crashed",
            "error": f"grading this run failed in the grader ({type(exc).__name__}: {str(exc)[:300]})",
            "time_s": None, "peak_memory_bytes": None, "peak_memory_rank": None, "memory_bytes": None, "mfu": None,
            "hfu": None, "bubble_fraction": None, "correct": False, "problems": [], "trace": None, "plots": [],
            "wall_s": 0.0}


def rank(suite: Suite, job_list: list[Job], done: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    entries: dict[str, dict[str, Any]] = {}
    for job in job_list:
        entry = entries.setdefault(job.submission, {"submission": job.label, "path": job.submission, "runs": {},
                                                    "invalid": []})
        row = done.get(job.key)
        if row is None:
            continue
        row["score"] = round(suite.rubric.score(row), 4)
        entry["runs"][job.scenario["name"]] = row
        if row["status"] == "invalid":
            entry["invalid"].append(f"{job.scenario['name']}: {row['error']}")
    for entry in entries.values():
        runs = entry["runs"].values()
        entry["score"] = round(sum(r["score"] for r in runs) / len(suite.scenarios), 4)
        entry["complete"] = len(entry["runs"]) == len(suite.scenarios)
    valid = sorted((e for e in entries.values() if not e["invalid"]), key=lambda e: (-e["score"], e["submission"]))
    for i, entry in enumerate(valid):  # equal scores share a rank (1, 2, 2, 4): no order among equals
        entry["rank"] = valid[i - 1]["rank"] if i and entry["score"] == valid[i - 1]["score"] else i + 1
    invalid = [e for e in entries.values() if e["invalid"]]
    for entry in invalid:
        entry["rank"] = None
    return valid + invalid


def write_outputs(out: Path, suite: Suite, job_list: list[Job], done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ranked = rank(suite, job_list, done)
    summary = {"suite": suite.name, "suite_path": suite.path, "scenarios": [s.name for s in suite.scenarios],
               "submissions": [{k: v for k, v in e.items() if k != "runs"} for e in ranked],
               "rows": [dict(row, submission=e["submission"]) for e in ranked for row in e["runs"].values()]}
    tmp = out / "leaderboard.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(out / "leaderboard.json")
    with (out / "leaderboard.csv.tmp").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for entry in ranked:
            for name, row in entry["runs"].items():
                writer.writerow({**row, "rank": entry["rank"] or "", "submission": entry["submission"],
                                 "scenario": name})
            writer.writerow({"rank": entry["rank"] or "", "submission": entry["submission"], "scenario": "ALL",
                             "status": "invalid" if entry["invalid"] else ("ok" if entry["complete"] else "partial"),
                             "score": entry["score"], "error": "; ".join(entry["invalid"])})
    (out / "leaderboard.csv.tmp").replace(out / "leaderboard.csv")
    summary["ranked"] = ranked
    return summary
