"""Memory outside the limits: makes a user namespace of its own (which gives it the capabilities to mount),
mounts a tmpfs and fills it. A tmpfs's pages count against no rlimit of the run, only a memory cgroup,
which a grader run as an unprivileged user has none of: a run held 2.5 GiB against a 1 GiB limit. The
sandbox refuses new user namespaces (bubblewrap's --disable-userns) and `unshare`, `mount` and a `clone`
into new namespaces (its seccomp filter). If any step succeeds it reports so in its error; here every one
is refused and it runs its honest step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import ctypes
import os

import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402

CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
FILL_BYTES = 96 * 2**20  # over the run's 64 MiB /tmp: more than any file system the run is given holds


def _escape() -> str | None:
    """What it managed, or None when the sandbox refused it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        return None
    os.makedirs("/tmp/held", exist_ok=True)
    if libc.mount(b"none", b"/tmp/held", b"tmpfs", 0, b"size=1g") != 0:
        return "ESCAPED: made a user namespace (the mount was refused)"
    with open("/tmp/held/fill", "wb") as fh:
        for _ in range(FILL_BYTES // 2**20):
            fh.write(b"\1" * 2**20)
    return f"ESCAPED: held {FILL_BYTES // 2**20} MiB in a tmpfs of its own"


async def train(model):
    if model.rank == 0:
        escaped = _escape()
        if escaped:
            raise RuntimeError(escaped)
    await _base.train(model)
