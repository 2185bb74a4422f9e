"""Run a list of independent jobs in this process, a local process pool, or as Ray tasks.

A job is one call `fn(item)` on plain, picklable data returning plain data. `run_jobs` yields
`(index, result)` pairs in the order the jobs finish, so the caller (the driver) keeps collection,
the resume file and the ranking; nothing is shared between jobs but what they return.

A job that raises, or whose worker process dies on every attempt, yields a `JobFailed` in place of
its result, so one bad job never stops the others; only an `InputError` (a setup the user must fix,
such as a node without the sandbox) stops the run. A worker that dies is replaced and its unfinished
jobs run again, up to `max_retries` more times. On Ray (`Backend(ray=...)`) each job is one task and
Ray resubmits it itself (`max_retries` counts system failures only: a worker process or node lost;
`retry_exceptions=False` keeps an exception raised by `fn` from being retried, as it would only
happen again; https://docs.ray.io/en/latest/ray-core/fault_tolerance/tasks.html). The driver gets
one result per task however many attempts it took, so a job is never recorded twice. In a local pool
a dead worker breaks the whole pool: every unfinished job counts an attempt and runs on a new pool.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import signal
import socket
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import InputError

T = TypeVar("T")
R = TypeVar("R")

CONNECT_TIMEOUT_S = 10.0  # for the head node to accept a connection
RAY_LOCAL = "local"  # `--ray` with no address: start a Ray instance on this machine


@dataclass(frozen=True, slots=True)
class Backend:
    """Where jobs run. `workers` is the size of the local pool (1: in this process) or, with `ray`, the
    CPUs of a local Ray instance this run starts (0: all of this machine's). `ray` is None (no Ray),
    `RAY_LOCAL`, or the address of a running cluster (`host:6379`, `ray://host:10001`, `auto`)."""

    workers: int = 1
    ray: str | None = None
    max_retries: int = 3

    def describe(self) -> str:
        if self.ray is None:
            return "this process" if self.workers <= 1 else f"{self.workers} local processes"
        return "a local Ray instance" if self.ray == RAY_LOCAL else f"the Ray cluster at {self.ray}"


@dataclass(frozen=True, slots=True)
class JobFailed:
    """A job with no result: what it raised, or that its worker died on every attempt."""

    reason: str


def run_jobs(fn: Callable[[T], R], items: Sequence[T],
             backend: Backend = Backend()) -> Iterator[tuple[int, R | JobFailed]]:
    """`(index, fn(items[index]))` for every item, as each finishes. Closing the iterator early (or an
    exception in the caller's loop) cancels the jobs not yet finished."""
    if not items:
        return iter(())
    if backend.ray is not None:
        return _run_ray(fn, items, backend)
    if backend.workers <= 1:
        return ((i, _call(fn, item)) for i, item in enumerate(items))
    return _run_pool(fn, items, backend)


def _call(fn: Callable[[T], R], item: T) -> R | JobFailed:
    try:
        return fn(item)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - one job's failure never stops the others
        return JobFailed(_describe(exc))


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _run_pool(fn: Callable[[T], R], items: Sequence[T], backend: Backend) -> Iterator[tuple[int, R | JobFailed]]:
    """The jobs on a pool of `backend.workers` processes. A worker that dies breaks the whole pool; the
    jobs it was running are charged an attempt and run again one at a time on a pool of one (so that a
    job that kills its worker is told apart from those that happened to run beside it), the jobs not
    started yet run again as before."""
    attempts = [0] * len(items)
    rounds: list[tuple[list[int], int]] = [(list(range(len(items))), backend.workers)]
    while rounds:
        indices, width = rounds.pop(0)
        suspects, unstarted, why = yield from _pool_round(fn, items, indices, width)
        if len(unstarted) == len(indices):
            raise InputError("the local worker processes die before they start any job; run with --jobs 1 to see why")
        retry = []
        for index in suspects:
            attempts[index] += 1
            if attempts[index] > backend.max_retries:
                yield index, JobFailed(f"its worker died on each of {attempts[index]} attempts ({why})")
            else:
                retry.append(index)
        rounds[:0] = [r for r in ((retry, 1), (unstarted, width)) if r[0]]


def _pool_round(fn: Callable[[T], R], items: Sequence[T], indices: list[int],
                width: int) -> Generator[tuple[int, R | JobFailed], None, tuple[list[int], list[int], str]]:
    """Run `indices` on a new pool; (jobs running when the pool broke, jobs not started then, why it broke)."""
    context = multiprocessing.get_context("spawn")  # not fork: the driver may hold threads (rich's progress bar)
    # one flag per job, set by the worker that starts it: shared memory, so a worker never waits on the driver
    started = context.RawArray("b", len(indices))
    unfinished: list[int] = []
    why = ""
    with ProcessPoolExecutor(max_workers=width, mp_context=context, initializer=_init_worker,
                             initargs=(started, os.getpid())) as pool:
        pending: dict[Future, int] = {}
        for slot, i in enumerate(indices):
            try:
                pending[pool.submit(_tracked, fn, slot, items[i])] = i
            except BrokenProcessPool as exc:  # it broke while the jobs were handed in: the rest were never sent
                unfinished.extend(indices[slot:])
                why = _describe(exc)
                break
        try:
            while pending:
                ready, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in ready:
                    index = pending.pop(future)
                    try:
                        yield index, future.result()
                    except BrokenProcessPool as exc:
                        unfinished.append(index)
                        why = _describe(exc)
                    except InputError:
                        raise
                    except Exception as exc:  # noqa: BLE001 - one job's failure never stops the others
                        yield index, JobFailed(_describe(exc))
        except BaseException:
            # interrupted (Ctrl-C), or the caller stopped taking results: the jobs still running are
            # abandoned, so their workers end now; leaving the pool would wait for every job handed to it
            _end_workers(pool)
            raise
        finally:
            for future in pending:
                future.cancel()
    ran = {i for slot, i in enumerate(indices) if started[slot]}
    return [i for i in unfinished if i in ran], [i for i in unfinished if i not in ran], why


def _end_workers(pool: ProcessPoolExecutor) -> None:
    """Kill a pool's worker processes and stop it without waiting for the jobs they were running."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError):
            process.kill()
    pool.shutdown(wait=False, cancel_futures=True)


_started: Any = None  # in a pool worker: the flags of the jobs of its round


def _init_worker(started: Any, driver: int) -> None:
    """A pool worker flags the jobs it starts, and dies with the driver (Linux PR_SET_PDEATHSIG, or at once
    when the driver died before it asked), so that no job outlives it."""
    global _started
    _started = started
    die_with(driver)


def die_with(parent: int) -> None:
    """This process is killed when process `parent` dies (Linux prctl PR_SET_PDEATHSIG), and exits at once if
    `parent` is gone already: a child whose parent died before the request is adopted, its parent pid changes,
    and the signal never comes (prctl(2))."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


def _tracked(fn: Callable[[T], R], slot: int, item: T) -> R:
    _started[slot] = 1
    return fn(item)


def _run_ray(fn: Callable[[T], R], items: Sequence[T], backend: Backend) -> Iterator[tuple[int, R | JobFailed]]:
    ray = import_ray()
    started_here = connect(backend)
    try:
        task = ray.remote(_apply).options(max_retries=backend.max_retries, retry_exceptions=False)
        shared = ray.put(fn)  # shipped once (a partial may hold a cluster), handed to each task by reference
        pending = {task.remote(shared, item): i for i, item in enumerate(items)}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    index = pending.pop(ref)
                    yield index, _ray_result(ray, ref, backend.max_retries)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
    finally:
        if started_here:
            ray.shutdown()


def _apply(fn: Callable[[T], R], item: T) -> R:
    """A Ray task: any callable, a partial included (Ray makes tasks of plain functions only)."""
    return fn(item)


def _ray_result(ray: Any, ref: Any, retries: int) -> Any:
    from ray import exceptions
    try:
        return ray.get(ref)
    except exceptions.RayTaskError as exc:  # fn raised: the same exception as had it run here
        cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc
        if isinstance(cause, InputError):
            raise cause from None
        return JobFailed(_describe(cause))
    except exceptions.RayError as exc:  # the worker or its node died on every attempt, or the result was lost
        return JobFailed(f"its Ray worker died on each of {retries + 1} attempts ({_describe(exc)})")


@contextmanager
def session(backend: Backend) -> Iterator[None]:
    """Hold the Ray connection `backend` names across several `run_jobs` calls (one start, not one per
    call); nothing to do for local backends."""
    started = backend.ray is not None and connect(backend)
    try:
        yield
    finally:
        if started:
            import_ray().shutdown()


def parallelism(backend: Backend) -> int:
    """How many jobs `backend` runs at once: its pool's size, or the CPUs of the Ray cluster (inside
    `session`)."""
    if backend.ray is None:
        return max(1, backend.workers)
    return max(1, int(import_ray().cluster_resources().get("CPU", 1)))


def add_backend_options(parser: argparse.ArgumentParser, jobs_type: Callable[[str], int] = int) -> None:
    """`--jobs N` and `--ray [ADDRESS]` of a command that runs jobs (`jobs_type` parses and range-checks N)."""
    parser.add_argument("--jobs", type=jobs_type, help="local processes (default 1); with --ray, the CPUs of the local "
                                                 "Ray instance (default all)")
    parser.add_argument("--ray", nargs="?", const=RAY_LOCAL, metavar="ADDRESS",
                        help="run the jobs as Ray tasks: on the cluster at ADDRESS (host:6379, ray://host:10001, "
                             "auto), or on a Ray instance started on this machine when no address is given")


def backend_from_args(args: argparse.Namespace) -> Backend:
    if args.jobs is not None and args.jobs < 1:
        raise InputError("--jobs must be at least 1")
    if args.ray is not None:
        import_ray()  # a missing Ray or cluster is one line now, not a failure once the jobs are planned
        if args.ray != RAY_LOCAL:
            _check_reachable(args.ray)
        return Backend(workers=args.jobs or 0, ray=args.ray)
    return Backend(workers=args.jobs or 1)


def _check_reachable(address: str) -> None:
    """One line, at once, when nothing answers at `host:port` (Ray itself retries for minutes)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # `auto`, or a form Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise InputError(f"--ray {address}: nothing answers there ({_describe(exc)}); start the cluster with "
                         f"`ray start --head` and give the address it prints") from None


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InputError("--ray needs Ray on this machine and every node: pip install 'dist-sandbox[ray]'") from None
    return ray


def connect(backend: Backend) -> bool:
    """Join the Ray cluster `backend` names, or start a local instance; True when this call started the
    connection (and the caller should close it). A connection this process already holds is used as is."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    options: dict[str, Any] = dict(log_to_driver=False, configure_logging=False)
    if backend.ray == RAY_LOCAL:
        options.update(address="local", include_dashboard=False)
        if backend.workers > 0:
            options["num_cpus"] = backend.workers
    else:
        _check_reachable(backend.ray)
        options["address"] = backend.ray
    try:
        ray.init(**options)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise InputError(f"--ray {backend.ray}: cannot reach a Ray cluster there ({_describe(exc)})") from None
    return True
