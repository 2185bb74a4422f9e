"""`python -m grader`: see grader/cli.py."""

import os
import sys

from grader.cli import main

try:
    code = main()
    sys.stdout.flush()
except BrokenPipeError:
    # the reader of our output went away (`... --json | head -c 100`): stop quietly with code 1, as rich
    # does when its console meets a closed pipe; stdout goes to /dev/null so that the interpreter's
    # own flush at exit does not raise again
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = 1
sys.exit(code)
