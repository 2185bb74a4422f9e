"""In-process patch: `dist_lib.comm.collectives.Work._complete` replaced so that awaiting never moves the clock."""
TWIN = "honest_pipeline"  # the honest strategy this cheat must not rank above
import dist_lib.comm.collectives

import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402
_original = dist_lib.comm.collectives.Work._complete


def _complete(self):
    state = self.engine.ranks[self.rank]
    clock = state.clock
    result = _original(self)
    state.clock = clock
    return result


dist_lib.comm.collectives.Work._complete = _complete
train = _base.sibling("_honest_pipeline.py").train
