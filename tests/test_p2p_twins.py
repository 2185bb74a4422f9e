"""The C message path (`_p2p.c`: `Model.send`, `Model.recv` and the end of a message) against its Python
twin in `comm/p2p.py` and `model/handle.py`, on randomized message patterns: the same events, memory books, received
tensors and rank times, and for a faulty pattern the same exception and message."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dist_lib.model import accelerated as model_module
from dist_lib.model import handle as handle_module
from dist_lib import simulate
from dist_lib.comm import collectives as comm
from dist_lib.comm import p2p
from dist_lib.errors import SimulationError
from dist_lib.model.handle import Model

pytestmark = pytest.mark.skipif(not model_module.PYTHON_P2P, reason="the C accelerator was not built")

WORLD = 4
CLUSTER = "2x2xA100-80GB"  # NVLink within a node, the network across: two kinds of channel
BATCH = 4
KINDS = ("input", "output", "stashed input", "grad", "activation piece", "grad piece", "weight", "weight grad")
# calls that fail (each raises in both implementations, or is a keyword call that takes the Python path)
FAULTS = ("send to itself", "send out of range", "send to a bool", "send to a float", "send a number",
          "recv from itself", "recv out of range", "recv from a str", "send by keyword", "split a partial sum",
          "split out of range", "split a weight", "send another rank's tensor", "recv from a silent rank")


@contextmanager
def python_message_path():
    """The Model methods of the message path (send, recv...), p2p._finish and Work._complete (which makes a
    received tensor) as their Python twins."""
    twins = model_module.PYTHON_P2P
    methods = [name for name in twins if name != "_finish"]
    saved = {name: Model.__dict__[name] for name in methods}, p2p._finish, comm.Work._complete
    for name in methods:
        setattr(Model, name, twins[name])
    p2p._finish = twins["_finish"]
    comm.Work._complete = comm.PYTHON_TWINS.get("Work._complete", comm.Work._complete)
    try:
        yield
    finally:
        for name, method in saved[0].items():
            setattr(Model, name, method)
        p2p._finish = saved[1]
        comm.Work._complete = saved[2]


def make_tensor(model: Model, kind: str, samples: list[int], keep: list):
    x = model.get_input_activation(samples)
    if kind == "input":
        return x
    weight, _ = model.load_weights(0)
    if kind == "weight":
        return weight
    if kind == "weight grad":
        return model.tied_embedding_grad(tp_rank=model.rank % 2, tp_size=2)
    out = model.forward(0, x, weight)
    keep.append(x)  # its stash stays alive
    if kind == "stashed input":
        return x
    if kind == "output":
        return out
    grad = model.loss(out)
    if kind == "grad":
        return grad
    if kind == "activation piece":
        return model.split_tp(out, model.rank % 2, 2)
    return model.split_tp(grad, (model.rank + 1) % 3, 3)


SHARED: dict[str, object] = {}


def fault(model: Model, which: str):
    """Issue a faulty call; most raise at once, the last two later (a deadlock, another rank's tensor)."""
    rank, x = model.rank, model.get_input_activation([0])
    if which == "send to itself":
        return model.send(x, rank)
    if which == "send out of range":
        return model.send(x, WORLD)
    if which == "send to a bool":
        return model.send(x, True)
    if which == "send to a float":
        return model.send(x, float((rank + 1) % WORLD))
    if which == "send a number":
        return model.send(3, (rank + 1) % WORLD)
    if which == "recv from itself":
        return model.recv(rank)
    if which == "recv out of range":
        return model.recv(-1)
    if which == "recv from a str":
        return model.recv("0")
    if which == "send by keyword":
        return model.send(x, dst=(rank + 1) % WORLD)  # valid: its recv is never posted, an unmatched send
    if which == "split a partial sum":
        weight, _ = model.load_weights(0, tp_rank=0, tp_size=2)
        return model.split_tp(model.forward(0, x, weight), 0, 2)
    if which == "split out of range":
        return model.split_tp(x, 2, 2)
    if which == "split a weight":
        return model.split_tp(model.load_weights(0)[0], 0, 1)
    if which == "send another rank's tensor":
        return model.send(SHARED["rank 0's"], (rank + 1) % WORLD)  # (rank 0's own: an unmatched send)
    return model.recv((rank + 1) % WORLD)  # a recv nobody sends: awaited, a deadlock


@st.composite
def patterns(draw):
    """Per rank, a program: messages in one global order (so that awaiting each at once cannot deadlock),
    each end awaited at once, later or never, with compute between, and at most one faulty call."""
    messages = draw(st.lists(st.tuples(st.integers(0, WORLD - 1), st.integers(1, WORLD - 1), st.sampled_from(KINDS),
                                       st.lists(st.integers(0, BATCH - 1), min_size=1, max_size=BATCH, unique=True)),
                             min_size=1, max_size=14))
    programs: list[list[tuple]] = [[] for _ in range(WORLD)]
    for src, offset, kind, samples in messages:
        dst = (src + offset) % WORLD
        programs[src].append(("send", dst, kind, samples, draw(st.sampled_from(["now", "later", "never"]))))
        programs[dst].append(("recv", src, draw(st.sampled_from(["now", "later", "keep", "drop"]))))
    for program in programs:
        for _ in range(draw(st.integers(0, 3))):
            program.insert(draw(st.integers(0, len(program))), ("compute", draw(st.integers(1, 3))))
    if draw(st.booleans()):
        rank = draw(st.integers(0, WORLD - 1))
        programs[rank].insert(draw(st.integers(0, len(programs[rank]))), ("fault", draw(st.sampled_from(FAULTS))))
    return programs


def run(programs: list[list[tuple]]):
    """The step's books, or the error it raised (type and message)."""
    received: list[tuple] = []
    SHARED.clear()

    async def train(model: Model):
        if model.rank == 0:
            SHARED["rank 0's"] = model.get_input_activation([1])
        weight, _ = model.load_weights(0)
        later, keep = [], []
        for op in programs[model.rank]:
            if op[0] == "compute":
                for _ in range(op[1]):
                    model.forward(0, model.get_input_activation([model.rank % BATCH]), weight, stash=False)
            elif op[0] == "fault":
                work = fault(model, op[1])
                if work is not None and op[1] == "recv from a silent rank":
                    await work
            elif op[0] == "send":
                _, dst, kind, samples, when = op
                work = model.send(make_tensor(model, kind, samples, keep), dst)
                if when == "now":
                    await work
                elif when == "later":
                    later.append(work)
            else:
                _, src, when = op
                work = model.recv(src)
                if when == "now":
                    got = await work
                    received.append((model.rank, model.time, repr(got), got.nbytes, got.kind))
                    keep.append(got)
                elif when != "drop":
                    later.append(work)
        for work in later:
            got = await work
            if got is not None:
                received.append((model.rank, model.time, repr(got), got.nbytes, got.kind))

    try:
        result = simulate(train, CLUSTER, "toy:layers=1", BATCH, check=False)
    except SimulationError as error:
        return type(error).__name__, str(error)
    return (result.rank_times, [tuple(e) for e in result.raw_events],
            [(list(t), list(live)) for t, live in result.timelines],
            [(list(signed), list(kinds)) for signed, _, kinds in result.memory_log], received, result.problems)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(patterns())
def test_the_c_message_path_keeps_the_books_of_the_python_twin(programs):
    fast = run(programs)
    with python_message_path():
        slow = run(programs)
    assert fast == slow


def test_the_twins_are_installed_and_a_pattern_takes_the_fast_path():
    """The comparison above compares two implementations: C methods are on Model, and a valid message
    pattern sends and finishes its messages in C (the Python twins are not called)."""
    assert type(Model.__dict__["send"]).__name__ == "method_descriptor"
    assert type(p2p._finish).__name__ == "builtin_function_or_method"
    calls = []
    twins = model_module.PYTHON_P2P
    saved = handle_module.issue_send, handle_module.issue_recv

    def counting(name, function):
        def wrapper(*args):
            calls.append(name)
            return function(*args)
        return wrapper

    handle_module.issue_send, handle_module.issue_recv = counting("send", saved[0]), counting("recv", saved[1])
    try:
        programs = [[("send", 1, "output", [0, 1], "later")] * 5, [("recv", 0, "now")] * 5, [], []]
        books = run(programs)
    finally:
        handle_module.issue_send, handle_module.issue_recv = saved
    assert len(calls) == 1  # the first message of the channel opens it in Python; the other nine ends are C's
    assert len(books[4]) == 5 and all(kind == "activation" for *_, kind in books[4])
    assert twins["send"] is not Model.send
