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

from dist_lib import buffers as python_buffers
from dist_lib.buffers import decode, expand_runs

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
import dist_lib.memory as memory
out = {"impl": memory.Buffer.__module__}
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
    "hybrid_tp_recompute": ("hybrid", {"dp": 1, "pp": 2, "tp": 2, "recompute": True}),  # a TP slice's re-run
    "zero_bubble": ("zero_bubble", {}),  # split backward
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


def _run(pure: bool) -> dict:
    env = dict(os.environ)
    env.pop("DIST_SANDBOX_PURE_PYTHON", None)
    if pure:
        env["DIST_SANDBOX_PURE_PYTHON"] = "1"
    out = subprocess.run([sys.executable, "-c", RUN], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(_c_buffers() is None, reason="the C accelerator was not built")
def test_a_step_keeps_the_same_books_and_events_in_c_and_in_python():
    """The C buffers, the C ops (forward, backward, gradient sum, load_weights, update, set_final_weight,
    all_reduce, all_gather, reduce_scatter, send, recv and a message's end) and the C event
    packing against their Python twins, over steps that take every path: the fast one (TP slices and
    selective recompute included in forward), and each that falls back to Python (split backward, an
    update that allocates). `test_p2p_twins.py` compares the message path on random patterns."""
    c, python = _run(pure=False), _run(pure=True)
    assert (c["impl"], python["impl"]) == ("dist_lib._buffers", "dist_lib.buffers")
    for name in ("zero", "zero1", "zero_wide", "ddp_wide", "one_f_one_b", "ddp", "gpipe_recompute", "hybrid_tp",
                 "hybrid_tp4", "hybrid_tp_recompute", "zero_bubble"):
        assert c[name] == python[name], name
        assert len(c[name]["logs"][0][0]) > 20
    details = {e[11] for case in c.values() if isinstance(case, dict) for e in case["events"]}
    assert {"recompute", "selective"} <= details  # the recomputing paths were taken


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

    from dist_lib.model import Model
    from dist_lib.tensors import WeightGrad

    assert list(inspect.signature(Model.forward).parameters) == ["self", "layer", "act", "weight", "stash",
                                                                 "selective_recompute", "sequence_parallel"]
    assert list(inspect.signature(Model.backward).parameters) == ["self", "layer", "act", "grad", "weight"]
    assert list(inspect.signature(WeightGrad.__add__).parameters) == ["self", "other"]
    assert list(inspect.signature(Model.load_weights).parameters) == ["self", "layer", "shard", "num_shards",
                                                                      "tp_rank", "tp_size"]
    assert list(inspect.signature(Model.update).parameters) == ["self", "layer", "grad", "weight", "opt_state"]
    assert list(inspect.signature(Model.set_final_weight).parameters) == ["self", "layer", "weight"]
    for op in (Model.all_reduce, Model.all_gather, Model.reduce_scatter):
        assert list(inspect.signature(op).parameters) == ["self", "x", "group"]
    assert list(inspect.signature(Model.send).parameters) == ["self", "x", "dst"]
    assert list(inspect.signature(Model.recv).parameters) == ["self", "src"]
    assert "Adam step" in Model.update.__doc__
    assert "consumes the stash" in Model.backward.__doc__
