"""Many submissions x a suite's scenarios: a job list, graded in parallel, saved as each run finishes.

Every finished row is appended to `results.jsonl` in the output folder (by this process only: runs
are confined and cannot write there) with a fingerprint of the submission's source and the helpers
beside it, the scenario, the suite's limits, and the grader's and simulator's own code (Python and C)
and Python version, and `leaderboard.json` / `.csv` are rewritten. Running again skips rows whose
fingerprint matches, so an interrupted leaderboard resumes where it stopped, and a changed grader,
simulator, helper or limit grades again. A line of `results.jsonl` that is not a well-formed row is
ignored (and graded again).

The runs are independent `grade_job` calls on plain data (`portable.py`: each carries its
submission's source and returns its trace as bytes), handed to `jobs.run_jobs`: in this process, a
local process pool, or Ray tasks across a cluster. This module, the driver, keeps the collection, the
resume file and the ranking, so a run retried after a worker died is still recorded once.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import sys
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dist_lib.specs import map_spec_paths

from .errors import InputError
from .grade import slug
from .jobs import Backend, JobFailed, run_jobs
from .portable import GradeJob, grade_job, save
from .intake import gather, named_helpers
from .names import board_names, csv_text
from .report_terminal import grader_console, literal
from .suites import SUMMARY_ROW, Suite

ROOT = Path(__file__).resolve().parents[1]
CODE = ("dist_lib", "grader", "strategies")  # what a grade depends on besides the submission (strategies:
# helpers a submission may import)
RUNS = "runs"  # OUT/runs/<folder>/<scenario>.json: every submission's traces and plots, apart from the
# files the board itself writes in OUT
PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")  # a name that is safe as a folder as it is
# the files a board writes in its output folder (beside RUNS/); the main job's folder is traces/
BOARD_FILES = frozenset({"leaderboard.json", "leaderboard.csv", "results.jsonl", "leaderboard.json.tmp",
                         "leaderboard.csv.tmp"})
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
    """The submissions under `paths` (`intake.gather`; what it skips is left out)."""
    return gather(paths).submissions


def labels_for(submissions: list[Path]) -> dict[Path, str]:
    """Each submission's name on the board: its stem, led by as many of its folders as make it unique
    (unique once NFKC-normalised: `ｈonest` and `honest` are one name to a reader). Its traces go to
    `run_folder(label)`; how it is shown is `names.board_names`'."""
    def label(path: Path, depth: int) -> str:
        return "/".join([*path.parent.parts[len(path.parent.parts) - depth:], path.stem]) if depth else path.stem

    def key(text: str) -> str:
        return unicodedata.normalize("NFKC", text.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))

    labels = {}
    for path in submissions:
        depth = 0
        while depth < len(path.parent.parts) and \
                sum(key(label(other, depth)) == key(label(path, depth)) for other in submissions) > 1:
            depth += 1
        labels[path] = label(path, depth)
    return labels


def run_folder(label: str) -> str:
    """The folder, under OUT/runs/, of a submission's traces and plots. A label that is a plain name
    (letters, digits, `_`, `-` and `.`, not led by a dot, at most 64 characters) is its own folder; any
    other is made plain and marked with `~` and a digest of the label (`~` is in no plain name). So the
    folder is never `.`, `..`, empty or a path, never one of the board's own files (those are in OUT, not
    OUT/runs), and two labels that read alike once made plain (`a b` and `a-b`) never share one."""
    if PLAIN.fullmatch(label):
        return label
    digest = hashlib.sha256(label.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return f"{slug(label).lstrip('.-')[:64] or 'run'}~{digest}"


def code_hash() -> str:
    """Of the grader's and simulator's source (Python, C and suite files, by path and content) and the
    Python version."""
    digest = hashlib.sha256(sys.version.encode())  # and the interpreter that runs it
    for folder in CODE:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".c", ".h", ".toml") and path.is_file():
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def submission_files(path: Path) -> tuple[bytes, tuple[tuple[str, bytes], ...]]:
    """What a submission's grade depends on among its own files: the file, and the helpers beside it that
    it names (`intake.named_helpers`), by name. A file that cannot be read counts as empty (its run fails)."""
    return _read(path), tuple((helper.name, _read(helper)) for helper in named_helpers(path))


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def submission_source(path: Path) -> bytes:
    """`submission_files` as one byte string, for the resume fingerprint."""
    source, helpers = submission_files(path)
    return b"\0".join([source, *(part for name, data in helpers for part in (name.encode(), data))])


def scenario_files(scenario: dict[str, Any]) -> bytes:
    """The contents of the files a scenario's cluster and workload specs name (a cluster or workload
    TOML, a profile or Metis file), by path: a grade depends on them, not only on their paths. A file
    that cannot be read counts as empty (the suite's check has read it; a run that cannot fails)."""
    parts: list[bytes] = []

    def add(path: str) -> str:
        try:
            data = Path(path).read_bytes()
        except OSError:
            data = b""
        parts.extend((path.encode("utf-8", "surrogateescape"), data))
        return path

    for key in ("cluster", "workload"):
        map_spec_paths(scenario[key], add)
    return b"\0".join(parts)


def make_jobs(submissions: list[Path], suite: Suite, out: Path, traces: bool) -> list[Job]:
    code = code_hash()
    limits = json.dumps(asdict(suite.limits), sort_keys=True)
    jobs = []
    labels = labels_for(submissions)
    shown = board_names(labels)
    for path, label in labels.items():
        source = submission_source(path)
        for scenario in suite.scenarios:
            data = scenario.to_dict()
            fingerprint = hashlib.sha256(b"\0".join((source, json.dumps(data, sort_keys=True).encode(),
                                                     scenario_files(data), limits.encode(),
                                                     code.encode()))).hexdigest()
            trace = str(out / RUNS / run_folder(label) / f"{slug(scenario.name)}.json") if traces else None
            jobs.append(Job(str(path), shown[path], data, f"{path}::{scenario.name}", fingerprint[:16], trace))
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


def run_leaderboard(submissions: list[Path], suite: Suite, out: Path, jobs: int = 1, plots: bool = True,
                    console: Console | None = None, fresh: bool = False, confine: bool = True,
                    ray: str | None = None, skipped: tuple[str, ...] = ()) -> dict[str, Any]:
    """Grade every submission x scenario not graded yet. `jobs` runs that many local processes; `ray` (an
    address, or `jobs.RAY_LOCAL`) runs Ray tasks instead; `confine=False` runs submissions without the OS
    sandbox (for trusted code only). `skipped`: the folder entries `intake.gather` skipped, one line each,
    kept in leaderboard.json."""
    from .runner.isolation import clean_stale
    console = console or grader_console()
    clean_stale()
    out.mkdir(parents=True, exist_ok=True)
    if (out / RUNS).exists() and not (out / RUNS).is_dir():
        raise InputError(f"--out {out}: {out / RUNS} is a file; the board keeps its traces in a folder of that name")
    results = out / "results.jsonl"
    if fresh and results.exists():
        results.unlink()
    job_list = make_jobs(submissions, suite, out, traces=True)
    done = load_done(results, job_list)
    todo = [job for job in job_list if job.key not in done]
    if done:
        console.print(f"resuming: {len(done)} of {len(job_list)} runs already graded in {literal(results)}")
    limits = asdict(suite.limits)
    files = {job.submission: submission_files(Path(job.submission)) for job in todo}
    work = [GradeJob(job.submission, *files[job.submission], job.scenario, limits, job.trace, plots, confine)
            for job in todo]

    def finished(job: Job, row: dict[str, Any]) -> None:
        if job.key in done:
            return  # one row per run, whatever the backend delivers
        row.update(key=job.key, fingerprint=job.fingerprint, label=job.label)
        done[job.key] = row
        with results.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        write_outputs(out, suite, job_list, done, skipped)

    columns = (TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.description}"))
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("", total=len(todo))
        backend = Backend(workers=jobs, ray=ray)
        if ray is not None and todo:
            console.print(f"grading {len(todo)} runs on {literal(backend.describe())}")
        for index, graded in run_jobs(grade_job, work, backend):
            job = todo[index]
            # a run the grader itself could not finish (it raised, or killed its worker on every attempt)
            # is a crashed row, recorded like any other: grading it again would fail again
            finished(job, _grader_error(job, graded.reason) if isinstance(graded, JobFailed) else save(graded))
            progress.update(task, description=literal(f"{job.label} / {job.scenario['name']}"))
            progress.advance(task)
    return write_outputs(out, suite, job_list, done, skipped)


def _grader_error(job: Job, reason: str) -> dict[str, Any]:
    return {"submission": job.submission, "strategy": Path(job.submission).stem, "scenario": job.scenario["name"],
            "cluster": job.scenario["cluster"], "workload": job.scenario["workload"],
            "global_batch": job.scenario["global_batch"], "status": "crashed",
            "error": f"grading this run failed in the grader ({reason[:300]})",
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


def summary_status(entry: dict[str, Any], scenarios: int) -> str:
    """The status of a submission's ALL row: "invalid" when a run was, "partial" while runs are missing,
    "ok" when every scenario's run is, else how many of the runs are ("1 of 3 ok")."""
    if entry["invalid"]:
        return "invalid"
    if not entry["complete"]:
        return "partial"
    good = sum(run["status"] == "ok" for run in entry["runs"].values())
    return "ok" if good == scenarios else f"{good} of {scenarios} ok"


def write_outputs(out: Path, suite: Suite, job_list: list[Job], done: dict[str, dict[str, Any]],
                  skipped: tuple[str, ...] = ()) -> dict[str, Any]:
    ranked = rank(suite, job_list, done)
    summary = {"suite": suite.name, "suite_path": suite.path, "scenarios": [s.name for s in suite.scenarios],
               "skipped": list(skipped),
               "submissions": [{k: v for k, v in e.items() if k != "runs"} for e in ranked],
               "rows": [dict(row, submission=e["submission"]) for e in ranked for row in e["runs"].values()]}
    tmp = out / "leaderboard.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(out / "leaderboard.json")
    # a file name that is not UTF-8 (its bytes kept as surrogates) is written with backslash escapes
    with (out / "leaderboard.csv.tmp").open("w", newline="", encoding="utf-8", errors="backslashreplace") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for entry in ranked:
            submission = csv_text(entry["submission"])
            for name, row in entry["runs"].items():
                writer.writerow({**row, "rank": entry["rank"] or "", "submission": submission, "scenario": name,
                                 "error": csv_text(row.get("error") or "")})
            writer.writerow({"rank": entry["rank"] or "", "submission": submission, "scenario": SUMMARY_ROW,
                             "status": summary_status(entry, len(suite.scenarios)), "score": entry["score"],
                             "error": csv_text("; ".join(entry["invalid"]))})
    (out / "leaderboard.csv.tmp").replace(out / "leaderboard.csv")
    summary["ranked"] = ranked
    return summary
