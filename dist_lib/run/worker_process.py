"""The second process of a step in two processes (`split.py`): which ranks it runs, the socket between
the two, and starting and stopping it."""

from __future__ import annotations

import io
import os
import pickle
import signal
import socket
import struct
from array import array
from time import perf_counter
from typing import Any

from dist_lib.errors import SimulationError, SpecError, StrategyError


def worker_ranks(cluster: Any, ranks: Any) -> list[int]:
    """The ranks the second process runs: `ranks` (whole nodes), or by default the second half of the
    nodes. Replicas are the halves to choose: a message between the halves makes the two processes wait
    for each other at every quiescence."""
    if not hasattr(os, "fork"):
        raise SpecError("workers=2 forks the simulation into two processes, which this platform cannot do "
                        "(os.fork is missing: Windows); run with workers=1")
    nodes = cluster.nodes
    firsts = [0]
    for node in nodes:
        firsts.append(firsts[-1] + node.gpus)
    if ranks is None:
        if len(nodes) < 2:
            raise SpecError(f"workers=2 runs whole nodes in each process; cluster {cluster.name} has one node")
        half = min(range(1, len(nodes)), key=lambda n: abs(2 * firsts[n] - cluster.world_size))
        return list(range(firsts[half], cluster.world_size))
    try:
        chosen = sorted(set(ranks))
    except TypeError:
        raise SpecError(f"worker_ranks must be a list of ranks, got {ranks!r}") from None
    world = set(range(cluster.world_size))
    if not chosen or not set(chosen) < world:
        raise SpecError(f"worker_ranks must be some of the ranks 0..{cluster.world_size - 1}, not none or all "
                        f"of them (got {len(chosen)} ranks)")
    mine = set(chosen)
    for n, node in enumerate(nodes):
        inside = mine.intersection(range(firsts[n], firsts[n + 1]))
        if inside and len(inside) != node.gpus:
            raise SpecError(f"worker_ranks must hold whole nodes: node {n} (ranks {firsts[n]}..{firsts[n + 1] - 1}) "
                            f"is split, {len(inside)} of its {node.gpus} ranks chosen")
    return chosen


SPIN_S = 0.005  # how long a process looks for the other's answer before it sleeps until it comes


class Link:
    """Pickled messages over a socket between the two processes. A receive looks for the message for a
    while before it sleeps: the other process usually answers within microseconds, and a sleeping one
    waits tens more for the kernel to wake it, thousands of times a step."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def send(self, message: Any, *, arrays: bool = False) -> None:
        """Send `message`; with `arrays`, each `array.array` in it goes after the pickle as its raw bytes
        (the worker's books and events at the end: a GB of arrays, which pickling would copy twice)."""
        if not arrays:
            data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
            if len(data) < 1 << 16:
                self.sock.sendall(_LENGTH.pack(len(data)) + data)
            else:
                self.sock.sendall(_LENGTH.pack(len(data)))
                self.sock.sendall(data)
            return
        buffers: list[pickle.PickleBuffer] = []
        out = io.BytesIO()
        _ArrayPickler(out, pickle.HIGHEST_PROTOCOL, buffer_callback=buffers.append).dump(message)
        raws = [buffer.raw() for buffer in buffers]
        self.sock.sendall(_LENGTH.pack(out.tell() | _ARRAYS) + _LENGTH.pack(len(raws))
                          + b"".join(_LENGTH.pack(raw.nbytes) for raw in raws))
        self.sock.sendall(out.getbuffer())
        for raw in raws:
            self.sock.sendall(raw)

    def recv(self, spin: bool = True) -> Any:
        """The next message; without `spin`, sleep until it comes at once (an answer not expected soon)."""
        sock = self.sock
        head = b""
        deadline = 0.0
        while not head:
            try:
                head = sock.recv(_LENGTH.size, socket.MSG_DONTWAIT)
            except BlockingIOError:
                now = perf_counter()
                if spin and not deadline:
                    deadline = now + SPIN_S
                elif not spin or now > deadline:
                    head = sock.recv(_LENGTH.size)  # sleep until it comes
                    if not head:
                        raise EOFError
            else:
                if not head:
                    raise EOFError
        head += self._exactly(_LENGTH.size - len(head))
        length = _LENGTH.unpack(head)[0]
        if not length & _ARRAYS:
            return pickle.loads(self._exactly(length))
        count = _LENGTH.unpack(self._exactly(_LENGTH.size))[0]
        sizes = struct.unpack(f"<{count}Q", self._exactly(count * _LENGTH.size)) if count else ()
        data = self._exactly(length & ~_ARRAYS)
        return pickle.loads(data, buffers=[self._exactly(size) for size in sizes])

    def _exactly(self, n: int) -> bytes | bytearray:
        sock = self.sock
        if n < 1 << 16:
            data = sock.recv(n, socket.MSG_WAITALL)
            if len(data) != n:
                raise EOFError
            return data
        buffer = bytearray(n)
        view, got = memoryview(buffer), 0
        while got < n:
            size = sock.recv_into(view[got:], n - got)
            if not size:
                raise EOFError
            got += size
        return buffer

    def close(self) -> None:
        self.sock.close()


_LENGTH = struct.Struct("<Q")
_ARRAYS = 1 << 63  # in a message's length: raw arrays follow its pickle


class _ArrayPickler(pickle.Pickler):
    """Pickles each `array.array` as a buffer out of band (protocol 5), sent raw after the pickle."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is array:
            return _array_from, (obj.typecode, pickle.PickleBuffer(obj))
        return NotImplemented


def _array_from(typecode: str, buffer: Any) -> array:
    made = array(typecode)
    made.frombytes(buffer)
    return made


def fork_worker(run_worker: Any) -> tuple[int, Link]:
    """Start the worker: a fork of this process that runs `run_worker(conn)` and exits; the parent gets
    its pid and its end of the link."""
    parent, child = (Link(sock) for sock in socket.socketpair())
    pid = os.fork()
    if pid == 0:  # the worker: never returns into the caller's code
        parent.close()
        code = 0
        try:
            run_worker(child)
        except BaseException:  # pragma: no cover - reported to the coordinator by run_worker
            code = 1
        finally:
            os._exit(code)
    child.close()
    return pid, parent


def send_error(conn: Link, error: BaseException) -> None:
    """The worker's failure, to the coordinator: the error itself if it pickles, else its text."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        plain = isinstance(error, SimulationError) and _plain(type(error))
        error = type(error)(str(error)) if plain else StrategyError(str(error))
    try:
        conn.send(("error", error))
    except (OSError, pickle.PicklingError):
        pass


def _plain(cls: type) -> bool:
    try:
        cls("x")
        return True
    except Exception:
        return False


def stop_worker(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
