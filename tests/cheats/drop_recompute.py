"""Score cheat: leave the recompute forwards out of the recorded program (they cost time)."""
TWIN = "honest_pipeline"  # the honest strategy this cheat must not rank above
import dist_lib.recording as _rec

import importlib.util as _u, pathlib as _p  # noqa: E402
_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)
_pipeline = _base.sibling("honest_pipeline.py")
_emit = _rec.Recorder.emit
_seen = set()


def _emit_without_recompute(self, rank, *words):
    if words and words[0] == _rec.FORWARD:
        key = (rank, words[1], words[2])
        if words[4] & 1 and any(k[:2] == (rank, words[1]) for k in _seen):
            return  # a forward of a layer this rank ran before: a recompute, hidden
        _seen.add(key)
    _emit(self, rank, *words)


_rec.Recorder.emit = _emit_without_recompute
train = _pipeline.train
