"""Attack on the grader's report: 5,000 copies of one sample's rows (`split_samples`) before an honest step,
so that copies fill most columns of the schedule that `python -m grader run` prints. The schedule knew a
letter for the training ops only and stopped the command with a KeyError; a copy is an `o` now. On the
board it is its twin's step plus the copies' time."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402

COPIES = 5000


async def train(model):
    per = model.global_batch_size // model.world_size
    x = model.get_input_activation(range(model.rank * per, (model.rank + 1) * per))
    for _ in range(COPIES):
        model.split_samples(x, [model.rank * per])
    del x
    await _base.train(model)
