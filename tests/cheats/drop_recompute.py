"""Score cheat: leave the recompute forwards out of the recorded program (they cost time)."""
TWIN = "honest_pipeline"  # the honest strategy this cheat must not rank above
from dist_lib.run import recording as _rec
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402
_pipeline = _base.sibling("_honest_pipeline.py")
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
