"""Score cheat: every collective claims to move 2 bytes (the cost model patched to see 2 bytes)."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import dist_lib.comm
import dist_lib.costs

import importlib.util as _u, pathlib as _p  # noqa: E402
_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)

for _name in dir(dist_lib.costs):
    _fn = getattr(dist_lib.costs, _name)
    if callable(_fn) and any(k in _name for k in ("all_reduce", "all_gather", "reduce_scatter", "collective")):
        def _two_bytes(*args, _fn=_fn, **kwargs):
            args = tuple(2 if isinstance(a, int) and not isinstance(a, bool) and a > 2 else a for a in args)
            return _fn(*args, **kwargs)
        setattr(dist_lib.costs, _name, _two_bytes)
train = _base.train
