"""A strategy's own mistakes leave simulate() as one error naming the file, the rank or the line: a `train`
of the wrong shape or missing an option is a SpecError before the step; an exception of the strategy's,
however asyncio wraps or carries it, is a StrategyError with the rank and the strategy's line."""

from __future__ import annotations

import re
import textwrap

import pytest

from dist_lib import SpecError, simulate


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
