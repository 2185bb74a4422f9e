"""A rank's asyncio tasks belong to its step.

A strategy may start tasks (`asyncio.create_task`, `gather`); the engine notes each with the rank that
made it (`task_factory`), so that a work awaited inside one is checked to be that rank's own and a
`sys.exit()` in one fails the rank. When the step ends, a task still unfinished, or one that raised and
that nothing awaited, is the rank's `StrategyError` naming the task and its line (`check_tasks`), and
what is left is cancelled (`cancel_tasks`).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, MutableMapping
from typing import Any, Protocol

from dist_lib.errors import StrategyError
from dist_lib.engine.waits import said, user_frame, waiting_line


class Engine(Protocol):
    """What the tasks' bookkeeping needs of the engine (`dist_lib.engine.core.Engine`)."""

    driving: int  # the rank whose coroutine runs now, or -1
    task_ranks: MutableMapping[asyncio.Task, int]  # each task of the step and the rank that made it

    def _fail(self, error: BaseException) -> None: ...

    def _abort(self, error: BaseException) -> None: ...


def task_factory(engine: Engine, factory: Callable | None) -> Callable:
    """The event loop's task factory for `engine`'s step: `factory`'s tasks (asyncio's by default), each
    noted with the rank that made it, so that a work awaited inside one is checked to be that rank's own,
    and its coroutine guarded: asyncio re-raises a task's `SystemExit` out of the event loop, past the engine,
    so a rank's task's `sys.exit()` becomes the `StrategyError` its own coroutine's would, and fails
    the step even if no rank awaits the task."""
    def make_task(loop: asyncio.AbstractEventLoop, coroutine: Any, **kwargs: Any) -> asyncio.Task:
        current = asyncio.current_task(loop)  # (None in a plain callback: `call_soon(ensure_future, ...)`)
        rank = engine.driving if engine.driving >= 0 else None if current is None else engine.task_ranks.get(current)
        if rank is not None and asyncio.iscoroutine(coroutine):
            coroutine = _guarded(engine, coroutine)
        task = factory(loop, coroutine, **kwargs) if factory else asyncio.Task(coroutine, loop=loop, **kwargs)
        if rank is not None:
            engine.task_ranks[task] = rank
        return task
    return make_task


def exception_handler(engine: Engine, handler: Callable | None) -> Callable:
    """The event loop's exception handler for `engine`'s step: a rank's task that raised and that nothing
    awaited (asyncio reports it when the task is let go of) fails the step as the rank's error; anything
    else goes to `handler` (asyncio's default one if None)."""
    def report(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        task, error = context.get("future"), context.get("exception")
        rank = engine.task_ranks.get(task) if isinstance(task, asyncio.Task) else None
        if rank is None or error is None:
            if handler is not None:
                handler(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        engine._abort(_unawaited(rank, error))
    return report


def check_tasks(engine: Engine) -> None:
    """At the step's end, every rank has returned: a task a rank started that has not finished, or that
    raised and that nothing awaited (asyncio reports that only once the strategy lets go of the task),
    is the rank's error, as the first such task of the lowest rank."""
    for task, rank in sorted(engine.task_ranks.items(), key=lambda item: item[1]):
        if not task.done():
            engine._fail(StrategyError(f"rank {rank}: {_unfinished(task)} when the step ended: the rank "
                                     f"returned from train without awaiting it (`await task`, `asyncio.gather`)"))
            return
        # (`_log_traceback`: asyncio's flag of an exception that no one has asked for yet)
        if not task.cancelled() and getattr(task, "_log_traceback", False):
            engine._fail(_unawaited(rank, task.exception()))
            return


def cancel_tasks(engine: Engine) -> None:
    """When the step ends, cancel the ranks' tasks still pending (after a failure, or left unawaited), so
    that none runs on into an engine that is done, and take the errors of those that raised unawaited:
    the step's error is the first of them (`_check_tasks`), or the failure that ended it earlier."""
    for task in list(engine.task_ranks):
        if not task.done():
            task.cancel()
            coroutine = _strategy_coroutine(task)
            if inspect.iscoroutine(coroutine) and inspect.getcoroutinestate(coroutine) == inspect.CORO_CREATED:
                coroutine.close()  # (never to run: without this Python warns it was never awaited)
        elif not task.cancelled() and getattr(task, "_log_traceback", False):
            task.exception()


async def _guarded(engine: Engine, coroutine: Any) -> Any:
    """A rank's task's coroutine, as the engine's task factory runs it (`task_factory`)."""
    try:
        return await coroutine
    except SystemExit as exit:
        rank = engine.task_ranks.get(asyncio.current_task())
        if rank is None:  # not a rank's task
            raise
        error = StrategyError(f"rank {rank}: SystemExit{said(exit)}{user_frame(exit)}")
        engine._abort(error)
        raise error from exit


_GUARD_CODE = _guarded.__code__


def _unawaited(rank: int, error: BaseException) -> StrategyError:
    return StrategyError(f"rank {rank}: a task of the rank raised {type(error).__name__}{said(error)} and nothing "
                         f"awaited it{user_frame(error)}")


def _strategy_coroutine(task: asyncio.Task) -> Any:
    """The coroutine a rank's task runs, unwrapped from the engine's guard (`_guarded`)."""
    coroutine = task.get_coro()
    if inspect.iscoroutine(coroutine) and coroutine.cr_code is _GUARD_CODE:
        return inspect.getcoroutinelocals(coroutine).get("coroutine", coroutine)
    return coroutine


def _unfinished(task: asyncio.Task) -> str:
    """'a task it started, train.<locals>.later, had not started' (or '... waits at strategy.py:12'):
    the strategy's coroutine inside the engine's guard (`task_factory`), and how far it got."""
    coroutine = _strategy_coroutine(task)
    name = getattr(coroutine, "__qualname__", None) or task.get_name()
    if inspect.iscoroutine(coroutine) and inspect.getcoroutinestate(coroutine) == inspect.CORO_CREATED:
        return f"a task it started, {name}, had not started"
    return f"a task it started, {name}, was still waiting{waiting_line(coroutine)}"
