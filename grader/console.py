"""The `dist-sandbox` console command (`[project.scripts]` in pyproject.toml): the grader's CLI
(`grader/cli.py`) under the name a `pip install` puts on the PATH; `python -m grader` is the same CLI."""

from __future__ import annotations

import os
import sys

PROG = "dist-sandbox"


def run(prog: str) -> int:
    """`grader.cli.main` under `prog`, quiet when the reader of its output goes away
    (`dist-sandbox run ddp --json | head -c 100`): exit code 1, as rich does on a closed pipe."""
    from grader.cli import main
    try:
        code = main(prog=prog)
        sys.stdout.flush()
    except BrokenPipeError:
        # stdout goes to /dev/null so that the interpreter's own flush at exit does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    return code


def main() -> int:
    """The entry point of `dist-sandbox`."""
    return run(PROG)
