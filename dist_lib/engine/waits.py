"""Where a strategy waits, and whether anything could still wake it.

A strategy may await things of asyncio's besides the simulator's works (an `asyncio.Event`, a queue, a
sleep). Such a wait can be one nothing will ever end: the simulator cannot see who would set the event,
but it can see when the event loop has nothing left that could (no ready callback, no live timer, no
thread started meanwhile, no file or socket watched). `HangWatch` looks for that once a wall-clock second
and reports it, so that such a step fails with the waits named instead of hanging.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

HANG_CHECK_S = 1.0
"""Wall-clock seconds between two looks of a `HangWatch`: it bounds how soon a hang is reported."""

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # dist_lib/
_ASYNCIO = os.path.dirname(os.path.abspath(asyncio.__file__))


class HangWatch:
    """Calls `on_hang()` once the running event loop has nothing left that could resume a waiting
    coroutine; looks every `HANG_CHECK_S` until then, or until `cancel()`. Where only callbacks keep the
    loop going (no timer, no new thread, no file watched), it also asks `on_spin()` (the engine's look for ranks that poll
    without waiting), which returns True when it ended the step."""

    def __init__(self, on_hang: Callable[[], None], on_spin: Callable[[], bool] | None = None):
        self.loop = asyncio.get_running_loop()
        self.on_hang: Callable[[], None] | None = on_hang
        self.on_spin = on_spin
        self.threads = threading.active_count()  # threads alive at the start: more may complete a future
        self.handle = self.loop.call_later(HANG_CHECK_S, self._look)

    def _look(self) -> None:
        # (a timer handle is off the loop's schedule while it runs: this look does not count as progress)
        if self.threads < threading.active_count() or loop_can_progress(self.loop):
            if self.on_spin is not None and self.threads >= threading.active_count() and not _timers(self.loop) \
                    and not _watches(self.loop) and self.on_spin():
                return
            self.handle = self.loop.call_later(HANG_CHECK_S, self._look)
        elif self.on_hang is not None:
            self.on_hang()

    def cancel(self) -> None:
        self.handle.cancel()
        self.on_hang = self.on_spin = None  # (bound methods of its owner: no cycle outlives the watch)


def loop_can_progress(loop: asyncio.AbstractEventLoop) -> bool:
    """Could the event loop still run anything: a callback ready, a live timer (an `asyncio.sleep`), a file
    or socket it watches besides its own wake-up pipe? True when this loop's kind does not let us tell
    (the attributes read are those of CPython's selector and proactor loops)."""
    ready, scheduled = getattr(loop, "_ready", None), getattr(loop, "_scheduled", None)
    if ready is None or scheduled is None:
        return True
    return bool(ready) or _timers(loop) or _watches(loop)


def _timers(loop: asyncio.AbstractEventLoop) -> bool:
    """Does the loop hold a live timer (an `asyncio.sleep`, a `wait_for`'s timeout)? True when its kind
    does not let us tell."""
    scheduled = getattr(loop, "_scheduled", None)
    return scheduled is None or any(not handle.cancelled() for handle in scheduled)


def _watches(loop: asyncio.AbstractEventLoop) -> bool:
    """Does the loop watch a file or socket besides its own wake-up pipe?"""
    selector = getattr(loop, "_selector", None)
    get_map = getattr(selector, "get_map", None)
    return get_map is not None and len(get_map()) > 1


def describe_future(future: Any) -> str:
    """An awaited asyncio object, briefly (an Event's future says only 'Future pending')."""
    return f"{type(future).__name__} {'cancelled' if future.cancelled() else 'pending'}"


def is_users(filename: str) -> bool:
    """Is this source file the strategy's (not the simulator's, asyncio's or the import machinery's)? (A
    strategy file may have asyncio in its name.)"""
    if filename.startswith("<frozen"):
        return False
    path = os.path.abspath(filename)
    return not path.startswith((_HERE + os.sep, _ASYNCIO + os.sep))


def user_frame(error: BaseException) -> str:
    """' (at strategy.py:42 in train)': the innermost traceback frame outside the simulator; when the error
    passed through none (Python or asyncio raised it for the strategy's own: a coroutine's StopIteration
    becomes a RuntimeError), that of the exception it was raised from or while handling, and so on."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        found = ""
        for frame, lineno in traceback.walk_tb(error.__traceback__):
            if is_users(frame.f_code.co_filename):
                found = f" (at {os.path.basename(frame.f_code.co_filename)}:{lineno} in {frame.f_code.co_name})"
        if found:
            return found
        error = error.__cause__ or error.__context__
    return ""


def said(error: BaseException) -> str:
    """': message' of a strategy's exception ('' for none), whatever its `__str__` does."""
    try:
        text = str(error)
    except Exception as broken:  # noqa: BLE001 - the strategy's own class
        return f": <its str() raised {type(broken).__name__}>"
    if isinstance(error, TypeError) and text.endswith("can't be used in 'await' expression") and \
            text.startswith(("object method ", "object builtin_function_or_method ")):
        return ": a method can't be used in 'await' expression; call it (`await model.all_reduce(x)`, not " \
               "`await model.all_reduce`)"
    return f": {text}" if text else ""


def waiting_line(coroutine: Any) -> str:
    """' (at strategy.py:42 in train)': the innermost line of the strategy a coroutine waits at. A suspended
    coroutine's chain of awaits leads to it; a running one (the rank whose wait completed a deadlock) shows
    no await past itself, so the frames it calls are read off the live call stack."""
    found, last, frame = "", None, None
    while coroutine is not None:
        frame = getattr(coroutine, "cr_frame", None) or getattr(coroutine, "gi_frame", None)
        if frame is not None and is_users(frame.f_code.co_filename):
            found = _at(frame)
        last = coroutine
        coroutine = getattr(coroutine, "cr_await", None) or getattr(coroutine, "gi_yieldfrom", None)
    if frame is not None and (getattr(last, "cr_running", False) or getattr(last, "gi_running", False)):
        inner, live = "", sys._getframe(1)
        while live is not None and live is not frame:
            if not inner and is_users(live.f_code.co_filename):
                inner = _at(live)
            live = live.f_back
        if live is frame and inner:  # (only frames called from that coroutine's own)
            found = inner
    return found


def _at(frame: Any) -> str:
    return f" (at {os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name})"


@contextmanager
def interrupt_at_once() -> Iterator[None]:
    """Around `asyncio.run`: Ctrl-C stops the ranks where they are. asyncio's own handler only cancels
    the main task, which acts when the event loop next gets control: the simulator's engine resumes
    ranks itself, so that is the step's end, and never for a rank that loops without awaiting. Python's
    plain handler, under another name so that `asyncio.run` leaves it in place, raises
    `KeyboardInterrupt` at once (the engine adds the rank and line it stopped, `Engine._rank_failed`)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield  # another thread, or the program chose its own handling: leave it alone
        return
    signal.signal(signal.SIGINT, _raise_keyboard_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
