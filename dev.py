#!/usr/bin/env python3
"""Set up a local environment (.venv) and run the main job or the tests.

    python3 dev.py run [grader args...]   # the main job: `dist-sandbox` (python -m grader), from your folder
    python3 dev.py test [pytest args...]  # the test suite, from the project's folder (2 processes when whole)

Only Python 3.11+ is needed; packages come from the package index into .venv on first use.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".installed"
# every C file of dist_lib/native/ is one (`_*.c`, `_*.h`: those `dist_lib/native/source_hash.py` fingerprints)
BUILD_INPUTS = ("pyproject.toml", "setup.py", "dist_lib/native/source_hash.py",
                *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "dist_lib" / "native").glob("_*.[ch]")))


def ensure_env() -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"Python 3.11 or newer is needed, this is {sys.version.split()[0]}")
    if not PYTHON.exists():
        print("creating .venv ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    # what the install builds from: a change to any of them re-installs (and rebuilds the C accelerator)
    want = hashlib.sha256(b"".join((ROOT / name).read_bytes() for name in BUILD_INPUTS)).hexdigest()
    if not STAMP.exists() or STAMP.read_text() != want:
        print("installing dependencies into .venv (a minute or two the first time; pip's progress follows) ...",
              flush=True)
        # pip's own lines (Collecting ..., Downloading ..., Installing ...) are the progress: no --quiet
        subprocess.run([str(PYTHON), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "on",
                        "-e", f"{ROOT}[test,plot,ray]"], check=True)
        STAMP.write_text(want)
        print("installed; .venv is ready", flush=True)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "test"):
        print(__doc__)
        return 2
    ensure_env()
    command, rest = sys.argv[1], sys.argv[2:]
    if command == "run":
        # from the caller's folder: its files (a strategy, a suite, --out) are found from there, and the
        # traces go there; the editable install finds the project's code from anywhere (-P: a folder of the
        # caller's named grader/ or dist_lib/ is not imported instead, as with the dist-sandbox command)
        return subprocess.run([str(PYTHON), "-P", "-m", "grader", *rest]).returncode
    return subprocess.run([str(PYTHON), "-m", "pytest", *parallel(rest), *rest], cwd=ROOT).returncode


def parallel(args: list[str]) -> list[str]:
    """pytest-xdist's flags for the whole suite: two worker processes (the suite takes about half the wall
    time on two cores), each test file on one worker (`loadfile`: a file's module fixtures, such as a Ray
    instance, start once). None when the arguments name test files or choose the workers themselves."""
    named = any((ROOT / arg.split("::")[0]).exists() or Path(arg.split("::")[0]).exists()
                for arg in args if not arg.startswith("-"))
    if named or any(arg.startswith(("-n", "--numprocesses")) for arg in args) or "no:xdist" in " ".join(args) \
            or (os.cpu_count() or 1) < 2:
        return []
    return ["-n", "2", "--dist", "loadfile"]


if __name__ == "__main__":
    sys.exit(main())
