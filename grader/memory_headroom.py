"""`--memory-headroom` of `run` and `plan`: the runtime reserve a real run keeps of each GPU
(`dist_lib.hardware.reserve`), on by default."""

from __future__ import annotations

import argparse
from typing import Any

from dist_lib import SpecError

from .errors import InputError

HEADROOM_HELP = ("what a real run keeps of each GPU besides tensors: 'default' (CUDA context 512 MiB, 320 MiB of "
                 "NCCL buffers per communicator, 10 %% fragmentation; docs/reference/memory-reserve.md), 'off', or "
                 "overrides such as context=1GiB,communicator=1GiB,fragmentation=0.15")


def add_headroom_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--memory-headroom", default="default", metavar="SPEC", help=HEADROOM_HELP)


def headroom(text: str) -> Any:
    """The `--memory-headroom` flag as a `MemoryReserve` (None: off), or one line naming the flag."""
    from dist_lib.hardware.reserve import memory_reserve
    try:
        return memory_reserve(text, "--memory-headroom")
    except SpecError as exc:
        raise InputError(str(exc)) from None
