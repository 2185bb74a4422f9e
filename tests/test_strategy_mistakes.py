"""A strategy's own mistakes leave simulate() as one error naming the file, the rank or the line: a `train`
of the wrong shape or missing an option is a SpecError before the step; an exception of the strategy's,
however asyncio wraps or carries it, is a StrategyError with the rank and the strategy's line."""

from __future__ import annotations

import asyncio
import inspect
import re
import sys
import textwrap

import pytest

from dist_lib import SpecError, StrategyError, TensorError, simulate


def write(tmp_path, name, source):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def test_a_required_option_not_given_names_the_file_the_option_and_how_to_pass_it(tmp_path):
    path = write(tmp_path, "needs_lr.py", """\
        async def train(model, lr):
            pass
        """)
    with pytest.raises(SpecError) as caught:
        simulate(path, "2xA100-80GB", "toy:layers=1", 2)
    assert str(caught.value) == (
        "strategy needs_lr: `train` (needs_lr.py:1) requires the option lr, which has no default; pass it to "
        "simulate() as a keyword: simulate(strategy, cluster, workload, global_batch_size, lr=...), or give it a "
        "default in train's signature")


def test_required_keyword_only_options_are_listed_together_and_given_ones_are_not():
    async def train(model, a, *, b, c, d=1):
        pass

    with pytest.raises(SpecError, match=re.escape(
            "requires the options b, c, which have no default; pass them to simulate() as keywords: "
            "simulate(strategy, cluster, workload, global_batch_size, b=..., c=...)")):
        simulate(train, "2xA100-80GB", "toy:layers=1", 2, a=1)


def test_an_option_taken_positional_only_is_refused_before_the_step():
    async def train(model, lr, /):
        pass

    with pytest.raises(SpecError, match=r"`train` \(test_strategy_mistakes.py:\d+\) takes lr before `/`, as "
                                        r"positional only; options reach it as keywords"):
        simulate(train, "2xA100-80GB", "toy:layers=1", 2, lr=1.0)


def test_a_train_with_a_yield_is_named_an_async_generator_at_the_yield(tmp_path):
    path = write(tmp_path, "yields.py", """\
        async def train(model):
            x = model.get_input_activation([0])

            async def inner():
                yield 1  # (another function's)
            yield x
        """)
    with pytest.raises(SpecError) as caught:
        simulate(path, "2xA100-80GB", "toy:layers=1", 2)
    assert str(caught.value) == (
        "strategy yields: `train` must be `async def train(model, **options)`, got an async generator function: "
        "a `yield` in train (at yields.py:6) makes it one; a strategy awaits works and returns, it does not yield")


def test_a_stop_iteration_raised_in_train_names_the_line_python_wrapped_it_from():
    # a coroutine's StopIteration becomes "RuntimeError: coroutine raised StopIteration", raised from it
    async def train(model):
        if model.rank == 1:
            raise StopIteration  # the line named
        await asyncio.sleep(0)

    line = inspect.getsourcelines(train)[1] + 2
    with pytest.raises(StrategyError) as caught:
        simulate(train, "2xA100-80GB", "toy:layers=1", 2)
    assert str(caught.value) == (f"rank 1: RuntimeError: coroutine raised StopIteration "
                                 f"(at test_strategy_mistakes.py:{line} in train)")


def test_driving_a_works_await_by_hand_names_the_line_of_the_stop_iteration():
    async def train(model):
        w, _ = model.load_weights(0)
        x = model.get_input_activation([model.rank])
        grad, _ = model.backward(0, x, model.loss(model.forward(0, x, w)), w)
        work = model.all_reduce(grad)
        next(work.__await__())  # the line named: the last member's issue completes it at once
        await work

    line = inspect.getsourcelines(train)[1] + 5
    with pytest.raises(StrategyError) as caught:
        simulate(train, "2xA100-80GB", "toy:layers=1", 2)
    assert str(caught.value) == (f"rank 1: RuntimeError: coroutine raised StopIteration "
                                 f"(at test_strategy_mistakes.py:{line} in train)")


def test_a_strategy_file_with_asyncio_in_its_name_is_the_strategys_own(tmp_path):
    path = write(tmp_path, "my_asyncio_ddp.py", """\
        import asyncio


        def sync_reduce(model, g):
            async def go():
                return await model.all_reduce(g)
            coroutine = go()
            try:
                return asyncio.run(coroutine)
            finally:
                coroutine.close()


        async def train(model):
            w, _ = model.load_weights(0)
            x = model.get_input_activation([model.rank])
            grad, _ = model.backward(0, x, model.loss(model.forward(0, x, w)), w)
            sync_reduce(model, grad)
        """)
    with pytest.raises(StrategyError) as caught:
        simulate(path, "2xA100-80GB", "toy:layers=1", 2)
    assert str(caught.value) == ("rank 0: RuntimeError: asyncio.run() cannot be called from a running event loop "
                                 "(at my_asyncio_ddp.py:9 in sync_reduce)")



@pytest.mark.parametrize("awaited", [True, False])
def test_sys_exit_in_a_task_is_the_strategy_error_of_the_rank_that_made_it(awaited):
    # asyncio re-raises a task's SystemExit out of the event loop; a rank's own SystemExit is a StrategyError
    async def die():
        await asyncio.sleep(0)
        sys.exit(2)  # the line named

    async def train(model):
        if model.rank == 1:
            task = asyncio.create_task(die())
            if awaited:
                await task
            else:
                await asyncio.sleep(0.01)

    line = inspect.getsourcelines(die)[1] + 2
    with pytest.raises(StrategyError) as caught:
        simulate(train, "2xA100-80GB", "toy:layers=1", 2)
    assert str(caught.value) == f"rank 1: SystemExit: 2 (at test_strategy_mistakes.py:{line} in die)"
    assert isinstance(caught.value.__cause__, SystemExit)


def test_a_task_of_a_task_is_its_ranks_and_other_exceptions_in_tasks_stay_themselves():
    async def die():
        raise SystemExit("bye")

    async def fails():
        raise ValueError("no")

    async def train(model):
        if model.rank == 0:
            with pytest.raises(ValueError, match="no"):
                await asyncio.create_task(fails())
            await asyncio.gather(asyncio.create_task(die()))

    with pytest.raises(StrategyError, match=r"^rank 0: SystemExit: bye \(at test_strategy_mistakes.py:\d+ in die\)$"):
        simulate(train, "2xA100-80GB", "toy:layers=1", 2)


def test_an_update_given_an_activation_for_the_optimizer_state_names_it():
    """Any tensor but an OptState in the optimizer state's place is one TensorError naming the argument, not
    an AttributeError from reading the fields an OptState has."""
    async def train(model):
        w, _ = model.load_weights(0)
        x = model.get_input_activation(range(model.global_batch_size))
        g, _ = model.backward(0, x, model.loss(model.forward(0, x, w)), w)
        model.update(0, g, w, x)

    with pytest.raises(TensorError, match=r"update\(layer 0\): opt_state must be a OptState, got Activation"):
        simulate(train, "1xA100-80GB", "toy:layers=1", 1)
