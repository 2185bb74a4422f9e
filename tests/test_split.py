"""A step run in two processes (`workers=2`, `dist_lib/run/split.py`) gives one process's results: the same
step time, rank times, peaks, allocation logs and events (the worker's events are logged after the
coordinator's, so they are compared as sets), and the same errors."""

from __future__ import annotations

import pytest

from dist_lib import simulate
from dist_lib.errors import CollectiveMismatchError, DeadlockError, SpecError, StrategyError

STRATEGIES = "strategies/"


def _same(one, two) -> None:
    _same_books(one, two)
    assert two.correct and one.correct


def _same_books(one, two) -> None:
    assert two.time_s == one.time_s
    assert two.rank_times == one.rank_times
    assert two.memory_bytes == one.memory_bytes
    assert list(two.timelines) == list(one.timelines)
    assert sorted(map(tuple, two.raw_events)) == sorted(map(tuple, one.raw_events))
    assert sorted(two.final_weights) == sorted(one.final_weights)


def _replicas(tp: int, pp: int, dp: int, chosen: range) -> list[int]:
    """The ranks of replicas `chosen` in `hybrid.py`'s layout, rank = (stage * dp + replica) * tp + t."""
    return [(s * dp + d) * tp + t for s in range(pp) for d in chosen for t in range(tp)]


CASES = [
    # the second half of the nodes: its DP all-reduces span both processes (collectives resolved by the first)
    ("ddp.py", "2x4xA100-80GB", "toy:layers=8", 32, {}),
    ("zero.py", "2x4xA100-80GB", "toy:layers=8", 32, {"stage": 3}),
    # pipelines across the two halves: messages between them
    ("one_f_one_b.py", "2x4xA100-80GB", "toy:layers=16", 32, {}),
    ("zero_bubble.py", "2x4xA100-80GB", "toy:layers=8", 12, {}),
    ("hetero.py", "1x4xA100-80GB+1x4xT4", "toy:layers=8", 16, {"dp": 2, "pp": 4}),
    ("hybrid.py", "4x8xA100-80GB:nics=1x25", "toy:layers=16", 64,
     {"tp": 2, "pp": 4, "dp": 4, "schedule": "interleaved", "recompute": True}),
    # replicas in each process, as a large step is meant to be split; node NICs shared by TP and PP traffic
    ("hybrid.py", "4x8xA100-80GB:nics=1x25", "toy:layers=16", 32,
     {"tp": 8, "pp": 2, "dp": 2, "schedule": "interleaved", "worker_ranks": _replicas(8, 2, 2, range(1, 2))}),
    ("hybrid.py", "6x8xA100-80GB", "gpt-1.3b", 24,
     {"tp": 8, "pp": 2, "dp": 3, "selective_recompute": True, "sequence_parallel": True,
      "worker_ranks": _replicas(8, 2, 3, range(2, 3))}),
]


@pytest.mark.parametrize("strategy, cluster, workload, batch, options", CASES,
                         ids=[f"{c[0]}-{c[1]}-{len(c[4])}" for c in CASES])
def test_two_processes_give_one_process_results(strategy, cluster, workload, batch, options):
    options = dict(options)
    chosen = options.pop("worker_ranks", None)
    one = simulate(STRATEGIES + strategy, cluster, workload, batch, **options)
    two = simulate(STRATEGIES + strategy, cluster, workload, batch, workers=2, worker_ranks=chosen, **options)
    _same(one, two)


BAD = '''
async def train(model, *, mode, absent=None):
    weight, _ = model.load_weights(0)
    if mode == "absent":  # rank `absent` waits on a message never sent instead of joining the all-reduce
        x = model.get_input_activation(range(model.rank, model.rank + 1))
        grad, _ = model.backward(0, x, model.loss(model.forward(0, x, weight)), weight)
        if model.rank == absent:
            await model.recv((absent + 1) % 8)
        await model.all_reduce(grad, list(range(model.world_size)))
    if mode == "raise" and model.rank == 6:
        raise RuntimeError("boom")
    if mode == "deadlock" and model.rank == 6:
        await model.recv(1)
    if mode == "mismatch":  # rank 5 reduce-scatters the gradient the others all-reduce
        x = model.get_input_activation(range(model.rank, model.rank + 1))
        grad, _ = model.backward(0, x, model.loss(model.forward(0, x, weight)), weight)
        reduce = model.reduce_scatter if model.rank == 5 else model.all_reduce
        await reduce(grad, list(range(model.world_size)))
'''


@pytest.fixture
def bad(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(BAD)
    return path


def test_an_error_in_the_second_process_names_its_rank_and_line(bad):
    with pytest.raises(StrategyError, match=r"rank 6: RuntimeError: boom \(at bad.py:11 in train\)"):
        simulate(bad, "2x4xA100-80GB", "toy:layers=2", 8, workers=2, mode="raise")


def test_a_deadlock_across_the_processes_lists_both_halves(bad):
    with pytest.raises(DeadlockError) as raised:
        simulate(bad, "2x4xA100-80GB", "toy:layers=2", 8, workers=2, mode="deadlock")
    text = str(raised.value)
    assert "rank 6 (t=0.000 ms) waits on recv from rank 1" in text and "rank 0 finished" in text


@pytest.mark.parametrize("absent", [1, 5])
def test_a_deadlock_on_a_collective_between_the_processes_is_described_as_in_one(bad, absent):
    """Every waiting member names the one rank that has not issued the all-reduce, whichever half it is in."""
    said = []
    for workers in (1, 2):
        with pytest.raises(DeadlockError) as raised:
            simulate(bad, "2x4xA100-80GB", "toy:layers=1", 8, workers=workers, mode="absent", absent=absent)
        said.append(str(raised.value))
    assert said[0] == said[1]
    assert said[1].count(f"ranks [{absent}] have not issued it") == 7


def test_a_collective_mismatch_across_the_processes_is_named(bad):
    said = r"collective #0 on group \[0, 1, 2, 3, 4, 5, 6, 7\]: rank [0-4] issued all_reduce\(.*\) but rank 5 issued " \
           r"reduce_scatter\(.*\) at the same position"
    for workers in (1, 2):
        with pytest.raises(CollectiveMismatchError, match=said):
            simulate(bad, "2x4xA100-80GB", "toy:layers=1", 8, workers=workers, mode="mismatch")


@pytest.mark.parametrize("kwargs, message", [
    ({"workers": 3}, "workers must be 1 or 2"),
    ({"worker_ranks": [4, 5, 6, 7]}, "give it with workers=2"),
    ({"workers": 2, "worker_ranks": [1, 2, 3]}, r"whole nodes: node 0 \(ranks 0..3\) is split, 3 of its 4"),
    ({"workers": 2, "worker_ranks": []}, "not none or all"),
])
def test_bad_splits_are_refused(kwargs, message):
    with pytest.raises(SpecError, match=message):
        simulate(STRATEGIES + "ddp.py", "2x4xA100-80GB", "toy:layers=2", 8, **kwargs)


def test_one_node_has_nothing_to_split():
    with pytest.raises(SpecError, match="has one node"):
        simulate(STRATEGIES + "ddp.py", "1x8xA100-80GB", "toy:layers=2", 8, workers=2)



def test_a_platform_without_fork_is_told(monkeypatch):
    import os
    monkeypatch.delattr(os, "fork")
    with pytest.raises(SpecError, match="os.fork is missing"):
        simulate(STRATEGIES + "ddp.py", "2x4xA100-80GB", "toy:layers=2", 8, workers=2)


DROPPED = '''
async def train(model):
    weight, _ = model.load_weights(0)
    x = model.get_input_activation(range(model.rank, model.rank + 1))
    peer = (model.rank + 4) % 8  # on the other node: the other process
    if model.rank in (0, 5):  # sends twice
        a, b = model.send(x, peer), model.send(x, peer)
        await a
        await b
    elif model.rank in (4, 1):  # drops the first message and awaits the second
        model.recv(peer)
        await model.recv(peer)
'''


def test_a_message_dropped_unawaited_between_the_processes_lands_as_in_one(tmp_path):
    """Each process drops a message from the other: it lands and is freed at its end in both runs."""
    path = tmp_path / "dropped.py"
    path.write_text(DROPPED)
    one = simulate(path, "2x4xA100-80GB", "toy:layers=1", 8, check=False)
    two = simulate(path, "2x4xA100-80GB", "toy:layers=1", 8, check=False, workers=2)
    _same_books(one, two)
    for rank in (1, 4):
        times = [t for t, _ in two.memory_timeline(rank)]
        assert times == sorted(times) and times[-1] > 0


SHARED = '''
import asyncio
seen = {}


async def train(model):
    model.load_weights(0)
    event = seen.setdefault("event", asyncio.Event())
    if model.rank == 0:
        event.set()
    else:
        await event.wait()
'''


def test_ranks_that_meet_outside_the_api_are_told_the_processes_share_nothing(tmp_path):
    """One process: rank 0 sets the event the others await. Two: the second process's ranks wait forever."""
    path = tmp_path / "shared.py"
    path.write_text(SHARED)
    assert simulate(path, "2x4xA100-80GB", "toy:layers=1", 8, check=False).time_s == 0.0
    with pytest.raises(DeadlockError, match=r"share no Python objects(.|\n)*rank 4 \(t=0.000 ms\) waits on"):
        simulate(path, "2x4xA100-80GB", "toy:layers=1", 8, check=False, workers=2)


AHEAD = '''
async def train(model, *, early):
    weight, _ = model.load_weights(0)
    x = model.get_input_activation(range(model.rank, model.rank + 1))
    node, local = divmod(model.rank, 4)
    base = 4 * node
    if local in (0, 1):  # messages to rank 3 of the node, sharing its port in, rank 1's from a little later
        if local == 1:  # (one more loss than rank 3 computes before its receives: a few microseconds)
            y = model.forward(0, x, weight)
            model.loss(y)
            model.backward(0, x, model.loss(y), weight)
        for _ in range(3 if local == 0 else 2):
            await model.send(x, base + 3)
    elif local == 3:
        grad, _ = model.backward(0, x, model.loss(model.forward(0, x, weight)), weight)
        got = [model.recv(base + src) for src in (0, 0, 0, 1, 1)]
        if node == early:  # joins the all-reduce between the nodes after its first message, the next in flight
            await got[0]
            reduced = model.all_reduce(grad, [3, 7])
        for work in got:
            await work
        if node != early:
            reduced = model.all_reduce(grad, [3, 7])
        await reduced
'''


@pytest.mark.parametrize("early", [0, 1])
def test_a_half_that_ran_alone_hands_its_transfers_in_flight_over_as_one_process_runs_them(tmp_path, early):
    """Each half completes its own messages alone until its rank 3 joins the all-reduce between them: node
    `early`'s after its first message, with the next one part done at a shared port's speed, the other's
    after all five, later in virtual time. The step is one process's whichever half runs ahead."""
    path = tmp_path / "ahead.py"
    path.write_text(AHEAD)
    one = simulate(path, "2x4xA100-80GB", "toy:layers=1", 8, check=False, early=early)
    two = simulate(path, "2x4xA100-80GB", "toy:layers=1", 8, check=False, early=early, workers=2)
    _same_books(one, two)


def test_collectives_of_one_rank_are_numbered_as_in_one_process(tmp_path):
    """Collectives of no duration at the instant the messages before them end, in both halves at once:
    the op ids each half gave them alone are numbered again as one process's."""
    from test_semantics import INSTANT

    path = tmp_path / "instant.py"
    path.write_text(INSTANT + "    await model.all_reduce(grad, list(range(model.world_size)))\n")
    one = simulate(path, "2x4xA100-80GB", "toy:layers=1", 8, check=False)
    two = simulate(path, "2x4xA100-80GB", "toy:layers=1", 8, check=False, workers=2)
    _same_books(one, two)


def test_the_link_sends_the_arrays_of_a_message_raw_after_its_pickle():
    """The worker's books and events at the end: arrays out of band, whatever holds them."""
    import socket
    from array import array

    from dist_lib.run.worker_process import Link

    ours, theirs = (Link(s) for s in socket.socketpair())
    message = ("books", [array("d", [0.5, 1.5]), array("i")], {"codes": array("I", range(10_000))}, "text")
    ours.send(message, arrays=True)
    got = theirs.recv()
    assert got == message and type(got[2]["codes"]) is array
    ours.send(("quiet", 1))  # and a plain message after it
    assert theirs.recv() == ("quiet", 1)
