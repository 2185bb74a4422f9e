"""A memory cgroup around one run: a cap on the real memory of all its processes together.

The rlimits a run sets on itself bound each process's address space, but a run may start up to the
process-count limit of processes, each that large. A memory cgroup counts them together (their pages,
and what they write to their private /tmp, which is memory too) and the kernel's OOM killer stops the
run at the cap. Where the grader may make one: the cgroup v1 memory controller under the grader's own
memory cgroup, or a cgroup v2 subtree delegated to it (Linux's Documentation/admin-guide/cgroup-v1/memory.rst
and cgroup-v2.rst). Elsewhere `RunCgroup.make` gives None and the run goes on with its rlimits alone.

A run's cgroup is named after the grader's process (`dist-sandbox-<pid>-<n>`), so that the next grader
removes the ones a killed grader left (`clean_stale`).
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

PREFIX = "dist-sandbox-"
_serial = itertools.count()


class RunCgroup:
    """One run's memory cgroup: `join()` (in the run's first process, before it execs) puts that process
    in it, and every process it starts after; `oom_kills()` says whether the cap stopped the run."""

    __slots__ = ("path", "version")

    def __init__(self, path: Path, version: int):
        self.path, self.version = path, version

    @classmethod
    def make(cls, limit_bytes: int) -> RunCgroup | None:
        """A new cgroup capped at `limit_bytes` of memory (and no swap beyond it), or None where the grader
        may not make one here."""
        found = own_memory_cgroup()
        if found is None:
            return None
        parent, version = found
        path = parent / f"{PREFIX}{os.getpid()}-{next(_serial)}"
        try:
            path.mkdir()
        except OSError:
            return None
        group = cls(path, version)
        try:
            if version == 1:
                _write(path / "memory.limit_in_bytes", limit_bytes)
                # (memsw, where swap accounting is on, bounds memory and swap together; else swappiness 0)
                if (path / "memory.memsw.limit_in_bytes").exists():
                    _write(path / "memory.memsw.limit_in_bytes", limit_bytes)
                else:
                    _write(path / "memory.swappiness", 0)
            else:
                _write(path / "memory.max", limit_bytes)
                if (path / "memory.swap.max").exists():
                    _write(path / "memory.swap.max", 0)
        except OSError:
            group.remove()
            return None
        return group

    def join(self) -> None:
        """Move the calling process into the cgroup (its children follow). Raises OSError when refused."""
        _write(self.path / "cgroup.procs", os.getpid())

    def oom_kills(self) -> int:
        """How many of the run's processes the cap killed (0 when the kernel does not say)."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def remove(self, wait_s: float = 1.0) -> None:
        """Remove the cgroup once its processes are gone (they may take a moment to exit after the kill);
        one still busy after `wait_s` is left for the next grader's `clean_stale`."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.02)


def own_memory_cgroup() -> tuple[Path, int] | None:
    """(the folder of this process's memory cgroup, the cgroup version) where it may make children: the
    v1 memory controller's, or the v2 one's when the memory controller is enabled for its children."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    v1 = v2 = None
    for line in lines:
        number, controllers, path = line.split(":", 2)
        if number == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    for line in mounts:
        fields = line.split()
        if " - " not in line:
            continue
        root, mount_point = fields[3], fields[4]
        kind, _, options = line.split(" - ", 1)[1].split(" ", 2)
        if v1 is not None and kind == "cgroup" and "memory" in options.split()[-1].split(","):
            folder = _inside(mount_point, root, v1)
            if folder is not None and os.access(folder, os.W_OK):
                return folder, 1
        if v1 is None and v2 is not None and kind == "cgroup2":
            folder = _inside(mount_point, root, v2)
            if folder is not None and os.access(folder, os.W_OK) and \
                    "memory" in _read(folder / "cgroup.subtree_control").split():
                return folder, 2
    return None


def stale(pid_alive) -> list[Path]:
    """Run cgroups of grader processes that no longer exist (`pid_alive(pid)` is False)."""
    found = own_memory_cgroup()
    if found is None:
        return []
    left = []
    for path in found[0].glob(f"{PREFIX}*"):
        pid = path.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            left.append(path)
    return left


def _inside(mount_point: str, root: str, path: str) -> Path | None:
    """The folder of cgroup `path` in a hierarchy mounted at `mount_point` from its `root` (a container
    sees its own cgroup as the root of the mount)."""
    prefix = root.rstrip("/")
    if path != prefix and not path.startswith(prefix + "/"):
        return None
    relative = path[len(prefix):].lstrip("/")
    folder = Path(mount_point) / relative
    return folder if folder.is_dir() else None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, value: int) -> None:
    with open(path, "w") as f:
        f.write(str(value))
