"""How `recording.py` sees a run: wrappers around the toy API's `Model` ops, its tensors' field writes and
`+` / `combine` / `shard`, the event hook that snapshots storage, and the runtime's collectives and
mailboxes (whose use outside a `Model` op the program cannot say). `install` puts them in place for one
recording and returns what `uninstall` puts back.
"""

from __future__ import annotations

import contextvars
import inspect
from typing import Any

from dist_lib.compat import _runtime
from dist_lib.compat._base import ToyModel
from dist_lib.compat._program import DERIVED, OPS

INSIDE = contextvars.ContextVar("compat_recording_inside", default=False)  # in a recorded op (per task)
_ABSENT = object()


def install(recorder: Any) -> list[tuple[Any, str, Any]]:
    """Wrap the API of `recorder.api` for `recorder`; the (owner, name, old value) to put back."""
    from dist_lib.compat import lab
    from dist_lib.compat import puzzles
    module = puzzles if recorder.api == "puzzles" else lab
    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, owner.__dict__.get(name, _ABSENT)))
        setattr(owner, name, value)

    for name, (_, _, coroutine) in OPS[recorder.api].items():
        patch(module.Model, name, (_async_op if coroutine else _sync_op)(recorder, name, getattr(module.Model, name)))
    patch(ToyModel, "_event_hook", staticmethod(recorder.on_event))
    patch(ToyModel, "_setup", _setup(recorder, ToyModel._setup))
    patch(_runtime.World, "collective", _outside(recorder, _runtime.World.collective, "a collective"))
    patch(_runtime.Mailbox, "get", _outside(recorder, _runtime.Mailbox.get, "a mailbox's get"))
    patch(_runtime.Mailbox, "put", _put(recorder, _runtime.Mailbox.put))

    def __setattr__(tensor: Any, field: str, value: Any) -> None:
        object.__setattr__(tensor, field, value)
        recorder.touched(tensor)
    for cls in recorder.classes:
        patch(cls, "__setattr__", __setattr__)
        for method in DERIVED:
            if callable(getattr(cls, method, None)):
                patch(cls, method, _derived(recorder, method, getattr(cls, method)))
    return saved


def uninstall(saved: list[tuple[Any, str, Any]]) -> None:
    for owner, name, old in reversed(saved):
        if old is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, old)
    saved.clear()


def _binder(original: Any) -> Any:
    """A function (args, kwargs) -> the call's arguments by position with defaults filled in, or None when they
    do not fit (the op then raises as it would)."""
    signature = inspect.signature(original)
    count = len(signature.parameters) - 1  # after self
    defaults = original.__defaults__ or ()

    def bound(model: Any, args: tuple, kwargs: dict) -> tuple | None:
        missing = count - len(args)
        if not kwargs and 0 <= missing <= len(defaults):
            return args + defaults[len(defaults) - missing:] if missing else args
        try:
            call = signature.bind(model, *args, **kwargs)
        except TypeError:
            return None
        call.apply_defaults()
        return tuple(call.args[1:])
    return bound


def _sync_op(recorder: Any, name: str, original: Any) -> Any:
    bind = _binder(original)

    def op(self: Any, *args: Any, **kwargs: Any) -> Any:
        positional = bind(self, args, kwargs) if recorder.active() else None
        call = recorder.call(name, self, positional) if positional is not None else None
        if call is None:
            return original(self, *args, **kwargs)
        token = INSIDE.set(True)
        try:
            out = original(self, *positional)
        except BaseException:
            # the storage as the op saw it (a lab op checks its operands are stored before its event, if any)
            recorder.on_event(self)
            recorder.done(call[0], name, call[1], None, True)
            raise
        finally:
            INSIDE.reset(token)
        recorder.done(call[0], name, call[1], out, False)
        return out
    op.__name__ = op.__qualname__ = name
    op.__doc__ = original.__doc__
    return op


def _async_op(recorder: Any, name: str, original: Any) -> Any:
    bind = _binder(original)

    async def op(self: Any, *args: Any, **kwargs: Any) -> Any:
        positional = bind(self, args, kwargs) if recorder.active() else None
        call = recorder.call(name, self, positional) if positional is not None else None
        if call is None:
            return await original(self, *args, **kwargs)
        record = call[0]
        record.busy = name
        token = INSIDE.set(True)
        try:
            out = await original(self, *positional)
        except BaseException:
            recorder.done(record, name, call[1], None, True)
            raise
        finally:
            INSIDE.reset(token)
            record.busy = None
        recorder.done(record, name, call[1], out, False)
        return out
    op.__name__ = op.__qualname__ = name
    op.__doc__ = original.__doc__
    return op


def _derived(recorder: Any, name: str, original: Any) -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if recorder.reason is None and not kwargs and not INSIDE.get() and type(out) in recorder.classes:
            recorder.made(out, name, self, args)
        return out
    method.__name__ = method.__qualname__ = name
    method.__doc__ = original.__doc__
    return method


def _setup(recorder: Any, original: Any) -> Any:
    def _setup(self: Any, rank: Any, dist: Any, layers: Any, batches: Any) -> None:
        original(self, rank, dist, layers, batches)
        recorder.setup(self, rank, layers, batches)
    return _setup


def _outside(recorder: Any, original: Any, what: str) -> Any:
    async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if recorder.active():
            recorder.stop(f"{what} was used through the Dist, not a Model op")
        return await original(self, *args, **kwargs)
    return method


def _put(recorder: Any, original: Any) -> Any:
    async def put(self: Any, item: Any) -> None:
        if recorder.active():
            recorder.stop("a mailbox's put was used through the Dist, not a Model op")
        await original(self, item)
        count = recorder.puts.get(id(self), 0)
        recorder.puts[id(self)] = count + 1
        recorder.last_put = count  # read by the send that made this put, before anything else runs
    return put
