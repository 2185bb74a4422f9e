"""`python -m grader`: see grader/cli.py (the same CLI as the `dist-sandbox` command)."""

import sys

from grader.console import run

sys.exit(run("python -m grader"))
