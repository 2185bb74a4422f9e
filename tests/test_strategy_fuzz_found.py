"""Configurations a random search over the built-in strategies' options found mishandled, each at its
minimal form: every one is now either refused with a message naming the option and the reason, or run."""

from __future__ import annotations

import gc
import warnings

import pytest

from dist_lib import OutOfMemoryError, StrategyError, simulate


def refusal(strategy: str, cluster: str, workload: str, batch: int, **options) -> str:
    """The strategy's own error message (the `ValueError` the rank's `StrategyError` chains)."""
    with pytest.raises(StrategyError) as caught:
        simulate(f"strategies.{strategy}", cluster, workload, batch, **options)
    assert isinstance(caught.value.__cause__, ValueError), caught.value
    return str(caught.value.__cause__)


@pytest.mark.parametrize("strategy, options, shown", [
    # chunks=0 divided by zero inside the layer partition (ZeroDivisionError)
    ("interleaved", {"chunks": 0}, "0"),
    ("hybrid", {"schedule": "interleaved", "chunks": 0}, "0"),
    # a negative count passed on to the schedule check: "not every chunk and microbatch ran ... once"
    ("interleaved", {"chunks": -1}, "-1"),
    # hybrid's chunks (default None) escapes the option type check: 2.5 became "5.0 pipeline blocks"
    ("hybrid", {"schedule": "interleaved", "chunks": 2.5}, "2.5"),
])
def test_chunks_below_one_or_fractional_is_refused_by_name(strategy, options, shown):
    assert refusal(strategy, "1x2xA100-80GB", "toy:layers=4", 4, pp=2, **options) == \
        f"chunks must be a whole number >= 1, got {shown}"


def test_a_partition_range_of_step_two_is_refused_not_read_as_a_contiguous_block():
    # range(0, 4, 2) holds layers 0 and 2; its length alone made it read as layers 0-1
    assert refusal("hybrid", "1x2xA100-80GB", "toy:layers=4", 2, pp=2,
                   partition=[range(0, 4, 2), range(2, 4)]) == (
        "partition [range(0, 4, 2), range(2, 4)]: blocks must be contiguous, in order (ranges of step 1)")


@pytest.mark.parametrize("partition, block", [([2.0, 2.0], "2.0"), ([True, 3], "True")])
def test_a_partition_block_that_is_not_a_whole_number_says_so(partition, block):
    # was "every block needs at least one layer", which 2.0 has
    assert refusal("gpipe", "1x2xA100-80GB", "toy:layers=4", 2, pp=2, partition=partition) == (
        f"partition {partition!r}: block {block} is neither a whole number of layers nor a range of layers")


def test_hetero_names_which_replicas_partition_is_wrong():
    # was "partition must list 2 blocks (one per pipeline stage), got []": the inner list, unnamed
    assert refusal("hetero", "1x4xA100-80GB", "toy:layers=4", 4, pp=2, partition=[[2, 2], []]) == (
        "partition[1] must list 2 blocks (one per pipeline stage), got []")


def test_ddp_refuses_a_nan_bucket_size():
    # NaN passed `bucket_mb < 0` and then never filled a bucket
    assert refusal("ddp", "1x2xA100-80GB", "toy:layers=2", 2, microbatch_size=1, bucket_mb=float("nan")) == (
        "bucket_mb must be a number of megabytes >= 0, got nan")


def test_more_pipeline_blocks_than_layers_says_to_lower_pp():
    # was "... choose pp so that it divides 1, or pass an explicit `partition`": no partition can help
    assert refusal("one_f_one_b", "1x4xA100-80GB", "toy:layers=1", 4, pp=4) == (
        "1 layers cannot fill 4 pipeline blocks of at least one layer each; lower pp to at most 1")
    assert refusal("interleaved", "1x2xA100-80GB", "toy:layers=3", 2, pp=2, chunks=2) == (
        "3 layers cannot fill 4 pipeline blocks of at least one layer each; lower pp x chunks to at most 3")


def test_strategies_without_tp_are_not_told_to_change_tp():
    assert refusal("gpipe", "1x4xA100-80GB", "toy:layers=3", 4, pp=3) == (
        "pp=3 does not divide the world of 4 ranks; choose a pp that divides 4")
    assert refusal("hetero", "1x4xA100-80GB", "toy:layers=4", 4, dp=1, pp=2) == (
        "layout dp=1 x pp=2 = 2 ranks, but the cluster has 4; change dp or pp so that their product is 4")
    # with a tp the product names it
    assert refusal("hybrid", "1x4xA100-80GB", "toy:layers=4", 4, dp=None, pp=3, tp=2) == (
        "pp=3 x tp=2 does not divide the world of 4 ranks; choose pp and tp whose product divides 4")


def test_a_unit_step_range_partition_still_runs():
    result = simulate("strategies.gpipe", "1x2xA100-80GB", "toy:layers=4", 2, pp=2,
                      partition=[range(0, 1), range(1, 4)])
    assert {e.layer for e in result.events if e.rank == 1 and e.op == "forward"} == {1, 2, 3}


def test_zero3_on_one_gpu_that_runs_out_of_memory_leaves_no_unawaited_prefetch_behind():
    # ZeRO on one rank "gathers" a whole shard by a stand-in awaitable; as a coroutine, the prefetch of
    # layer 1 the failing rank never reached made Python warn "coroutine '_whole' was never awaited" beside
    # the error (layer 0's stash for 64 samples, 28 GiB, is more than the T4's 16 GiB)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(OutOfMemoryError, match=r"forward\(layer 0\) allocating 28\.00 GiB of stash"):
            simulate("strategies.zero", "1xT4", "gpt-1.3b:layers=4", 64, stage=3, microbatch_size=64)
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
