"""Score cheat: compute packed from t = 0, every wait for a received tensor undone on the clock."""
TWIN = "honest_pipeline"  # the honest strategy this cheat must not rank above
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402
_pipeline = _base.sibling("_honest_pipeline.py")


class _Packed:
    """The model, with the clock put back after every receive."""

    def __init__(self, model):
        self._model = model

    def __getattr__(self, name):
        return getattr(self._model, name)

    def recv(self, src):
        work, model = self._model.recv(src), self._model

        class _Rewound:
            def __await__(self):
                before = model._state.clock
                result = yield from work.__await__()
                model._state.clock = before  # the wait never happened
                return result
        return _Rewound()


async def train(model, microbatch_size: int = 2):
    await _pipeline.train(_Packed(model), microbatch_size)
