"""Builds the optional C accelerator, one extension module (`dist_lib._buffers`) from `dist_lib/native/`: a
file per group of twins, named after what it mirrors (`_buffers.c` the memory bookkeeping, `_events.c` the event
log's packing, `_transfers.c` the transfer scheduler, `_tensor_ops.c` the compute and weight ops, `_comm.c`
the collectives from issue to await, `_p2p.c` the point-to-point message path, `_drive.c` the engine's
block/wake path), the helpers they share (`_common.c`, `_common.h`) and the module's one table of their entry
points (`_module.c`).

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
