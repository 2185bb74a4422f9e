"""Builds the optional C accelerator: the memory bookkeeping (`dist_lib/_buffers.c`), the hottest ops
(`dist_lib/_ops.c`, `dist_lib/_weight_ops.c`, `dist_lib/_comm_ops.c`), the resolution, start and end of
collectives and what awaiting one does (`dist_lib/_comm_resolve.c`, `dist_lib/_comm_end.c`,
`dist_lib/_work.c`), the point-to-point message path
(`dist_lib/_p2p_ops.c`), the event log's packing (`dist_lib/_events.c`), the transfer scheduler
(`dist_lib/_transfers.c`) and the engine's block/wake path (`dist_lib/_drive.c`), one extension module.

What each of these gains is measured by `benchmarks/accelerator.py` (docs/explanation/accelerator.md), with
`DIST_SANDBOX_C_OFF` switching single twins off. Everything else is in pyproject.toml. Without a C compiler the build goes on and `dist_lib/memory/buffers.py`
does the same work in Python, more slowly.
"""

import os
import runpy
from glob import glob

from setuptools import Extension, setup

# the sources' fingerprint, compiled in: `dist_lib/memory/tracker.py` uses no extension built from other sources
SOURCE_HASH = runpy.run_path(os.path.join("dist_lib", "native", "source_hash.py"))["source_hash"]()

# The C twins must round as Python does: no fused multiply-add (a * b + c rounded once), which GCC and
# Clang emit by default on targets that have it (AArch64, x86-64 built for FMA). MSVC does not contract
# unless asked to.
NO_CONTRACTION = [] if os.name == "nt" else ["-ffp-contract=off"]

# every C file of dist_lib/native/ (`_*.c`, headers `_*.h`): the ones the fingerprint covers
setup(ext_modules=[Extension("dist_lib._buffers", sorted(glob(os.path.join("dist_lib", "native", "_*.c"))),
                                 depends=sorted(glob(os.path.join("dist_lib", "native", "_*.h"))),
                                 define_macros=[("SOURCE_HASH", f'"{SOURCE_HASH}"')],
                                 extra_compile_args=NO_CONTRACTION, optional=True)])
