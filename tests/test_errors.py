"""Every way a strategy can go wrong ends in one clear error naming rank, op and layer — never a hang."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from dist_lib import (CollectiveMismatchError, DeadlockError, IncorrectStepError, OutOfMemoryError, ResourceError,
                      SpecError, StrategyError, TensorError, simulate)

ROOT = Path(__file__).resolve().parent.parent


def run(train, cluster="2xA100-80GB", workload="toy:layers=2", batch=2, **kw):
    return simulate(train, cluster, workload, batch, check=False, **kw)


def test_both_ranks_receiving_first_is_a_deadlock_listing_each_rank():
    async def train(model):
        other = 1 - model.rank
        await model.recv(other)
        await model.send(model.get_input_activation([0]), other)

    with pytest.raises(DeadlockError) as info:
        run(train)
    message = str(info.value)
    assert "rank 0" in message and "recv from rank 1" in message
    assert "rank 1" in message and "recv from rank 0" in message


def test_a_member_that_never_joins_is_a_deadlock_naming_it():
    async def train(model):
        w, _ = model.load_weights(0)
        x = model.get_input_activation([model.rank])
        if model.rank != 2:
            model.forward(0, x, w)
            grad = await model.all_gather(model.load_weights(0, shard=model.rank, num_shards=3)[0])
            del grad

    with pytest.raises(DeadlockError, match=r"ranks \[2\] have not issued it") as info:
        run(train, cluster="3xA100-80GB", batch=3)
    assert "rank 2 finished" in str(info.value)


def test_an_unawaited_send_nobody_receives_is_reported_at_the_end():
    async def train(model):
        if model.rank == 0:
            model.send(model.get_input_activation([0]), 1)

    with pytest.raises(DeadlockError, match="(?s)never completed.*rank 0 send to rank 1"):
        run(train)


def test_thousands_of_pending_receives_are_described_twenty_then_counted_quickly():
    """Describing a pending op scans its channel: every one of 5000 would take time quadratic in them."""
    async def train(model):
        if model.rank == 1:
            for _ in range(5000):
                model.recv(0)

    start = time.monotonic()
    with pytest.raises(DeadlockError) as info:
        run(train)
    assert time.monotonic() - start < 10
    lines = str(info.value).splitlines()
    assert lines[0] == "the step ended with communication that never completed (it would hang on a GPU):"
    assert lines[1:] == ["  rank 1 recv from rank 0: rank 0 has not sent to rank 1"] * 20 + ["  ... and 4980 more"]


def test_a_deadlock_of_many_ranks_lists_twenty_waits_then_counts_the_rest():
    async def train(model):
        await model.recv((model.rank + 1) % model.world_size)

    with pytest.raises(DeadlockError) as info:
        run(train, cluster="4x8xA100-80GB", batch=32)
    lines = str(info.value).splitlines()
    assert lines[0] == "deadlock: every unfinished rank waits on communication no rank will complete"
    # ranks 0..19 are described, the other 12 of 32 counted
    # each names the line of the strategy it waits at
    at = f"(at test_errors.py:{train.__code__.co_firstlineno + 1} in train)"
    assert lines[1:] == [f"  rank {r} (t=0.000 ms) waits on recv from rank {r + 1}: rank {r + 1} has not sent to "
                         f"rank {r} {at}" for r in range(20)] + ["  ... and 12 more"]


def test_different_ops_at_the_same_position_name_both_ranks():
    async def train(model):
        w, _ = model.load_weights(0, shard=model.rank, num_shards=2)
        if model.rank == 0:
            await model.all_gather(w)
        else:
            await model.reduce_scatter(w)

    with pytest.raises((CollectiveMismatchError, TensorError)) as info:
        run(train)
    assert "rank 1" in str(info.value)


def test_mismatched_collectives_name_ranks_and_ops():
    async def train(model):
        w, _ = model.load_weights(model.rank, shard=model.rank, num_shards=2)  # different layers!
        await model.all_gather(w)

    with pytest.raises(CollectiveMismatchError, match=r"rank 0 gave Weight\(layer 0.*rank 1 gave Weight\(layer 1"):
        run(train)


def test_double_counted_samples_across_ranks():
    async def train(model):
        w0, _ = model.load_weights(0)
        w1, _ = model.load_weights(1)
        x0 = model.get_input_activation([0])
        x1 = model.forward(0, x0, w0)
        grad = model.loss(model.forward(1, x1, w1))
        _, grad = model.backward(1, x1, grad, w1)
        wg, _ = model.backward(0, x0, grad, w0)
        await model.all_reduce(wg)

    with pytest.raises(CollectiveMismatchError,
                       match=r"all_reduce #0 on group \[0, 1\] \(layer 0\): ranks 0 and 1 both hold samples 0"):
        run(train)


@pytest.mark.parametrize("mistake, message", [
    ("wrong_layer", r"rank 0 forward\(layer 1\): .* is the input of layer 0, not 1"),
    ("zero_shard", r"holds only ZeRO shards 0 of 2; all_gather it before compute"),
    ("no_stash", r"backward\(layer 1\): .* carries no stash .* run forward\(layer 1\) again"),
    ("partial_update", r"update\(layer 1\): the gradient covers samples 0 but not 1"),
    ("update_twice", r"update\(layer 1\): layer 1 was already updated"),
    ("tp_partial", r"forward\(layer 1\): .* partial sum; all_reduce it in the TP group first"),
    ("weight_grad_first", r"backward_weight before backward_input"),
    ("foreign_tensor", r"lives on rank 1"),
    ("bad_samples", r"outside the global batch"),
    ("all_reduce_weight", r"all_reduce of a Weight"),
])
def test_tensor_misuse_names_rank_op_and_layer(mistake, message):
    shared = {}

    async def train(model):
        w1, o1 = model.load_weights(1)
        x = model.get_input_activation([0])
        if model.rank == 1:
            shared["act"] = x
            return
        await asyncio.sleep(0)
        if mistake == "wrong_layer":
            model.forward(1, x, w1)
        w0, _ = model.load_weights(0)
        if mistake == "zero_shard":
            model.forward(0, x, model.load_weights(0, shard=0, num_shards=2)[0])
        if mistake == "tp_partial":
            half = model.forward(0, x, model.load_weights(0, tp_rank=0, tp_size=2)[0])
            model.forward(1, half, w1)
        h = model.forward(0, x, w0)
        out = model.forward(1, h, w1, stash=mistake != "no_stash")
        grad = model.loss(out)
        if mistake == "weight_grad_first":
            model.backward_weight(1, h, grad, w1)
        wg, _ = model.backward(1, h, grad, w1)
        if mistake == "foreign_tensor":
            model.forward(0, shared["act"], w0)
        if mistake == "bad_samples":
            model.get_input_activation(range(1, 5))
        if mistake == "all_reduce_weight":
            model.all_reduce(w1)
        if mistake in ("partial_update", "update_twice"):
            new_w, new_o = model.update(1, wg, w1, o1) if mistake == "partial_update" else (w1, o1)

    if mistake == "update_twice":
        async def train(model):  # noqa: F811 - a separate scenario: a full-batch gradient, applied twice
            w, o = model.load_weights(1)
            h = model.get_input_activation([0, 1])
            grad = model.loss(model.forward(1, model.forward(0, h, model.load_weights(0)[0]), w))
            del grad
            hh = model.forward(0, model.get_input_activation([0, 1]), model.load_weights(0)[0])
            wg, _ = model.backward(1, hh, model.loss(model.forward(1, hh, w)), w)
            w2, o2 = model.update(1, wg, w, o)
            model.update(1, wg, w2, o2)

    with pytest.raises(TensorError, match=message):
        run(train, cluster="2xA100-80GB", batch=2)


def test_a_refused_update_leaves_the_layer_to_update():
    # an update with one rank's gradient is refused; the same layer updated with the all-reduced gradient
    # afterwards is its first update, not a second one
    refused = []

    async def train(model):
        w, o = model.load_weights(0)
        x = model.get_input_activation([model.rank])
        wg, _ = model.backward(0, x, model.loss(model.forward(0, x, w)), w)
        try:
            model.update(0, wg, w, o)
        except TensorError as exc:
            refused.append(str(exc))
        model.set_final_weight(0, model.update(0, await model.all_reduce(wg), w, o)[0])

    result = simulate(train, "2xA100-80GB", "toy:layers=1", 2)
    assert result.correct
    assert refused == [f"rank {r} update(layer 0): the gradient covers samples {r} but not {1 - r}; accumulate "
                       f"microbatches and all_reduce/reduce_scatter across data-parallel ranks first, and update "
                       f"with what awaiting that op returns (the tensor given to it keeps this rank's samples)"
                       for r in (0, 1)]


def test_updating_with_the_tensor_given_to_an_all_reduce_says_to_use_what_awaiting_it_returns():
    # PyTorch reduces in place (`dist.all_reduce(g)`, then g); here the reduced gradient is what `await` returns
    async def train(model):
        w, o = model.load_weights(0)
        x = model.get_input_activation([model.rank])
        wg, _ = model.backward(0, x, model.loss(model.forward(0, x, w)), w)
        await model.all_reduce(wg)
        if model.rank == 1:
            model.update(0, wg, w, o)

    with pytest.raises(TensorError, match=r"^rank 1 update\(layer 0\): the gradient covers samples 1 but not 0; .* "
                                          r"update with what awaiting that op returns \(the tensor given to it keeps "
                                          r"this rank's samples\)$"):
        run(train, workload="toy:layers=1")


@pytest.mark.parametrize("when", ["pending", "done"])
@pytest.mark.parametrize("inside", ["coroutine", "gather", "task of a task"])
def test_awaiting_a_work_another_rank_issued_names_both_ranks(when, inside):
    # rank 1 waits for rank 0's send itself instead of its own recv: refused, whether or not the send ended
    # (a pending one was a deadlock saying rank 1 had posted no recv, a done one went through unnoticed)
    shared = {}

    async def wrong_wait():
        await shared["send"]

    async def in_a_task():
        await asyncio.create_task(wrong_wait())

    async def train(model):
        if model.rank == 0:
            shared["send"] = model.send(model.get_input_activation([0]), 1)
            await shared["send"]
        else:
            await asyncio.sleep(0)  # rank 0 has issued its send
            received = model.recv(0)
            if when == "done":
                await received
            if inside == "coroutine":
                await shared["send"]
            else:
                await asyncio.gather(wrong_wait() if inside == "gather" else in_a_task(), received)

    with pytest.raises(TensorError, match=r"^rank 1 awaits Work\(send on rank 0, (pending|done)\), which rank 0 "
                                          r"issued; a rank awaits only its own works"):
        run(train)


def test_an_exception_in_the_strategy_names_rank_and_line():
    async def train(model):
        if model.rank == 1:
            raise ValueError("layers do not divide by 3 stages; set pp=2")

    with pytest.raises(StrategyError, match=r"rank 1: ValueError: layers do not divide .* \(at test_errors.py:\d+ in train\)"):
        run(train)


@pytest.mark.parametrize("raised", [asyncio.CancelledError, SystemExit, GeneratorExit])
def test_a_rank_raising_a_base_exception_is_reported_as_itself_with_the_rank(raised):
    async def train(model):
        await asyncio.sleep(0)
        if model.rank == 1:
            raise raised("stop here")

    with pytest.raises(StrategyError, match=rf"rank 1: {raised.__name__}: stop here "
                                            rf"\(at test_errors.py:\d+ in train\)"):
        run(train)


def test_a_keyboard_interrupt_stays_one_and_says_which_rank_and_line_it_stopped():
    async def train(model):
        await asyncio.sleep(0)
        if model.rank == 1:
            raise KeyboardInterrupt  # as Ctrl-C does, between any two bytecodes

    with pytest.raises(KeyboardInterrupt) as caught:
        run(train)
    assert re.fullmatch(r"simulate\(\) was interrupted while rank 1 ran, at t=0\.000 ms of its step "
                        r"\(at test_errors.py:\d+ in train\)", caught.value.__notes__[-1])


SPINNING = "async def train(model):\n    print('spinning', flush=True)\n    while True:\n        pass\n"


@pytest.mark.parametrize("call", ["from dist_lib import simulate; simulate({path!r}, '1x2xA100-80GB', 'toy', 2)",
                                  "from dist_lib.compat import run_file; "
                                  "run_file({path!r}, api='lab', function='train', ranks=2, layers=2, batches=2)"])
def test_ctrl_c_stops_a_rank_that_never_awaits(tmp_path, call):
    """The engine resumes ranks itself, so asyncio's own Ctrl-C handling (cancel the main task when the
    loop gets control) would wait for the step's end, forever for a rank that loops without awaiting;
    the course-lab mode's ranks are asyncio tasks, and the same loop never gives the event loop control."""
    strategy = tmp_path / "spin.py"
    strategy.write_text(SPINNING)
    # (the child starts with Ctrl-C's default action even when this run was started in the background, where the
    # shell hands its children an ignored SIGINT)
    child = subprocess.Popen([sys.executable, "-c", call.format(path=str(strategy))], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert child.stdout.readline() == "spinning\n"
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)  # a guard against a hang, not a measure of speed
    finally:
        child.kill()
    assert child.returncode != 0
    assert "KeyboardInterrupt" in err.splitlines()[-2:]
    assert "Task was destroyed" not in err  # asyncio's shutdown noise
    if "simulate" in call:
        assert re.fullmatch(r"simulate\(\) was interrupted while rank 0 ran, at t=0\.000 ms of its step "
                            r"\(at spin.py:[234] in train\)", err.splitlines()[-1])  # (the print as it returns, or the loop)


def test_simulate_puts_back_the_interrupt_handler_it_found():
    async def train(model):
        pass

    found = signal.signal(signal.SIGINT, signal.default_int_handler)  # (as an interactive run has it)
    try:
        run(train)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, found)


def test_a_memory_error_while_simulating_is_a_resource_error_not_the_strategys():
    async def train(model):
        if model.rank == 0:
            raise MemoryError

    with pytest.raises(ResourceError, match=r"rank 0: MemoryError: the simulation ran out of real memory "
                                            r"\(at test_errors.py:\d+ in train\)") as caught:
        run(train)
    assert not isinstance(caught.value, StrategyError)


def test_out_of_memory_names_rank_device_capacity_and_kinds():
    async def train(model):
        keep = [model.load_weights(layer) for layer in range(model.num_layers)]
        del keep

    with pytest.raises(OutOfMemoryError) as info:
        run(train, cluster="T4", workload="gpt-1.3b", batch=1)
    message = str(info.value)
    assert "rank 0 (T4, 16.00 GiB): out of memory" in message
    assert "load_weights(layer" in message and "weight" in message and "optimizer" in message


def test_out_of_memory_allocating_a_gather_output_names_the_collective():
    async def train(model):
        keep = [model.load_weights(layer, shard=model.rank, num_shards=2) for layer in range(6)]
        sample = 0
        while model.rank == 1 and model.memory_bytes < 15.2 * 2**30:  # rank 1 fills up with inputs
            keep.append(model.get_input_activation([sample]))
            sample += 1
        await model.all_gather(keep[0][0])  # rank 1 joins the gather rank 0 opened

    with pytest.raises(OutOfMemoryError) as info:
        run(train, cluster="2xT4", workload="gpt-13b", batch=128)
    assert "rank 1 (T4, 16.00 GiB): out of memory at t=0.000 ms in all_gather(layer 0) allocating" in str(info.value)


def test_an_out_of_memory_collective_issue_leaves_the_group_as_it_was():
    """The failed issue takes no place in the group's sequence: after freeing memory, the retry joins the
    same gather as the peer's one issue (the C fast path and the Python method alike)."""
    gathered = {}

    async def train(model):
        keep = [model.load_weights(layer, shard=model.rank, num_shards=2) for layer in range(6)]
        shard, filler = keep[0][0], []
        while model.rank == 1 and model.memory_bytes < 15.2 * 2**30:
            filler.append(model.get_input_activation([len(filler)]))
        try:
            work = model.all_gather(shard)
        except OutOfMemoryError:
            filler.clear()
            work = model.all_gather(shard)
        gathered[model.rank] = (await work).is_complete

    simulate(train, "2xT4", "gpt-13b", 128, check=False)
    assert gathered == {0: True, 1: True}


def test_memory_limit_can_be_lifted_to_measure_the_need():
    async def train(model):
        keep = [model.load_weights(layer) for layer in range(model.num_layers)]
        del keep

    result = simulate(train, "T4", "gpt-1.3b", 1, check=False, enforce_memory=False)
    # 2 bytes of weight + 12 of optimizer state per parameter (gradients only appear in backward)
    params = [result.workload.layer_params(layer) for layer in range(24)]
    assert result.peak_memory_bytes == sum(int(2 * p) + int(12 * p) for p in params)


def test_incorrect_step_lists_what_is_missing():
    async def train(model):
        w, o = model.load_weights(0)
        model.set_final_weight(0, w)

    with pytest.raises(IncorrectStepError) as info:
        simulate(train, "1xA100-80GB", "toy:layers=2", 1)
    message = str(info.value)
    assert "layer 0: rank 0 handed in a weight that was never updated" in message
    assert "layer 1: no rank handed in its final weight" in message


@pytest.mark.parametrize("strategy, message", [
    ("no/such/file.py", "not found"),
    ("tests/test_errors.py", "train` must be `async def"),
    ("tests", "strategy file tests: not a file"),
])
def test_bad_strategy_files(strategy, message):
    with pytest.raises(SpecError, match=message):
        simulate(strategy)


@pytest.mark.parametrize("strategy, shown", [(42, "int 42"), (None, "NoneType None")])
def test_a_strategy_of_the_wrong_type_is_named_as_such(strategy, shown):
    with pytest.raises(SpecError) as caught:
        simulate(strategy)
    assert str(caught.value) == f"strategy must be an async train function, a file path or a module name, got {shown}"


def train(model):  # a plain function: simulate must refuse it
    return None


def test_unknown_options_list_the_accepted_ones():
    with pytest.raises(SpecError, match="unknown option.*pipeline_stages.*accepts microbatch_size"):
        simulate("strategies/ddp.py", pipeline_stages=2)


def test_option_values_of_the_wrong_type_name_the_option():
    with pytest.raises(SpecError, match="option microbatch_size expects int .*got str '2'"):
        simulate("strategies/ddp.py", microbatch_size="2")


@pytest.mark.parametrize("kwargs, message", [
    ({"global_batch_size": 2.0}, "global_batch_size: must be a whole number from 1 to 1048576, got 2.0"),
    ({"global_batch_size": 0}, "global_batch_size: must be a whole number from 1 to 1048576, got 0"),
    ({"global_batch_size": 2**20 + 1}, "global_batch_size: must be a whole number from 1 to 1048576, got 1048577"),
    ({"start_order_seed": [1]}, "start_order_seed must be a whole number or None"),
    ({"cluster": None}, "cluster must be a spec string, a .toml path or a Cluster, got NoneType"),
    ({"workload": "toy:layers=2,layers=3"}, "layers is given twice"),
    ({"enforce_memory": "no"}, "enforce_memory must be True or False, got 'no'"),
    ({"check": 1}, "check must be True or False, got 1"),
])
def test_simulate_arguments_out_of_range_name_the_argument(kwargs, message):
    async def train(model):
        pass

    arguments = {"cluster": "2xA100-80GB", "workload": "toy:layers=2", "global_batch_size": 2, **kwargs}
    with pytest.raises(SpecError) as caught:
        simulate(train, **arguments)
    assert message in str(caught.value)


def test_a_strategy_file_that_exits_on_import_is_a_strategy_error(tmp_path):
    path = tmp_path / "exits.py"
    path.write_text("raise SystemExit(0)\n\nasync def train(model):\n    pass\n")
    with pytest.raises(StrategyError, match=r"exits.py: importing it raised SystemExit: 0 \(at exits.py:1 in <module>\)"):
        run(str(path))


def test_a_memory_error_after_the_ranks_finished_is_a_resource_error(monkeypatch):
    from dist_lib.run import simulator
    def exhausted(*args, **kwargs):
        raise MemoryError

    async def train(model):
        pass

    monkeypatch.setattr(simulator, "_finish", exhausted)
    with pytest.raises(ResourceError, match="MemoryError: the simulation of 2 ranks ran out of real memory"):
        run(train)


def test_a_strategy_yielding_what_is_not_awaitable_names_the_rank_and_the_value():
    @types.coroutine
    def odd():
        yield 42

    async def train(model):
        if model.rank == 1:
            await odd()

    with pytest.raises(StrategyError, match=r"rank 1: RuntimeError: the strategy yielded 42, which is not "
                                            r"awaitable by the simulator"):
        run(train)


def test_works_awaited_through_asyncio_gather_and_sleep_give_the_plain_awaits_times():
    """The engine resumes a rank's own awaits itself and anything of asyncio's through the loop: a step
    mixing both takes exactly the time of the same step awaiting each work in turn."""
    async def plain(model):
        if model.rank == 0:
            await model.send(model.get_input_activation([0, 1]), 1)
        else:
            await model.recv(0)

    async def mixed(model):
        await asyncio.sleep(0)
        if model.rank == 0:
            await asyncio.gather(model.send(model.get_input_activation([0, 1]), 1))
        else:
            await asyncio.sleep(0)
            (x,) = await asyncio.gather(model.recv(0))
            assert x.rank == 1

    assert run(mixed).time_s == run(plain).time_s > 0


@pytest.fixture
def quick_watchdog(monkeypatch):
    """Look for hangs every millisecond, so that the tests also exercise looks that find the step alive."""
    import dist_lib.engine.waits

    monkeypatch.setattr(dist_lib.engine.waits, "HANG_CHECK_S", 0.001)


def test_awaiting_an_event_no_rank_sets_is_a_deadlock_naming_the_line(quick_watchdog):
    async def train(model):
        never = asyncio.Event()
        await never.wait()

    with pytest.raises(DeadlockError, match="nothing in the step will ever complete") as info:
        run(train)
    line = train.__code__.co_firstlineno + 2
    for rank in (0, 1):
        assert f"rank {rank} (t=0.000 ms) waits on Future pending (at test_errors.py:{line} in train)" \
            in str(info.value)


def test_a_hang_names_the_ranks_waiting_on_works_too(quick_watchdog):
    async def train(model):
        if model.rank == 0:
            await asyncio.Queue().get()  # a queue nobody fills
        else:
            await model.recv(0)

    with pytest.raises(DeadlockError) as info:
        run(train)
    message = str(info.value)
    assert "rank 0 (t=0.000 ms) waits on Future pending" in message
    assert "rank 1 (t=0.000 ms) waits on recv from rank 0: rank 0 has not sent to rank 1" in message


def test_a_hang_says_which_messages_and_collectives_were_matched_and_are_in_flight(quick_watchdog):
    # rank 1 posts its recv and issues its all-gather, then waits on a queue nobody fills: rank 0's send and
    # all-gather were matched by every side, so they are in flight, not waiting for a recv or a member
    async def train(model):
        gathered = model.all_gather(model.load_weights(0, model.rank, 2)[0])
        if model.rank == 0:
            await asyncio.gather(gathered, model.send(model.get_input_activation([0]), 1))
        else:
            received = model.recv(0)
            await asyncio.Queue().get()
            await received

    with pytest.raises(DeadlockError) as info:
        run(train)
    assert str(info.value).splitlines()[1:] == [
        "  rank 0 (t=0.000 ms) waits on all_gather #0 on group [0, 1] (weight layer 0): every member issued it; "
        f"in flight (at test_errors.py:{train.__code__.co_firstlineno + 3} in train)",
        "  rank 0 (t=0.000 ms) waits on send to rank 1 (activation layer 0): matched by rank 1's recv(0); in flight "
        f"(at test_errors.py:{train.__code__.co_firstlineno + 3} in train)",
        f"  rank 1 (t=0.000 ms) waits on Future pending (at test_errors.py:{train.__code__.co_firstlineno + 6} "
        f"in train)"]


def test_real_timers_events_set_later_and_threads_are_not_hangs(quick_watchdog):
    import time

    shared = {}

    async def train(model):
        if model.rank == 0:
            event = shared["event"] = asyncio.Event()
            await event.wait()  # set by rank 1 after a real-time sleep and a thread's work
        else:
            while "event" not in shared:
                await asyncio.sleep(0)
            await asyncio.sleep(0.02)
            await asyncio.to_thread(time.sleep, 0.02)
            shared["event"].set()
        w, _ = model.load_weights(0)
        model.forward(0, model.get_input_activation([model.rank]), w)

    result = run(train)
    assert result.time_s > 0


@pytest.mark.parametrize("group, message", [
    (2, "rank 0 all_gather: a group is a Group or a list of ranks in 0..1, got 2"),
    ("all", "rank 0 all_gather: a group is a Group or a list of ranks in 0..1, got 'all'"),
    ([[0, 1]], "rank 0 all_gather: a group is a Group or a list of ranks in 0..1, got [[0, 1]]"),
    ((r for r in (0, 7)), "rank 0 all_gather: group [0, 7]: rank 7 is not in 0..1"),
    ([], "rank 0 all_gather: a group needs at least one rank"),
    ([0, 1, 0], "rank 0 all_gather: group [0, 1, 0] lists rank 0 more than once"),
])
def test_a_group_that_is_not_a_list_of_ranks_names_the_rank_and_op(group, message):
    async def train(model):
        await model.all_gather(model.load_weights(0, shard=model.rank, num_shards=2)[0], group)

    with pytest.raises(TensorError) as caught:
        run(train)
    assert str(caught.value) == message
