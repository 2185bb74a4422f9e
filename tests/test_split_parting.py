"""The halves of a two-process step part again where nothing joins them for a while
(`dist_lib/run/split_parting.py`): the results stay one process's, to the bit, with or without it, and the
look-ahead stops where a transfer between the halves is due or not yet resolved."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dist_lib import simulate
from dist_lib.run import split_parting
from test_split import _replicas, _same_books


@pytest.fixture
def parts(monkeypatch):
    """The horizons the first process parted at (it runs in this process: the second is its fork)."""
    seen: list[float] = []
    real = split_parting.part

    def part(coordinator, until, barred):
        seen.append(until)
        real(coordinator, until, barred)

    monkeypatch.setattr(split_parting, "part", part)
    return seen


def _three(path, cluster, workload, batch, monkeypatch, worker_ranks=None, **options):
    """One process, two that part again, two in lock step from the first crossing on."""
    one = simulate(path, cluster, workload, batch, **options)
    two = simulate(path, cluster, workload, batch, workers=2, worker_ranks=worker_ranks, **options)
    with monkeypatch.context() as m:
        m.setattr(split_parting, "ENABLED", False)
        lock = simulate(path, cluster, workload, batch, workers=2, worker_ranks=worker_ranks, **options)
    _same_books(one, two)
    _same_books(one, lock)
    return one, two


def test_replicas_part_between_their_gradient_all_reduces(monkeypatch, parts):
    """Two replicas of a pipeline in the two processes: the all-reduces between them come one stage after
    another in the cool-down, and between them the halves part (an all-reduce scheduled ahead bounds it)."""
    _three("strategies/hybrid.py", "8x2xA100-80GB:nics=1x25", "toy:layers=16", 32, monkeypatch, tp=2, pp=4, dp=2,
           schedule="interleaved", fold=False, worker_ranks=_replicas(2, 4, 2, range(1, 2)))
    assert parts and any(until != float("inf") for until in parts)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2, 4]), dp=st.sampled_from([2, 3, 4]),
       schedule=st.sampled_from(["gpipe", "1f1b", "interleaved"]), per=st.integers(1, 3),
       recompute=st.booleans(), nics=st.sampled_from(["", ":nics=1x25"]))
def test_two_processes_give_the_same_results_parting_or_not(monkeypatch, tp, pp, dp, schedule, per, recompute, nics):
    """Random small hybrid steps, a node per stage of a replica, the second half of the replicas in the
    second process: parting again changes nothing."""
    microbatches = pp * per  # (interleaved wants a multiple of pp)
    _three("strategies/hybrid.py", f"{pp * dp}x{tp}xA100-80GB{nics}", "toy:layers=8", dp * microbatches, monkeypatch,
           tp=tp, pp=pp, dp=dp, schedule=schedule, recompute=recompute, fold=False,
           worker_ranks=_replicas(tp, pp, dp, range(dp // 2, dp)))


BOUNDED = '''
async def train(model, *, joined=True):
    weight, _ = model.load_weights(0)
    x = model.get_input_activation(range(model.rank, model.rank + 1))
    if model.rank == 6:  # a short message inside the second process: what tempts it to part
        await model.send(x, 4)
    elif model.rank == 4:
        await model.recv(6)
    elif model.rank == 7:
        await model.recv(5)
    elif model.rank in (1, 5):
        y = model.forward(0, x, weight)
        sent = model.send(weight, 7) if model.rank == 5 else None  # from rank 5's NIC, in flight past...
        grad, _ = model.backward(0, x, model.loss(y), weight)
        if joined:  # ...the start of the all-reduce between the halves, known from the first quiescence on
            await model.all_reduce(grad, [1, 5])
        if sent is not None:
            await sent
'''


def _events(result, rank, op):
    return [e for e in result.raw_events if e[0] == rank and e[1] == op]


def test_a_half_that_parted_stops_at_the_start_of_the_next_transfer_between_them(tmp_path, monkeypatch, parts):
    """Both halves issue the all-reduce of ranks 1 and 5 before their first quiescence, so it is resolved
    with its start known, and the second process has a short message to complete before it: they part,
    with that start as the horizon. Rank 5's message to rank 7 is in flight then and shares rank 5's NIC
    with the all-reduce from its start: the second process must stop there, not end the message at its
    speed alone."""
    path = tmp_path / "bounded.py"
    path.write_text(BOUNDED)
    one, _ = _three(path, "4x2xA100-80GB", "toy:layers=1", 8, monkeypatch, check=False)
    (reduce,) = _events(one, 5, "all_reduce")
    (message,) = _events(one, 5, "send")
    assert reduce[3] in parts  # parted with the all-reduce's start as the horizon
    assert message[3] < reduce[3] < message[4]  # the message was in flight there
    alone = simulate(path, "4x2xA100-80GB", "toy:layers=1", 8, check=False, joined=False)
    (unshared,) = _events(alone, 5, "send")
    assert unshared[3] == message[3] and unshared[4] < message[4]  # the shared NIC slowed it


UNRESOLVED = '''
async def train(model):
    weight, _ = model.load_weights(0)
    x = model.get_input_activation(range(model.rank, model.rank + 1))
    if model.rank in (1, 5):  # the first crossing: an all-reduce three backward passes ahead
        for _ in range(3):
            grad, _ = model.backward(0, x, model.loss(model.forward(0, x, weight)), weight)
        await model.all_reduce(grad, [1, 5])
    elif model.rank == 6:
        await model.send(x, 4)
    elif model.rank == 4:  # joins the all-reduce with rank 0 only once rank 6's short message has come
        got = model.recv(6)
        grad, _ = model.backward(0, x, model.loss(model.forward(0, x, weight)), weight)
        await got
        await model.all_reduce(grad, [0, 4])
    elif model.rank == 0:  # a message from rank 0's NIC in flight when that all-reduce starts
        y = model.forward(0, x, weight)
        sent = model.send(weight, 2)
        grad, _ = model.backward(0, x, model.loss(y), weight)
        await model.all_reduce(grad, [0, 4])
        await sent
    elif model.rank == 2:
        await model.recv(0)
'''


def test_the_halves_do_not_part_while_a_collective_between_them_waits_for_members(tmp_path, monkeypatch):
    """At the first quiescence rank 0 has issued its all-reduce with rank 4, which rank 4 issues only once
    a message inside the second process has ended: its start is not known yet, and rank 0's message to
    rank 2 will share rank 0's NIC with it. The only known start between the halves is the later one of
    ranks 1 and 5, so parting up to it would let the first process end rank 0's message alone: the halves
    must not part then."""
    path = tmp_path / "unresolved.py"
    path.write_text(UNRESOLVED)
    one, _ = _three(path, "4x2xA100-80GB", "toy:layers=1", 8, monkeypatch, check=False)
    (reduce,) = _events(one, 0, "all_reduce")
    (message,) = _events(one, 0, "send")
    (later,) = _events(one, 1, "all_reduce")
    assert message[3] < reduce[3] < message[4] < later[3]  # the case the test is about
