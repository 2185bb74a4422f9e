"""Many submissions x a suite's scenarios: a job list, graded in parallel, saved as each run finishes.

Every finished row is appended to `results.jsonl` in the output folder with a fingerprint of the
submission's source, the scenario and the simulator's source, and `leaderboard.json` / `.csv` are
rewritten. Running again skips rows whose fingerprint matches, so an interrupted leaderboard
resumes where it stopped.

The runs are independent `grade_job` calls on plain data (`portable.py`: each carries its
submission's source and returns its trace as bytes), handed to `jobs.run_jobs`: in this process, a
local process pool, or Ray tasks across a cluster. This module, the driver, keeps the collection, the
resume file and the ranking, so a run retried after a worker died is still recorded once.
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .errors import InputError
from .grade import slug
from .jobs import Backend, Lost, run_jobs
from .portable import GradeJob, grade_job, save
from .suites import Suite

DIST_LIB = Path(__file__).resolve().parents[1] / "dist_lib"
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


def _simulator_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(DIST_LIB.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def make_jobs(submissions: list[Path], suite: Suite, out: Path, traces: bool) -> list[Job]:
    sim = _simulator_hash()
    jobs = []
    for path, label in labels_for(submissions).items():
        source = path.read_bytes()
        for scenario in suite.scenarios:
            data = scenario.to_dict()
            fingerprint = hashlib.sha256(source + json.dumps(data, sort_keys=True).encode() + sim.encode()).hexdigest()
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
            except ValueError:
                continue  # a line cut short by an interruption
            if isinstance(row, dict) and wanted.get(row.get("key")) == row.get("fingerprint"):
                done[row["key"]] = row
    return done


def run_leaderboard(submissions: list[Path], suite: Suite, out: Path, jobs: int = 1, plots: bool = True,
                    console: Console | None = None, fresh: bool = False, ray: str | None = None) -> dict[str, Any]:
    """Grade every submission on every scenario of `suite` into `out`, skipping runs already saved there.
    `jobs` runs that many local processes; `ray` (an address, or `jobs.RAY_LOCAL`) runs Ray tasks instead."""
    console = console or Console()
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    if fresh and results.exists():
        results.unlink()
    job_list = make_jobs(submissions, suite, out, traces=True)
    done = load_done(results, job_list)
    todo = [job for job in job_list if job.key not in done]
    if done:
        console.print(f"resuming: {len(done)} of {len(job_list)} runs already graded in {results}")
    limits = {"timeout_s": suite.limits.timeout_s, "address_space_bytes": suite.limits.address_space_bytes}
    sources = {job.submission: Path(job.submission).read_bytes() for job in todo}
    work = [GradeJob(job.submission, sources[job.submission], job.scenario, limits, job.trace, plots) for job in todo]
    backend = Backend(workers=jobs, ray=ray)
    lost: list[str] = []

    def finished(job: Job, row: dict[str, Any]) -> None:
        if job.key in done:
            return  # one row per run, whatever the backend delivers
        row.update(key=job.key, fingerprint=job.fingerprint, label=job.label)
        done[job.key] = row
        with results.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        write_outputs(out, suite, job_list, done)

    columns = (TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.description}"))
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(backend.describe() if todo else "", total=len(todo))
        for index, graded in run_jobs(grade_job, work, backend):
            job = todo[index]
            if isinstance(graded, Lost):
                lost.append(f"{job.label} / {job.scenario['name']}: {graded.reason}")
            else:
                finished(job, save(graded))
            progress.update(task, description=f"{job.label} / {job.scenario['name']}")
            progress.advance(task)
    for line in lost:
        console.print(f"[yellow]not graded, run again to retry: {line}[/]", highlight=False)
    return write_outputs(out, suite, job_list, done)


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
    for i, entry in enumerate(valid, 1):
        entry["rank"] = i
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
