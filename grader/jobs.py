"""Run a list of independent jobs in this process, a local process pool, or as Ray tasks.

A job is one call `fn(item)` on plain, picklable data returning plain data. `run_jobs` yields
`(index, result)` pairs in the order the jobs finish, so the caller (the driver) keeps collection,
the resume file and the ranking; nothing is shared between jobs but what they return.

On Ray (`Backend(ray=...)`), each job is one task. A task whose worker process or node dies is
resubmitted by Ray itself (`max_retries`, which counts system failures only; `retry_exceptions=False`
keeps an exception raised by `fn` from being retried: it would only happen again). The driver gets
exactly one result per task however many attempts it took, so a job is never recorded twice. A job
that still has no result after its retries comes back as a `Lost` value rather than an exception, so
one lost node does not stop the other jobs. See https://docs.ray.io/en/latest/ray-core/fault_tolerance/tasks.html
for the retry semantics.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import InputError

T = TypeVar("T")
R = TypeVar("R")

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
class Lost:
    """A job with no result: its worker died on every attempt (a node lost, or killed for memory)."""

    reason: str


def run_jobs(fn: Callable[[T], R], items: Sequence[T], backend: Backend = Backend()) -> Iterator[tuple[int, R | Lost]]:
    """`(index, fn(items[index]))` for every item, as each finishes. Closing the iterator early (or an
    exception in the caller's loop) cancels the jobs not yet finished."""
    if not items:
        return iter(())
    if backend.ray is not None:
        return _run_ray(fn, items, backend)
    if backend.workers <= 1:
        return ((i, fn(item)) for i, item in enumerate(items))
    return _run_pool(fn, items, backend.workers)


def _run_pool(fn: Callable[[T], R], items: Sequence[T], workers: int) -> Iterator[tuple[int, R]]:
    # spawn, not fork: the driver may hold threads (rich's progress bar) that a fork would copy mid-lock
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending: dict[Future, int] = {pool.submit(fn, item): i for i, item in enumerate(items)}
        try:
            while pending:
                ready, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in ready:
                    yield pending.pop(future), future.result()
        finally:
            for future in pending:
                future.cancel()


def _run_ray(fn: Callable[[T], R], items: Sequence[T], backend: Backend) -> Iterator[tuple[int, R | Lost]]:
    ray = import_ray()
    started_here = connect(backend)
    try:
        task = ray.remote(fn).options(max_retries=backend.max_retries, retry_exceptions=False)
        pending = {task.remote(item): i for i, item in enumerate(items)}
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


def _ray_result(ray: Any, ref: Any, retries: int) -> Any:
    from ray import exceptions
    try:
        return ray.get(ref)
    except exceptions.RayTaskError as exc:
        raise exc.as_instanceof_cause() from None  # what fn raised, as if it had run here
    except (exceptions.WorkerCrashedError, exceptions.NodeDiedError, exceptions.ObjectLostError,
            exceptions.TaskCancelledError, exceptions.OutOfMemoryError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Lost(f"its Ray worker died on each of {retries + 1} attempts ({first})")


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
        options["address"] = backend.ray
    try:
        ray.init(**options)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise InputError(f"--ray {backend.ray}: cannot reach a Ray cluster there "
                         f"({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})") from None
    return True
