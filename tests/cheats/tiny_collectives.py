"""Score cheat: every collective claims to move 2 bytes (the cost model patched to see 2 bytes)."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import dist_lib.comm.collectives
import dist_lib.costs.compute

import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402

for _name in dir(dist_lib.costs.compute):
    _fn = getattr(dist_lib.costs.compute, _name)
    if callable(_fn) and any(k in _name for k in ("all_reduce", "all_gather", "reduce_scatter", "collective")):
        def _two_bytes(*args, _fn=_fn, **kwargs):
            args = tuple(2 if isinstance(a, int) and not isinstance(a, bool) and a > 2 else a for a in args)
            return _fn(*args, **kwargs)
        setattr(dist_lib.costs.compute, _name, _two_bytes)
train = _base.train
