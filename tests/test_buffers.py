"""The two implementations of buffers and allocation logs (C and Python) keep the same books."""

from __future__ import annotations

import gc
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dist_lib.memory import buffers as python_buffers
from dist_lib.memory.buffers import decode, expand_runs

ROOT = Path(__file__).resolve().parent.parent


def _c_buffers():
    try:
        return importlib.import_module("dist_lib._buffers")
    except ImportError:
        return None


IMPLEMENTATIONS = [pytest.param(python_buffers, id="python"),
                   pytest.param(_c_buffers(), id="c", marks=pytest.mark.skipif(
                       _c_buffers() is None, reason="the C accelerator was not built"))]


class Clock:
    clock = 0.0


def make(impl):
    """A log type, a buffer kind of code 3, and a log whose clock is ours to move."""

    class Log(impl.AllocLog):
        __slots__ = ()

        def out_of_memory(self, nbytes, code):
            self.enforce = False
            raise MemoryError(f"{nbytes} of kind {code}")

    class Thing(impl.Buffer):
        __slots__ = ("label",)
        code = 3

        def __init__(self, source, nbytes, label):
            self.label = label

    log = Log()
    log.owner = Clock()
    log.capacity = 1000
    log.enforce = True
    return log, Thing


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_allocation_and_free_are_logged_with_time_bytes_and_tag(impl):
    log, Thing = make(impl)
    a = Thing(log, 100, "a")
    log.owner.clock = 2.5
    b = Thing(log, 300, "b")
    assert (log.live, log.peak, log.peak_index, len(log)) == (400, 400, 2, 2)
    tag_a = log.arrays()[2][0]
    del a
    log.owner.clock = 4.0
    times, deltas, tags = log.arrays()
    assert list(times) == [0.0, 2.5, 2.5] and list(deltas) == [100, 300, -100]
    assert tags[0] == tags[2] == tag_a and tags[0] & 7 == 3 and tags[1] != tags[0]
    assert (log.live, log.peak) == (300, 400)
    del b
    assert list(log.arrays()[1]) == [100, 300, -100, -300] and log.arrays()[0][-1] == 4.0


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_buffer_freed_with_another_attached_logs_the_attached_free_first(impl):
    """An activation freed with its stash still attached: the stash's free comes first in both
    implementations (CPython clears a subclass's slots before the C deallocator logs the buffer's free;
    the Python twin releases `_released_first` slots to match)."""
    log, Thing = make(impl)

    class Holder(Thing):
        __slots__ = ("held",)
        _released_first = ("held",)

    holder = Holder(log, 100, "activation")
    holder.held = Thing(log, 7, "stash")
    del holder
    assert list(log.arrays()[1]) == [100, 7, -7, -100]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_view_shares_the_owner_bytes_and_logs_nothing(impl):
    log, Thing = make(impl)
    owner = Thing(log, 200, "owner")
    view = Thing(owner, 0, "view")
    view_of_view = Thing(view, 0, "again")
    assert view.nbytes == view_of_view.nbytes == 200
    assert view_of_view._base is owner and view._mem is None and owner._mem is log
    del owner, view
    assert list(log.arrays()[1]) == [200]  # the last view keeps the buffer alive
    del view_of_view
    assert list(log.arrays()[1]) == [200, -200] and log.live == 0


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_going_over_capacity_calls_out_of_memory_and_the_unwinding_free_is_logged(impl):
    log, Thing = make(impl)
    keep = Thing(log, 900, "keep")
    with pytest.raises(MemoryError, match="200 of kind 3"):
        Thing(log, 200, "too much")
    assert list(log.arrays()[1]) == [900, 200, -200] and log.live == 900 and keep.nbytes == 900


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_take_hands_over_the_log_and_starts_afresh(impl):
    log, Thing = make(impl)
    a = Thing(log, 10, "a")
    b = Thing(log, 24, "b")
    del b
    before = log.arrays()
    run_first, run_time, packed, shape_bytes, shape_codes = log.take()  # as stored: one time per run
    assert (expand_runs(run_first, run_time, len(packed)), *decode(packed, shape_bytes, shape_codes)) == before
    assert len(log) == 0 and list(run_first) == [0] and list(run_time) == [before[0][0]]  # one instant: one run
    assert list(before[1]) == [10, 24, -24]
    del a
    assert list(log.arrays()[1]) == [-10] and list(decode(packed, shape_bytes, shape_codes)[0]) == [10, 24, -24]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_many_shapes_of_two_kinds_decode_to_their_bytes_kinds_and_addresses(impl):
    """Entries name a (bytes, kind) shape by number; 100 shapes (past the first index sizes) of two
    kinds, each allocated twice, decode to the bytes, kind and address of each buffer."""
    log, Thing = make(impl)

    class Other(impl.Buffer):
        __slots__ = ()
        code = 5

    log.capacity = 10**9
    made = [cls(log, 1000 + size, "x") if cls is Thing else cls(log, 1000 + size)
            for size in range(50) for cls in (Thing, Other, Thing)]
    _, deltas, tags = log.arrays()
    assert list(deltas) == [t.nbytes for t in made] == [1000 + s for s in range(50) for _ in range(3)]
    assert list(tags) == [id(t) | t.code for t in made]
    freed = made[1::3]
    del made[1::3]
    expected = [-t.nbytes for t in freed]
    del freed
    assert sorted(log.arrays()[1][150:]) == sorted(expected)  # (a list frees its items last first)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_bad_sources_and_sizes_are_refused(impl):
    log, Thing = make(impl)
    with pytest.raises(TypeError, match="expected a memory log or a tensor to share, got NoneType"):
        Thing(None, 10, "x")
    with pytest.raises(ValueError, match="-5 bytes"):
        Thing(log, -5, "x")
    with pytest.raises(ValueError, match=f"{2**40} bytes"):  # a buffer holds less than a TiB
        Thing(log, 2**40, "x")
    assert len(log) == 0


RUN = """
import json
from dist_lib import simulate
from dist_lib.memory import tracker as memory
from dist_lib.engine import transfers
out = {"impl": memory.Buffer.__module__, "scheduler": transfers.Scheduler.__module__}
cases = {  # name: (strategy, options, cluster, layers, global batch)
    "zero": ("zero", {"stage": 3}),  # collectives and ZeRO shards
    "zero1": ("zero", {"stage": 1}),  # an update of a weight holding more than its optimizer shard allocates
    "zero_wide": ("zero", {"stage": 3, "microbatch_size": 1}, "8x8xA100-80GB", 2, 64),  # 64 shards: wide masks
    "ddp_wide": ("ddp", {"microbatch_size": 12}, "2x2xA100-80GB", 2, 96),  # samples beyond 64 bits
    "one_f_one_b": ("one_f_one_b", {}),  # point-to-point
    "ddp": ("ddp", {"microbatch_size": 1}),  # gradient accumulation (WeightGrad + WeightGrad)
    "gpipe_recompute": ("gpipe", {"recompute": True}),  # forward again: a recompute
    "hybrid_tp": ("hybrid", {"dp": 1, "pp": 2, "tp": 2, "selective_recompute": True}),  # TP slices, selective
    "hybrid_tp4": ("hybrid", {"dp": 1, "pp": 1, "tp": 4}, "1x4xA100-80GB", 4, 16),  # forwards of TP slices 1-3, partial-sum all-reduces
    # the backward of TP slices 1-3 whole, then split and sequence-parallel (its compute mode in the event)
    "hybrid_tp4_sync": ("hybrid", {"dp": 1, "pp": 1, "tp": 4, "async_tp_allreduce": False}, "1x4xA100-80GB", 4,
                        16),
    "hybrid_tp_sp": ("hybrid", {"dp": 1, "pp": 2, "tp": 2, "sequence_parallel": True, "selective_recompute": True}),
    "hybrid_tp_recompute": ("hybrid", {"dp": 1, "pp": 2, "tp": 2, "recompute": True}),  # a TP slice's re-run
    # re-runs of TP slices 1-3 on samples beyond 64 bits (recompute detection, bit counts of wide masks)
    "hybrid_tp4_recompute_wide": ("hybrid", {"dp": 1, "pp": 1, "tp": 4, "recompute": True, "microbatch_size": 24},
                                  "1x4xA100-80GB", 2, 96),
    "zero_bubble": ("zero_bubble", {}),  # split backward
    "zero_bubble_recompute": ("zero_bubble", {"recompute": True, "max_in_flight": 3}),  # deferred W after a re-run
    # plain stages: each chunk's layers as one run (`Model.forward_layers`, `backward_layers`), the last
    # microbatch's backward op by op
    "hybrid_runs": ("hybrid", {"dp": 2, "pp": 2, "microbatch_size": 1, "fold": False}, "1x4xA100-80GB", 8, 16),
}
for name, (strategy, options, *shape) in cases.items():
    cluster, layers, batch = shape or ("2x2xA100-80GB", 4, 16)
    options.setdefault("microbatch_size", 2)
    r = simulate(f"strategies/{strategy}.py", cluster, f"toy:layers={layers}", batch, **options)
    out[name] = {"time": r.time_s, "peaks": r.memory_bytes, "logs": [[list(d), list(k)] for d, _, k in r.memory_log],
                 "timelines": [list(t) for t, _ in r.timelines],
                 "events": [[str(x) for x in e] for e in r.raw_events]}
print(json.dumps(out))
"""


def _run(pure: bool, program: str = RUN) -> dict:
    env = dict(os.environ)
    env.pop("DIST_SANDBOX_PURE_PYTHON", None)
    if pure:
        env["DIST_SANDBOX_PURE_PYTHON"] = "1"
    out = subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(_c_buffers() is None, reason="the C accelerator was not built")
def test_a_step_keeps_the_same_books_and_events_in_c_and_in_python():
    """The C buffers, the C ops (forward, backward, backward_input, backward_weight, gradient sum, runs of layers,
    load_weights, update, set_final_weight, all_reduce, all_gather, reduce_scatter, send, recv and a message's
    end), the C event packing and the C transfer scheduler against their Python twins, over steps that take
    every path: the fast one (TP slices, selective recompute and sequence parallelism included; split backward
    as hybrid's TP and zero-bubble schedules run it), and each that falls back to Python (an update that
    allocates). `test_p2p_twins.py` compares the message path on random patterns."""
    c, python = _run(pure=False), _run(pure=True)
    assert (c["impl"], python["impl"]) == ("dist_lib._buffers", "dist_lib.memory.buffers")
    assert (c["scheduler"], python["scheduler"]) == ("dist_lib._buffers", "dist_lib.engine.transfers")
    for name in ("zero", "zero1", "zero_wide", "ddp_wide", "one_f_one_b", "ddp", "gpipe_recompute", "hybrid_tp",
                 "hybrid_tp4", "hybrid_tp4_sync", "hybrid_tp_sp", "hybrid_tp_recompute", "hybrid_tp4_recompute_wide",
                 "zero_bubble", "zero_bubble_recompute", "hybrid_runs"):
        assert c[name] == python[name], name
        assert len(c[name]["logs"][0][0]) > 20
    details = {e[11] for case in c.values() if isinstance(case, dict) for e in case["events"]}
    assert {"recompute", "selective", "selective, sequence-parallel"} <= details  # the recomputing paths ran
    ops = {name: {e[1] for e in c[name]["events"]}
           for name in ("hybrid_tp4", "hybrid_tp4_sync", "zero_bubble_recompute")}
    assert {"backward_input", "backward_weight"} <= ops["hybrid_tp4"] & ops["zero_bubble_recompute"]
    assert "backward" in ops["hybrid_tp4_sync"] and "backward_input" not in ops["hybrid_tp4_sync"]
    # each input-gradient pass freed its layer's stash and allocated the smaller one W needs (kind 5)
    for name in ("zero_bubble", "hybrid_tp4"):
        deltas, kinds = c[name]["logs"][0]
        passes = [e[1] for e in c[name]["events"] if e[0] == "0"]
        stashes = [d for d, k in zip(deltas, kinds) if k == 5 and d > 0]
        assert len(stashes) == passes.count("forward") + passes.count("backward_input"), name
    # every TP slice re-ran each of its 4 microbatches of 24 samples once, on both layers, and only those
    wide = c["hybrid_tp4_recompute_wide"]["events"]
    reruns = [e for e in wide if e[1] == "forward" and e[11] == "recompute"]
    assert len(reruns) == 4 * 4 * 2 == len([e for e in wide if e[1] == "forward"]) // 2
    assert {e[0] for e in reruns} == {"0", "1", "2", "3"}
    assert max(int(e[6]) for e in reruns).bit_length() == 96


# Calls of the backward ops, right and wrong, made by rank 0 of two (rank 1 lends it a tensor it does not
# own). Each scenario starts from fresh forwards of layers 0 and 1 (h: layer 1's input, with its stash;
# g: the gradient from the loss) and records what each call returned or raised, and the rank's clock,
# live bytes and the stash's state afterwards.
RUN_MISUSE = """
import asyncio, json
from dist_lib import TensorError, simulate
from dist_lib.memory import tracker as memory
out = {"impl": memory.Buffer.__module__, "calls": {}}
shared = {}

SCENARIOS = {  # name: the calls, given the model, the weights, h, g and rank 1's tensor
    "weight before input": lambda m, w, h, g, theirs: [m.backward_weight(1, h, g, w[1])],
    "input twice": lambda m, w, h, g, theirs: [m.backward_input(1, h, g, w[1]), m.backward_input(1, h, g, w[1])],
    "backward after input": lambda m, w, h, g, theirs: [m.backward_input(1, h, g, w[1]), m.backward(1, h, g, w[1])],
    "weight twice": lambda m, w, h, g, theirs: [m.backward_input(1, h, g, w[1]), m.backward_weight(1, h, g, w[1]),
                                                m.backward_weight(1, h, g, w[1])],
    "input of the wrong layer": lambda m, w, h, g, theirs: [m.backward_input(0, h, g, w[0])],
    "weight of the wrong layer": lambda m, w, h, g, theirs: [m.backward_input(1, h, g, w[1]),
                                                             m.backward_weight(1, h, g, w[0])],
    "gradient of other samples": lambda m, w, h, g, theirs: [
        m.backward_input(1, h, m.loss(m.forward(1, m.forward(0, m.get_input_activation([1]), w[0], stash=False), w[1],
                                                stash=False)), w[1])],
    "gradient for layer 1": lambda m, w, h, g, theirs: [m.backward_input(1, h, m.backward(1, h, g, w[1])[1], w[1])],
    "gradient slice": lambda m, w, h, g, theirs: [m.backward_input(1, h, m.split_tp(g, 0, 2), w[1])],
    "weight shard": lambda m, w, h, g, theirs: [m.backward_input(1, h, g, m.load_weights(1, 0, 2)[0])],
    "another TP slice": lambda m, w, h, g, theirs: [
        m.backward_input(1, h, g, m.load_weights(1, tp_rank=1, tp_size=2)[0])],
    "foreign activation": lambda m, w, h, g, theirs: [m.backward_weight(1, theirs, g, w[1])],
    "not tensors": lambda m, w, h, g, theirs: [m.backward_input(1, g, h, w[1])],
    "missing arguments": lambda m, w, h, g, theirs: [m.backward_input(1, h)],
    "unknown keyword": lambda m, w, h, g, theirs: [m.backward_weight(1, h, g, w[1], stash=True)],
    # valid calls off the fast path: keywords, a bool for a layer
    "keywords": lambda m, w, h, g, theirs: [m.backward_input(layer=1, act=h, grad=g, weight=w[1]),
                                            m.backward_weight(1, h, g, weight=w[1])],
    "bool layer": lambda m, w, h, g, theirs: [m.backward_input(True, h, g, w[1]), m.backward_weight(True, h, g, w[1])],
}


def describe(x):
    if isinstance(x, tuple):
        return [describe(t) for t in x]
    return [repr(x), x.nbytes, getattr(x, "tp_parts", None)]


async def train(model):
    if model.rank == 1:
        shared["theirs"] = model.forward(0, model.get_input_activation([1]), model.load_weights(0)[0], stash=False)
        return
    await asyncio.sleep(0)
    w = [model.load_weights(0)[0], model.load_weights(1)[0]]
    for name, calls in SCENARIOS.items():
        h = model.forward(0, model.get_input_activation([0]), w[0], stash=False)
        g = model.loss(model.forward(1, h, w[1]))
        stash = h._stash
        done = []
        try:
            for result in calls(model, w, h, g, shared["theirs"]):
                done.append(describe(result))
            error = None
        except (TensorError, TypeError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        out["calls"][name] = {"returned": done, "error": error, "clock": model.time, "live": model.memory_bytes,
                              "stash": [h._stash is stash, getattr(h._stash, "input_done", None)]}
        # a stash left on its activation is dropped first: an activation freed with its stash attached
        # logs the two frees in opposite orders in C and in Python (at the same instant)
        h._stash = None
        del h, g, stash, done

r = simulate(train, "2xA100-80GB", "toy:layers=2", 2, check=False)
out["events"] = [[str(x) for x in e] for e in r.raw_events]
out["logs"] = [[list(d), list(k)] for d, _, k in r.memory_log]
print(json.dumps(out))
"""


@pytest.mark.skipif(_c_buffers() is None, reason="the C accelerator was not built")
def test_the_backward_ops_fail_and_fall_back_alike_in_c_and_in_python():
    """Every wrong call of backward_input, backward_weight and backward raises the same exception with the
    same message in C and in Python, after the same changes to the clock, the memory and the stash (none);
    calls off the fast path (keywords, a bool layer) give the same results."""
    c, python = (_run(pure, RUN_MISUSE) for pure in (False, True))
    assert (c["impl"], python["impl"]) == ("dist_lib._buffers", "dist_lib.memory.buffers")
    assert c == {**python, "impl": c["impl"]}
    calls = c["calls"]
    expected = {  # the check each wrong call trips, by its own words
        "weight before input": "backward_weight before backward_input for samples 0",
        "input twice": "backward_input already ran for these samples; call backward_weight",
        "backward after input": "rank 0 backward(layer 1): backward_input already ran",
        "weight twice": "carries no stash for layer 1",
        "input of the wrong layer": "is the input of layer 1, not 0",
        "weight of the wrong layer": "belongs to layer 0",
        "gradient of other samples": "gradient of samples 1 but activation of samples 0",
        "gradient for layer 1": "is the gradient entering layer 1; backward of layer 1 needs the one from layer 2",
        "gradient slice": "all_gather the pieces in the TP group first",
        "weight shard": "holds only ZeRO shards 0 of 2",
        "another TP slice": "the stash came from TP slice 0/1, the weight is slice 1/2",
        "foreign activation": "lives on rank 1; send it here first",
        "not tensors": "expected an Activation, got ActivationGrad",
        "missing arguments": "TypeError: Model.backward_input() missing 2 required positional arguments",
        "unknown keyword": "TypeError: Model.backward_weight() got an unexpected keyword argument 'stash'",
    }
    for name, message in expected.items():
        assert message in calls[name]["error"], name
    for name in ("keywords", "bool layer"):
        assert calls[name]["error"] is None and calls[name]["stash"] == [False, None], name
    # a refused call leaves the stash where it was: still there after a wrong first call ...
    assert calls["weight before input"]["stash"] == [True, False]
    # ... and after a wrong second one still the smaller stash the input pass left, marked
    assert calls["input twice"]["stash"] == calls["backward after input"]["stash"] == [False, True]

@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_args_fill_the_named_slots_in_order_with_trailing_defaults(impl):
    log, _ = make(impl)

    class Pair(impl.Buffer):
        __slots__ = ("left", "right", "note")
        code = 1
        _args = ("right", "left", "note")
        _defaults = ("none",)

    p = Pair(log, 8, "r", "l")
    assert (p.left, p.right, p.note, p.nbytes) == ("l", "r", "none", 8)
    q = Pair(p, 0, 1, 2, "shared")
    assert (q.left, q.right, q.note, q.nbytes, q._base) == (2, 1, "shared", 8, p)
    for wrong in ((1,), (1, 2, 3, 4)):
        with pytest.raises(TypeError):
            Pair(log, 8, *wrong)
    assert log.live == 8  # a refused call leaves nothing live
    del p, q
    assert log.live == 0


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_slot_records_read_the_named_slots_of_each_object_in_order(impl):
    class Point:
        __slots__ = ("x", "y", "name")

        def __init__(self, x, y, name=None):
            self.x, self.y = x, y
            if name is not None:
                self.name = name

    points = [Point(1, 2), Point(3, 1 << 100)]
    records = impl.slot_records(points, Point, ("y", "x"))
    assert records == [(2, 1), (1 << 100, 3)]
    if impl is not python_buffers:  # tuples of ints: nothing for the cycle collector to visit
        assert not any(gc.is_tracked(r) for r in records)
    assert impl.slot_records(points, Point, ("x",)) == [(1,), (3,)]
    assert impl.slot_records([], Point, ("x", "y")) == []
    assert impl.slot_records([Point(0, 0, "a")], Point, ("name", "x")) == [("a", 0)]
    with pytest.raises(TypeError, match="item 1 is a int, not a Point"):
        impl.slot_records([Point(0, 0), 5], Point, ("x", "y"))
    with pytest.raises(AttributeError):
        impl.slot_records(points, Point, ("name",))  # a slot never set


def test_the_ops_keep_their_signatures_and_docs_whichever_implementation_runs():
    import inspect

    from dist_lib.model.handle import Model
    from dist_lib.tensors import WeightGrad

    assert list(inspect.signature(Model.forward).parameters) == ["self", "layer", "act", "weight", "stash",
                                                                 "selective_recompute", "sequence_parallel", "fp8"]
    for op in (Model.backward, Model.backward_input, Model.backward_weight):
        assert list(inspect.signature(op).parameters) == ["self", "layer", "act", "grad", "weight"]
    assert list(inspect.signature(WeightGrad.__add__).parameters) == ["self", "other"]
    assert list(inspect.signature(Model.forward_layers).parameters) == ["self", "layers", "act", "loaded"]
    assert list(inspect.signature(Model.backward_layers).parameters) == ["self", "layers", "held", "loaded", "grads"]
    assert "each layer's input" in Model.forward_layers.__doc__
    assert list(inspect.signature(Model.load_weights).parameters) == ["self", "layer", "shard", "num_shards",
                                                                      "tp_rank", "tp_size"]
    assert list(inspect.signature(Model.update).parameters) == ["self", "layer", "grad", "weight", "opt_state"]
    assert list(inspect.signature(Model.set_final_weight).parameters) == ["self", "layer", "weight"]
    for op in (Model.all_reduce, Model.all_gather, Model.reduce_scatter):
        assert list(inspect.signature(op).parameters) == ["self", "x", "group"]
    assert list(inspect.signature(Model.send).parameters) == ["self", "x", "dst"]
    assert list(inspect.signature(Model.recv).parameters) == ["self", "src"]
    assert "Adam step" in Model.update.__doc__
    assert "consumes the stash" in Model.backward.__doc__ and "consumes the stash" in Model.backward_weight.__doc__
    assert "The stash shrinks" in Model.backward_input.__doc__
