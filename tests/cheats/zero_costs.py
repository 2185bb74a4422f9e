"""Cheat: monkeypatch the cost model so that every op takes no time."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import dist_lib.costs
import dist_lib.model

for _name in dir(dist_lib.costs):
    if _name.endswith("_time"):
        setattr(dist_lib.costs, _name, lambda *args, **kwargs: 0.0)
dist_lib.model._compute_cost = lambda device, workload, op, layer, n, tp, *a, **k: (0.0, 0.0)
for _name in dir(dist_lib.model):
    _obj = getattr(dist_lib.model, _name)
    if isinstance(_obj, dict) and _name.startswith("_") and "cache" in _name.lower():
        _obj.clear()

import importlib.util as _u, pathlib as _p  # noqa: E402
_spec = _u.spec_from_file_location("_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)
train = _base.train
