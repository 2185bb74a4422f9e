"""The one error the grader itself raises: bad input from the person running it (exit code 2)."""


class InputError(Exception):
    """A missing file, a malformed suite, an unknown cluster or workload, a bad option: one line, exit 2."""
