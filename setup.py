"""Builds the optional C accelerator: the memory bookkeeping (`dist_lib/_buffers.c`), the hottest ops
(`dist_lib/_ops.c`, `dist_lib/_weight_ops.c`, `dist_lib/_comm_ops.c`), the point-to-point message path
(`dist_lib/_p2p_ops.c`) and the event log's packing
(`dist_lib/_events.c`), one extension module.

Everything else is in pyproject.toml. Without a C compiler the build goes on and `dist_lib/buffers.py`
does the same work in Python, more slowly.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("dist_lib._buffers", ["dist_lib/_buffers.c", "dist_lib/_ops.c", "dist_lib/_weight_ops.c",
                                                        "dist_lib/_comm_ops.c", "dist_lib/_p2p_ops.c",
                                                        "dist_lib/_events.c"],
                                 depends=["dist_lib/_buffers.h", "dist_lib/_ops.h"], optional=True)])
