"""Score cheat: compute packed from t = 0, every wait for a received tensor undone on the clock."""
TWIN = "honest_pipeline"  # the honest strategy this cheat must not rank above
import importlib.util as _u, pathlib as _p  # noqa: E402
_spec = _u.spec_from_file_location("cheat_base", _p.Path(__file__).with_name("_base.py"))
_base = _u.module_from_spec(_spec)
_spec.loader.exec_module(_base)
_pipeline = _base.sibling("honest_pipeline.py")


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
