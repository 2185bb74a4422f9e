"""Cheat: monkeypatch the cost model so that every op takes no time."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import dist_lib.costs
import dist_lib.model
import dist_lib.op_costs

for _name in dir(dist_lib.costs):
    if _name.endswith("_time"):
        setattr(dist_lib.costs, _name, lambda *args, **kwargs: 0.0)
dist_lib.op_costs.compute_cost = dist_lib.model.compute_cost = lambda device, workload, op, layer, n, tp, *a, **k: (
    0.0, 0.0)
for _name in dir(dist_lib.model):
    _obj = getattr(dist_lib.model, _name)
    if isinstance(_obj, dict) and _name.startswith("_") and "cache" in _name.lower():
        _obj.clear()

import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402
train = _base.train
