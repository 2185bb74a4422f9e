"""The C collective path (`_comm.c`: a member's issue, its resolution, its start and end on its group's
stream, awaiting it) against its Python twins
in `comm/collectives.py` and `model/handle.py`, on randomized collective patterns over several groups: TP partial sums of
activations and gradients, TP-piece gathers, gradient all-reduces, ZeRO gathers and reduce-scatters,
awaited at once, later or never, with mismatches (different ops, layers, samples, TP slices, overlapping
parts) and misuse: the same events, memory books, results and rank times, and for a faulty pattern the
same exception and message."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dist_lib import simulate

from dist_lib.comm import collectives as comm
from dist_lib.errors import SimulationError
from dist_lib.model.handle import Model

ACCELERATED = type(comm._finish).__name__ == "builtin_function_or_method"
pytestmark = pytest.mark.skipif(not ACCELERATED, reason="the C accelerator was not built")

WORLD = 4
CLUSTER = "2x2xA100-80GB"  # NVLink within a node, the network across
BATCH = 4
LAYERS = 2
GROUPS = ((0, 1, 2, 3), (0, 1), (2, 3), (0, 2), (1, 3), (1, 2, 3))
KINDS = ("tp activation", "tp head grad", "tp layer grad", "activation pieces", "grad pieces", "weight grads",
         "tied grads", "weight shards", "optimizer shards", "grad scatter")
SAMPLES = ([0], [1], [3], [0, 1], [1, 2], [2, 3])
# a member that issues something else than the others at the same position
FAULTS = ("other op", "other layer", "other samples", "same part twice", "other TP slice", "not a member",
          "not a tensor")


@contextmanager
def python_collective_path():
    """The Model methods of the collective path, comm's resolution, start and finish, and Work._complete as
    their Python twins."""
    twins = comm.PYTHON_TWINS
    places = {name: (Model, name) for name in twins if not name.startswith(("_", "Work."))}
    places.update({name: (comm, name) for name in twins if name.startswith("_")})
    places["Work._complete"] = (comm.Work, "_complete")
    saved = {name: getattr(owner, attr) for name, (owner, attr) in places.items()}
    for name, (owner, attr) in places.items():
        setattr(owner, attr, twins[name])
    try:
        yield
    finally:
        for name, (owner, attr) in places.items():
            setattr(owner, attr, saved[name])


def complete_output(model: Model, samples: list[int], layers: int = 1):
    """The complete activation after `layers` layers of these samples."""
    x = model.get_input_activation(samples)
    for layer in range(layers):
        x = model.forward(layer, x, model.load_weights(layer)[0], stash=False)
    return x


async def make_input(model: Model, kind: str, pos: int, size: int, samples: list[int], fault: str | None,
                     group: comm.Group, keep: list):
    """This member's tensor for a collective of `kind` (or the faulty one) and the op to issue."""
    tp_rank = 0 if fault == "same part twice" else pos
    if fault == "other samples":
        samples = [(samples[0] + 1) % BATCH]
    layer = 1 if fault == "other layer" else 0
    if kind == "tp activation":
        x = complete_output(model, samples, layer)
        return "all_reduce", model.forward(layer, x, model.load_weights(layer, tp_rank=tp_rank, tp_size=size)[0],
                                           stash=False)
    if kind == "tp head grad":
        return "all_reduce", model.loss(complete_output(model, samples, LAYERS), tp_rank=tp_rank, tp_size=size)
    if kind == "tp layer grad":  # the input gradient of layer 1's TP slice: its partial sum over the group
        h = complete_output(model, samples, 1)
        weight = model.load_weights(1, tp_rank=tp_rank, tp_size=size)[0]
        out = await model.all_reduce(model.forward(1, h, weight), group)
        keep.append(h)
        return "all_reduce", model.backward_input(1, h, model.loss(out), weight)
    if kind in ("activation pieces", "grad pieces"):
        x = complete_output(model, samples, LAYERS if kind == "grad pieces" else 1 + layer)
        if kind == "grad pieces":
            x = model.loss(x)
        return "all_gather", model.split_tp(x, tp_rank, size)
    if kind in ("weight grads", "grad scatter"):
        mine = [samples[0]] if fault == "other samples" else [(samples[0] + pos) % BATCH]
        h, weight = complete_output(model, mine, 1), model.load_weights(1)[0]
        grad = model.loss(model.forward(1, h, weight))
        model.backward_input(1, h, grad, weight)
        weight_grad = model.backward_weight(1, h, grad, weight)
        if fault == "other layer":
            weight_grad = model.tied_embedding_grad()
        op = "reduce_scatter" if kind == "grad scatter" else "all_reduce"
        if fault == "other op":
            op = "all_reduce" if op == "reduce_scatter" else "reduce_scatter"
        return op, weight_grad
    if kind == "tied grads":
        return "all_reduce", model.tied_embedding_grad(tp_rank=1 if fault == "other TP slice" else 0, tp_size=2)
    shard = 0 if fault == "same part twice" else pos
    weight, opt = model.load_weights(layer, shard, size)
    return ("reduce_scatter" if fault == "other op" else "all_gather"), (opt if kind == "optimizer shards" else weight)


@st.composite
def patterns(draw):
    """Collectives in one global order (each member issues them in that order), each awaited by each
    member at once, later, never (dropped) or kept unawaited; compute between; at most one fault."""
    # a few collectives, repeated: a repeat has a cost its group knows (the C resolution's case)
    palette = draw(st.lists(st.tuples(st.sampled_from(GROUPS), st.sampled_from(KINDS), st.sampled_from(SAMPLES)),
                            min_size=1, max_size=4))
    colls = draw(st.lists(st.sampled_from(palette), min_size=1, max_size=14))
    programs: list[list[tuple]] = [[] for _ in range(WORLD)]
    faulty = draw(st.integers(0, len(colls) - 1)) if draw(st.booleans()) else -1
    fault = draw(st.sampled_from(FAULTS))
    culprit = draw(st.integers(0, WORLD - 1))
    for i, (group, kind, samples) in enumerate(colls):
        for pos, rank in enumerate(group):
            when = draw(st.sampled_from(["now", "later", "drop", "keep"]))
            wrong = fault if i == faulty and pos == culprit % len(group) else None
            # the group as a Group object (the C issue) or as ranks (the Python one)
            programs[rank].append(("coll", group, kind, samples, pos, when, wrong, draw(st.booleans())))
    for program in programs:
        for _ in range(draw(st.integers(0, 3))):
            program.insert(draw(st.integers(0, len(program))), ("compute", draw(st.integers(1, 3))))
    return programs


def describe(x) -> tuple:
    return (repr(x), x.nbytes, x.kind, getattr(x, "tp_parts", None), getattr(x, "shards", None))


def run(programs: list[list[tuple]]):
    """The step's books, or the error it raised (type and message)."""
    results: list[tuple] = []

    async def train(model: Model):
        weight = model.load_weights(0)[0]
        later, keep = [], []
        for op in programs[model.rank]:
            if op[0] == "compute":
                for _ in range(op[1]):
                    model.forward(0, model.get_input_activation([model.rank % BATCH]), weight, stash=False)
                continue
            _, group, kind, samples, pos, when, fault, as_group = op
            name, x = await make_input(model, kind, pos, len(group), samples, fault, model.group(group), keep)
            if fault == "not a member":
                group = tuple(r for r in range(WORLD) if r not in group) or group
            if fault == "not a tensor":
                x = 3
            work = getattr(model, name)(x, model.group(group) if as_group else group)
            del x
            if when == "now":
                got = await work
                results.append((model.rank, model.time, describe(got)))
                keep.append(got)
            elif when in ("later", "keep"):
                later.append((work, when))
        for work, when in later:
            if when == "later":
                results.append((model.rank, model.time, describe(await work)))

    try:
        result = simulate(train, CLUSTER, f"toy:layers={LAYERS}", BATCH, check=False)
    except SimulationError as error:
        return type(error).__name__, str(error)
    return (result.rank_times, [tuple(e) for e in result.raw_events],
            [(list(t), list(live)) for t, live in result.timelines],
            [(list(signed), list(kinds)) for signed, _, kinds in result.memory_log], results, result.problems)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(patterns())
def test_the_c_collective_path_keeps_the_books_of_the_python_twin(programs):
    fast = run(programs)
    with python_collective_path():
        slow = run(programs)
    assert fast == slow


def test_the_twins_are_installed_and_a_pattern_takes_the_fast_path():
    """The comparison above compares two implementations: the C ops are on Model, comm's resolution, start
    and finish are C functions, and a valid pattern issues, starts and ends every collective in C and
    resolves in C all but ZeRO gathers and reduce-scatters (and a collective whose cost its group has not
    computed yet, the first of its kind)."""
    assert type(Model.__dict__["all_reduce"]).__name__ == "method_descriptor"
    assert comm.PYTHON_TWINS["all_reduce"] is not Model.all_reduce
    assert type(comm.Work.__dict__["_complete"]).__name__ == "method_descriptor"
    python = {comm.PYTHON_TWINS[name].__code__: name for name in ("_resolve_ready", "_start", "_finish")}
    python[comm.release.__code__] = "release"
    python[comm.issue_collective.__code__] = "issue_collective"
    python[comm.PYTHON_TWINS["Work._complete"].__code__] = "Work._complete"
    calls = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in python:
            name = python[frame.f_code]
            calls.append((name, frame.f_locals["coll"].seq) if name == "_resolve_ready" else (name, None))

    group = (0, 1, 2, 3)
    kinds = KINDS * 2  # the second time round, every cost is known
    sys.setprofile(profile)
    try:
        books = run([[("coll", group, kind, [0, 1], pos, "now", None, True) for kind in kinds] for pos in range(WORLD)])
    finally:
        sys.setprofile(None)
    assert len(books[4]) == WORLD * len(kinds)
    per_round = len(KINDS) + 1  # (the layer-grad kind awaits one more all-reduce first)
    assert len([e for e in books[1] if e[2] == "collective"]) == WORLD * 2 * per_round
    assert {name for name, _ in calls} == {"_resolve_ready"}
    second = sorted(seq - per_round for _, seq in calls if seq >= per_round)
    assert second == [per_round - 3, per_round - 2, per_round - 1]  # weight shards, optimizer shards, scatter
