"""In-process patch: `dist_lib.comm.Work._complete` replaced so that awaiting never moves the clock."""
TWIN = "honest_pipeline"  # the honest strategy this cheat must not rank above
import dist_lib.comm

import importlib.util as _u, pathlib as _p  # noqa: E402
_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)
_original = dist_lib.comm.Work._complete


def _complete(self):
    state = self.engine.ranks[self.rank]
    clock = state.clock
    result = _original(self)
    state.clock = clock
    return result


dist_lib.comm.Work._complete = _complete
train = _base.sibling("honest_pipeline.py").train
