#!/usr/bin/env python3
"""Set up a local environment (.venv) and run the main job or the tests.

    python3 dev.py run [grader args...]   # the main job: python -m grader on the embedded default
    python3 dev.py test [pytest args...]  # the test suite

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
        print("installing dependencies into .venv ...", flush=True)
        subprocess.run([str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "-e", f"{ROOT}[test,plot,ray]"], check=True)
        STAMP.write_text(want)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "test"):
        print(__doc__)
        return 2
    ensure_env()
    command, rest = sys.argv[1], sys.argv[2:]
    if command == "run":
        args = [str(PYTHON), "-m", "grader", *rest]
    else:
        args = [str(PYTHON), "-m", "pytest", *rest]
    return subprocess.run(args, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
