"""The row's time limit over the grader's own work on a run: the backstop that stops it, and caps on the
text a row keeps.

After the isolated child returns, the grader replays its program, checks the step, builds the result and
writes the trace and the plots: all of it is bounded by the suite's `timeout_s`, like the child. The replay
checks its deadline itself as it goes (`dist_lib.run.replay`); the rest (the trace, the plots) is plain code
that does not, so `alarm_at` raises `RowTimeout` in it once the deadline passes.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

MAX_ERROR_CHARS = 4000  # of a row's error text
MAX_PROBLEMS = 20  # problems a row lists; the rest are counted
REPEAT_S = 0.25  # the alarm fires again this often until the block ends (in case code swallowed it)


class RowTimeout(BaseException):
    """The row's time limit passed while the grader worked on it. A BaseException, so that no
    `except Exception` in the code it interrupts (matplotlib's, say) takes it for its own error."""


@contextmanager
def alarm_at(deadline: float, now: float) -> Iterator[None]:
    """Raise `RowTimeout` in this thread when `deadline` (a `time.monotonic()` value; `now` is the
    current one) passes, and again every `REPEAT_S` until the block ends. Python runs signal handlers in
    the main thread only: elsewhere, or when the program has its own SIGALRM handler, this does nothing
    (the grader checks the deadline between its steps all the same)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer") \
            or signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, signal.SIG_IGN, None):
        yield
        return
    armed = [True]

    def fire(signum: int, frame: object) -> None:
        if armed[0]:
            raise RowTimeout

    previous = signal.signal(signal.SIGALRM, fire)
    try:
        signal.setitimer(signal.ITIMER_REAL, max(deadline - now, 1e-3), REPEAT_S)
        yield
    finally:
        armed[0] = False
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, previous)


def capped(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """`text`, cut to `limit` characters with a note saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n... (cut here: {len(text) - limit} more characters)"


def capped_list(items: list[str], limit: int = MAX_PROBLEMS) -> list[str]:
    """The first `limit` of `items` (each `capped`), then one entry counting the rest."""
    shown = [capped(str(item)) for item in items[:limit]]
    return shown + [f"... and {len(items) - limit} more"] if len(items) > limit else shown
