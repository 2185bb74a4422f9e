"""Cheat: monkeypatch the cost model so that every op takes no time."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import dist_lib.costs.compute
import dist_lib.model.handle
import dist_lib.costs.ops

for _name in dir(dist_lib.costs.compute):
    if _name.endswith("_time"):
        setattr(dist_lib.costs.compute, _name, lambda *args, **kwargs: 0.0)
dist_lib.costs.ops.compute_cost = dist_lib.model.handle.compute_cost = lambda device, workload, op, layer, n, tp, *a, **k: (
    0.0, 0.0)
for _name in dir(dist_lib.model.handle):
    _obj = getattr(dist_lib.model.handle, _name)
    if isinstance(_obj, dict) and _name.startswith("_") and "cache" in _name.lower():
        _obj.clear()

import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402
train = _base.train
