"""Score cheat: move each all-reduce before the backward that makes its gradient, in the recorded
program itself (edited in place once the step is over), so that communication seems to overlap."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
from dist_lib.run import recording as _rec
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


def _entries(words):
    from dist_lib.run.replay import _ARITY
    out, i = [], 0
    while i < len(words):
        op = words[i]
        size = 1 + (_ARITY.get(op) or (1 + 2 * words[i + 1] if op == _rec.INPUT else 2 + words[i + 2]))
        out.append(words[i:i + size])
        i += size
    return out


def _edit(where, model, layer):
    if where != "end":
        return
    program = model._recorder.programs[model.rank]
    entries = _entries(list(program))
    backward = next(k for k, e in enumerate(entries) if e[0] == _rec.BACKWARD)
    reduce = next(k for k, e in enumerate(entries) if e[0] == _rec.ALL_REDUCE)
    entries.insert(backward, entries.pop(reduce))
    program[:] = type(program)("q", [w for e in entries for w in e])


async def train(model):
    await _base.train(model, hook=_edit)
