"""Waits a strategy makes through asyncio rather than a plain `await work`: several waits on one work, a
wait that times out and is made again, polling, cancelling the step's task, another thread or loop, a work
kept from an earlier step. Each either gives the plain await's step or one clear error; the C and the
Python block/wake paths give the same (the tests run in both modes of the suite)."""

from __future__ import annotations

import asyncio

import pytest

from dist_lib import DeadlockError, StrategyError, TensorError, simulate

CLUSTER, WORKLOAD, BATCH = "1x2xA100-80GB", "toy:layers=2", 4


def step(model):
    """One data-parallel step's compute; (weights, gradients) per layer."""
    share = model.global_batch_size // model.world_size
    weights = [model.load_weights(layer) for layer in range(model.num_layers)]
    x = model.get_input_activation(range(model.rank * share, (model.rank + 1) * share))
    inputs = []
    for layer, (weight, _) in enumerate(weights):
        inputs.append(x)
        x = model.forward(layer, x, weight)
    grad, grads = model.loss(x), [None] * model.num_layers
    for layer in reversed(range(model.num_layers)):
        grads[layer], grad = model.backward(layer, inputs.pop(), grad, weights[layer][0])
    return weights, grads


def finish(model, weights, reduced):
    for layer, (weight, opt) in enumerate(weights):
        model.set_final_weight(layer, model.update(layer, reduced[layer], weight, opt)[0])


async def plain(model):
    weights, grads = step(model)
    finish(model, weights, [await model.all_reduce(g) for g in grads])


def run(train):
    return simulate(train, CLUSTER, WORKLOAD, BATCH)


@pytest.fixture(scope="module")
def plain_time():
    return run(plain).time_s


async def _result(work):
    return await work


async def two_tasks(model):
    weights, grads = step(model)
    reduced = []
    for g in grads:
        work = model.all_reduce(g)
        a, b = await asyncio.gather(_result(work), _result(work))
        assert a is b
        reduced.append(a)
    finish(model, weights, reduced)


async def task_and_own_coroutine(model):
    weights, grads = step(model)
    reduced = []
    for g in grads:
        work = model.all_reduce(g)
        task = asyncio.ensure_future(_result(work))
        await asyncio.sleep(0)  # the task waits first
        reduced.append(await work)
        assert await task is reduced[-1]
    finish(model, weights, reduced)


async def wait_for_then_again(model):
    weights, grads = step(model)
    if model.rank == 1:
        await asyncio.sleep(0.2)  # (wall-clock) rank 0's first wait times out meanwhile
    reduced = []
    for g in grads:
        work = model.all_reduce(g)
        if model.rank == 0 and not reduced:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(work, 0.01)
        reduced.append(await work)
    finish(model, weights, reduced)


async def from_a_plain_callback(model):
    weights, grads = step(model)
    works = [model.all_reduce(g) for g in grads]
    loop = asyncio.get_running_loop()
    box = loop.create_future()

    async def collect():
        return [await w for w in works]

    def start():  # a task made outside any task or rank: its waits are the rank's whose works they are
        asyncio.ensure_future(collect()).add_done_callback(lambda t: box.set_result(t.result()))

    loop.call_soon(start)
    finish(model, weights, await box)


@pytest.mark.parametrize("train", [two_tasks, task_and_own_coroutine, wait_for_then_again, from_a_plain_callback])
def test_several_or_repeated_waits_on_a_work_give_the_plain_step(train, plain_time):
    assert run(train).time_s == plain_time


async def polls(model):
    weights, grads = step(model)
    works = [model.all_reduce(g) for g in grads]
    while not all(w.done for w in works):
        await asyncio.sleep(0)
    finish(model, weights, [await w for w in works])


def test_polling_a_work_is_a_deadlock_naming_the_line_not_a_hang():
    with pytest.raises(DeadlockError) as raised:
        run(polls)
    message = str(raised.value)
    assert "a rank that polls `work.done` never sees it end" in message
    assert "rank 0 (t=" in message and "yields to the event loop and waits on nothing (at test_loop_waits.py" \
        in message


async def cancels_its_task(model):
    weights, grads = step(model)
    if model.rank == 0:
        asyncio.current_task().cancel()
    finish(model, weights, [await model.all_reduce(g) for g in grads])


async def times_out(model):
    weights, grads = step(model)
    if model.rank == 1:
        await asyncio.sleep(0.3)
    async with asyncio.timeout(0.05):
        reduced = [await model.all_reduce(g) for g in grads]
    finish(model, weights, reduced)


@pytest.mark.parametrize("train", [cancels_its_task, times_out])
def test_cancelling_the_steps_task_is_the_strategys_error(train):
    with pytest.raises(StrategyError, match=r"the strategy cancelled the simulation: every rank runs in the "
                                            r"simulator's one asyncio task.*asyncio.wait_for\(work, seconds\)"):
        run(train)


def test_simulate_async_lets_its_callers_cancel_through():
    async def caller():
        from dist_lib.run.simulator import simulate_async
        task = asyncio.ensure_future(simulate_async(times_out, CLUSTER, WORKLOAD, BATCH))
        await asyncio.sleep(0.01)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(caller())


async def in_another_thread(model):
    weights, grads = step(model)
    works = [model.all_reduce(g) for g in grads]
    async def collect():
        return [await w for w in works]

    reduced = await asyncio.to_thread(asyncio.run, collect())
    finish(model, weights, reduced)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # (the thread's loop, torn down)
def test_a_work_awaited_in_another_thread_is_refused():
    with pytest.raises(TensorError, match=r"rank (\d) awaits Work\(all_reduce on rank \1, pending\) in another "
                                          r"thread or event loop than its step's"):
        run(in_another_thread)


KEPT: dict = {}


async def keeps_works(model):
    weights, grads = step(model)
    if model.rank not in KEPT:
        KEPT[model.rank] = [model.all_reduce(g) for g in grads]
    finish(model, weights, [await w for w in KEPT[model.rank]])


def test_a_work_of_an_earlier_step_is_refused():
    KEPT.clear()
    run(keeps_works)
    with pytest.raises(TensorError, match=r"rank 0 awaits Work\(all_reduce on rank 0, done\), a work of an "
                                          r"earlier step"):
        run(keeps_works)


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no str")


async def raises_unprintable(model):
    raise Unprintable()


async def awaits_a_method(model):
    weights, grads = step(model)
    await model.all_reduce


def test_messages_of_odd_exceptions():
    with pytest.raises(StrategyError, match=r"^rank 0: Unprintable: <its str\(\) raised RuntimeError> \(at "):
        run(raises_unprintable)
    with pytest.raises(StrategyError, match=r"rank 0: TypeError: a method can't be used in 'await' expression; "
                                            r"call it \(`await model.all_reduce\(x\)`"):
        run(awaits_a_method)


async def fire_and_forget(model):
    async def helper():
        raise ValueError("the helper gives up")

    asyncio.ensure_future(helper())  # nothing keeps or awaits it
    await asyncio.sleep(0)  # (it runs)
    await plain(model)


async def retrieves_it(model):
    async def helper():
        raise ValueError("handled")

    task = asyncio.ensure_future(helper())
    with pytest.raises(ValueError):
        await task
    await plain(model)


def test_a_task_that_raises_and_that_nothing_awaits_fails_the_step(plain_time):
    with pytest.raises(StrategyError, match=r"^rank [01]: a task of the rank raised ValueError: the helper gives "
                                            r"up and nothing awaited it \(at test_loop_waits.py:\d+ in helper\)$"):
        run(fire_and_forget)
    assert run(retrieves_it).time_s == plain_time  # (its error handled where it was awaited)


HELD: list = []  # tasks a strategy holds on to past the step: asyncio reports none of them by itself


async def keeps_a_raising_task(model):
    async def helper():
        raise ValueError("kept and failed")

    HELD.append(asyncio.ensure_future(helper()))
    await asyncio.sleep(0)  # (it runs, and raises)
    await plain(model)


async def keeps_a_waiting_task(model):
    never = asyncio.Event()

    async def helper():
        await never.wait()

    HELD.append(asyncio.ensure_future(helper()))
    await asyncio.sleep(0)  # (it runs up to its wait)
    await plain(model)


async def starts_a_task_last(model):
    async def helper():
        return None

    await plain(model)
    HELD.append(asyncio.ensure_future(helper()))  # the rank returns before the loop could run it


async def keeps_a_finished_task(model):
    async def helper():
        return 7

    HELD.append(asyncio.ensure_future(helper()))
    await asyncio.sleep(0)
    await plain(model)


def test_a_task_left_behind_at_the_steps_end_is_the_ranks_error(plain_time):
    try:
        with pytest.raises(StrategyError, match=r"^rank 0: a task of the rank raised ValueError: kept and failed and "
                                                r"nothing awaited it \(at test_loop_waits.py:\d+ in helper\)$"):
            run(keeps_a_raising_task)
        with pytest.raises(StrategyError, match=r"^rank 0: a task it started, keeps_a_waiting_task.<locals>.helper, "
                                                r"was still waiting \(at test_loop_waits.py:\d+ in helper\) when the "
                                                r"step ended: the rank returned from train without awaiting it"):
            run(keeps_a_waiting_task)
        with pytest.raises(StrategyError, match=r"^rank 0: a task it started, starts_a_task_last.<locals>.helper, "
                                                r"had not started when the step ended"):
            run(starts_a_task_last)
        assert all(task.done() for task in HELD)  # (the pending ones cancelled with the step)
        # a task that ran to its end is no one's error, awaited or not
        assert run(keeps_a_finished_task).time_s == plain_time
    finally:
        HELD.clear()


def test_a_rank_woken_by_a_quiescence_a_gather_reached_runs_on():
    """Rank 1 awaits its receives one by one (its own coroutine); rank 0 awaits both sends through an
    `asyncio.gather`, whose task is the last to block: the quiescence it reaches delivers the first message
    and wakes rank 1, which must run on to post its second receive (it used to stay unresumed, and the
    step failed as a hang). Each message of one sample's hidden states (2 MiB) takes 3.4 us + 2 MiB over
    NVLink3 at 0.8 x 300 GB/s, the second after rank 1 posts its receive."""
    async def train(model):
        x = model.get_input_activation([0])
        if model.rank == 0:
            await asyncio.gather(model.send(x, 1), model.send(x, 1))
        else:
            await model.recv(0)
            await model.recv(0)

    result = simulate(train, CLUSTER, WORKLOAD, BATCH, check=False)
    message = 3.4e-6 + 1024 * 1024 * 2 / (0.8 * 300e9)
    assert [(e.rank, e.op) for e in result.events] == [(0, "send"), (1, "recv")] * 2
    assert [t for e in result.events for t in (e.start, e.end)] == pytest.approx(
        [0.0, message, 0.0, message, message, 2 * message, message, 2 * message], rel=1e-12)
    assert result.rank_times == pytest.approx([2 * message] * 2, rel=1e-12)


def test_a_hang_beside_a_gather_is_the_one_error_without_asyncio_logging_the_gather(monkeypatch, caplog):
    """Rank 1 takes one message and then waits on an Event nobody sets while rank 0 gathers two sends: the
    step fails as a hang, and the gather the failure cancels leaves no 'exception was never retrieved'
    traceback on the log beside it."""
    import gc

    import dist_lib.engine.waits
    monkeypatch.setattr(dist_lib.engine.waits, "HANG_CHECK_S", 0.001)

    async def train(model):
        x = model.get_input_activation([0])
        if model.rank == 0:
            await asyncio.gather(model.send(x, 1), model.send(x, 1))
        else:
            await model.recv(0)
            await asyncio.Event().wait()

    with pytest.raises(DeadlockError, match="nothing in the step will ever complete"):
        simulate(train, CLUSTER, WORKLOAD, BATCH, check=False)
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
