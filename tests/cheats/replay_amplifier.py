"""Replay amplification: writes its own header and a forged program in place of the worker's, PROGRAM_MIB of
it (16 MiB by default; the `mib` option sets it): a weight gradient sent from rank 0 to rank 1 again and
again. Each entry is a few words, but replaying it builds a message, its events and its works: such a
program once drove the grader's own process to 3 GiB. The replay now runs in a child process under the
run's own memory and time limits: the row is `invalid` (out of that memory) or `timeout`, and the grader
holds only the program's words."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import json
import os
from array import array

import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402

PROGRAM_MIB = 16


def _forge(world: int, mib: float) -> None:
    from dist_lib.run.recording import RECV, SEND, TIED
    header_fd, program_fd = _base.job()["fds"]
    pairs = int(mib * 2**20 / 8 / 5)  # a send (3 words) and a receive (2) per pair
    chunk = 2**16
    lengths = [3 + 3 * pairs, 3 + 2 * pairs] + [3] * (world - 2)
    for rank, entry in enumerate(([SEND, 0, 1], [RECV, 0])):
        os.write(program_fd, array("q", [TIED, 0, 65536]).tobytes())  # handle 0: a weight gradient
        block = array("q", entry * chunk).tobytes()
        left = pairs
        while left:
            step = min(left, chunk)
            os.write(program_fd, block[:len(block) // chunk * step])
            left -= step
    for _ in range(world - 2):
        os.write(program_fd, array("q", [TIED, 0, 65536]).tobytes())
    os.write(header_fd, json.dumps({"status": "ok", "lengths": lengths, "options": []}).encode())
    os._exit(0)


async def train(model, mib=PROGRAM_MIB):
    if model.rank == 0 and model.world_size >= 2:
        _forge(model.world_size, mib)
    await _base.train(model)
