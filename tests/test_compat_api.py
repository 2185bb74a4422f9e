"""The compat modules offer every public name of the original libraries with the same signature
(parameter names, order, defaults, async or not), checked against tests/compat_api_reference.txt,
and the objects behind the new names behave as the originals'."""

from __future__ import annotations

import asyncio
import inspect
import typing
from pathlib import Path

import pytest

from dist_lib.compat import drawing, lab, lab_utils, puzzles

REFERENCE = Path(__file__).parent / "compat_api_reference.txt"
MODULES = {"puzzles.lib": puzzles, "puzzles.drawing": drawing, "lab.lib": lab, "lab.utils": lab_utils}
# names ours adds beyond the originals' (helpers the runner and the tests use)
EXTRAS = {"puzzles.lib": {"stats"}, "puzzles.drawing": {"Box", "Picture", "layer_colours", "peak"},
          "lab.lib": set(), "lab.utils": set()}


def _entries() -> list[tuple[str, str]]:
    out = []
    for line in REFERENCE.read_text().splitlines():
        if line and not line.startswith("#"):
            name, spec = line.split(": ", 1)
            out.append((name, spec))
    return out


def _resolve(dotted: str):
    module_name = next(m for m in MODULES if dotted.startswith(m + "."))
    parts = dotted[len(module_name) + 1:].split(".")
    obj = MODULES[module_name]
    for part in parts:
        assert hasattr(obj, part), f"{dotted}: missing"
        obj = getattr(obj, part)
    return MODULES[module_name], parts, obj


def _same_default(ours, expression: str, module) -> bool:
    reference = eval(expression, {**vars(module), "List": typing.List})  # noqa: S307  (our own reference file)
    if type(ours) is not type(reference):
        return False
    return type(reference).__eq__ is object.__eq__ or ours == reference  # objects compare by kind


@pytest.mark.parametrize("name, spec", _entries(), ids=[n for n, _ in _entries()])
def test_name_and_signature_match_the_original(name, spec):
    module, parts, obj = _resolve(name)
    if spec == "class":
        assert isinstance(obj, type)
    elif spec == "typevar":
        assert isinstance(obj, typing.TypeVar)
    elif spec.startswith("constant "):
        assert obj == eval(spec[len("constant "):])  # noqa: S307
    else:
        is_async = spec.startswith("async ")
        assert inspect.iscoroutinefunction(obj) == is_async
        wanted = [p.strip() for p in spec.removeprefix("async ")[1:-1].split(", ") if p.strip()]
        params = list(inspect.signature(obj).parameters.values())
        if len(parts) == 2 and params and params[0].name == "self":
            params = params[1:]
        assert [p.name for p in params] == [w.split("=")[0] for w in wanted]
        for p, w in zip(params, wanted):
            if "=" in w:
                assert p.default is not inspect.Parameter.empty and _same_default(p.default, w.split("=", 1)[1],
                                                                                  module), f"{name}: {p}"
            else:
                assert p.default is inspect.Parameter.empty, f"{name}: {p} has a default the original lacks"


@pytest.mark.parametrize("module_name", list(MODULES))
def test_no_public_name_beyond_the_originals_but_the_listed_helpers(module_name):
    module = MODULES[module_name]
    listed = {n.split(".")[2] for n, _ in _entries() if n.startswith(module_name + ".")}
    ours = {n for n, v in vars(module).items() if not n.startswith("_") and getattr(v, "__module__", None)
            == module.__name__ and (inspect.isclass(v) or inspect.isfunction(v))}
    assert ours - listed == EXTRAS[module_name]


def test_dist_queues_hold_one_message_each():
    dist = puzzles.Dist(3)
    assert len(dist.queue) == 3 and all(q.maxsize == 1 and q.empty() for q in dist.queue)
    lab_dist = lab.Dist(3)
    assert sorted(lab_dist.queue) == [(i, j) for i in range(3) for j in range(3) if i != j]

    async def two_puts():
        await dist.queue[0].put("a")
        assert dist.queue[0].full() and dist.queue[0].qsize() == 1
        blocked = asyncio.ensure_future(dist.queue[0].put("b"))
        await asyncio.sleep(0)
        assert not blocked.done()  # the second message waits for the first to be taken
        assert await dist.queue[0].get() == "a"
        await blocked
        assert await dist.queue[0].get() == "b"
    asyncio.run(two_puts())


def test_dist_collectives_and_barrier_work_as_the_originals():
    async def main():
        dist = puzzles.Dist(2)
        grads = [puzzles.WeightGrad(0, 1, frozenset({r}), 2) for r in range(2)]
        summed = await asyncio.gather(*[dist.allreduce(r, grads[r], 3 * r) for r in range(2)])
        assert all(g.batches == {0, 1} and t == 3 for g, t in summed)
        shards = await asyncio.gather(*[dist.scatterreduce(r, grads[r], 0) for r in range(2)])
        assert [s.shards for s, _ in shards] == [{0}, {1}]
        whole = await asyncio.gather(*[dist.allgather(r, s, 1) for r, (s, _) in enumerate(shards)])
        assert all(w.is_complete() for w, _ in whole)
        await dist.pass_to(1, ("x", 2.0))
        assert await dist.receive(1) == ("x", 2.0)
        barrier, order = puzzles.Barrier(2), []

        async def arrive(rank):
            order.append(("in", rank))
            await barrier.wait(rank)
            order.append(("out", rank))
        await asyncio.gather(arrive(0), arrive(1))
        assert order[:2] == [("in", 0), ("in", 1)] and barrier.counter == 0
    asyncio.run(main())


def test_tensors_and_runs_draw_as_svg(capsys):
    weight = puzzles.Weight(1, 3, 0, frozenset({0}), 2)
    base, overlay = weight.draw()
    svg = weight._repr_svg_()
    # 3 layers, 4 links between them and around them, 1 shard shaded
    assert svg.startswith("<svg") and svg.count("<rect") == len(base.boxes) + len(overlay.boxes) == (3 + 4) + 1
    grad = puzzles.WeightGrad(0, 2, frozenset({0, 1}), 2, frozenset({0, 1}), 2)
    assert len(grad.draw()[1].boxes) == 4  # 2 shards x 2 batches
    dist = puzzles.Dist(1)
    model = puzzles.Model(0, dist, 1, 1)
    model.weights[0], model.opt_states[0] = model.load_weights(0)
    model.activations[0] = model.get_activation([0])
    model.forward(0, model.activations[0], model.weights[0])
    picture = drawing.draw([model])
    assert "Timesteps: 0" in capsys.readouterr().out and picture._repr_svg_().count("<rect") >= 3
    assert drawing.draw_group({"w": weight, "o": puzzles.OptState(1, 3, 0)})._repr_svg_().startswith("<svg")


def test_lab_helpers_label_the_trace_by_microbatch(tmp_path):
    batches = lab_utils.get_global_batch_list(8, 2)
    assert lab_utils.get_batch_id(batches, [2, 3]) == 1 and lab_utils.get_batch_id(batches, [1, 2]) == -1
    assert lab_utils.get_batch_id(None, [0, 1]) == -1
    assert lab_utils.get_batch_labeled_name("(forward, S=[2, 3])", 1) == "forward batch: 1"
    assert lab_utils.get_batch_labeled_name("(update)", -1) == "(update)"
    model = lab.Model(0, lab.Dist(1), 1, 2)
    model.weights[0], model.opt_states[0] = model.load_weights(0)
    model.activations[0] = model.get_input_activation([0, 1])
    model.forward(0, model.activations[0], model.weights[0])
    path = tmp_path / "traces" / "t.json"
    lab_utils.write_chrome_trace([model], str(path), batches)
    names = [e["name"] for e in __import__("json").loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    assert names == ["(load_weights)", "forward batch: 0"]


def test_runtime_predictor_is_the_models_and_prices_its_ops():
    model = lab.Model(0, lab.Dist(2), 2, 2)
    predictor = model.runtime_predictor
    assert isinstance(predictor, lab.RuntimePredictor) and predictor.world_size == 2
    h2 = 4096 * 4096
    # a weight message is a whole 16-bit H x H matrix, sharded or not; optimizer state a shard of it
    assert predictor.get_comm_bytes(lab.Weight(0, 2, 0, frozenset({0}), 2)) == 2 * h2
    assert predictor.get_comm_bytes(lab.OptState(0, 2, 0, frozenset({0}), 2)) == h2
    assert predictor.get_send_recv_time(lab.Activation(0, 2, frozenset({0}), 2)) == pytest.approx(
        1e-5 + 2 * 4096 * 1024 / (450e9 * 0.65))
    with pytest.raises(ValueError, match="Unknown type"):
        predictor.get_comm_bytes(3)
