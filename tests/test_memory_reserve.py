"""The runtime reserve (dist_lib.hardware.reserve): its arithmetic, its text form, simulate's check against
each rank's communicators, the fullest GPU by share of its capacity, and the planner and `run` using it."""

from __future__ import annotations

import json

import pytest

from dist_lib import MemoryReserve, OutOfMemoryError, SpecError, get_device, simulate
from dist_lib.hardware.reserve import memory_reserve
from dist_lib.planner import plan
from grader.cli import main

MiB, GiB = 2**20, 2**30


def test_usable_is_capacity_less_context_buffers_and_fragmentation():
    reserve = MemoryReserve()
    # (80 GiB - 512 MiB - 4 x 320 MiB) x 0.9 = (81920 - 512 - 1280) MiB x 0.9 = 72115.2 MiB
    assert reserve.usable(80 * GiB, 4) == int((81920 - 512 - 1280) * MiB * 0.9)
    assert reserve.reserved(80 * GiB, 4) == 80 * GiB - reserve.usable(80 * GiB, 4)
    assert MemoryReserve(0, 0, 0.0).usable(32 * GiB, 9) == 32 * GiB
    assert MemoryReserve(GiB, GiB, 0.0).usable(4 * GiB, 5) == 0  # never below nothing


def test_the_text_form_overrides_the_default_part_by_part():
    assert memory_reserve("off") is None and memory_reserve(None) is None and memory_reserve(False) is None
    assert memory_reserve("default") == MemoryReserve() == memory_reserve(True)
    got = memory_reserve("context=1GiB, fragmentation=15%")
    assert got == MemoryReserve(context_bytes=GiB, fragmentation=0.15)
    assert memory_reserve("communicator=1e6").communicator_bytes == 1_000_000
    assert memory_reserve({"context_bytes": 5, "communicator_bytes": 6, "fragmentation": 0.5}) == MemoryReserve(5, 6, 0.5)
    for bad, words in (("colour=1", "unknown key 'colour'"), ("context=lots", "expected a size"),
                       ("fragmentation=1.5", "fragmentation"), ("context=1GiB,context=2GiB", "given twice"),
                       (3, "expected off, default")):
        with pytest.raises(SpecError, match=words):
            memory_reserve(bad, "--memory-headroom")


def test_off_by_default_and_on_it_counts_each_ranks_communicators():
    args = ("strategies/hybrid.py", "1x8xA100-80GB", "toy:layers=4", 8)
    plain = simulate(*args, tp=2, pp=2, dp=2)
    reserved = simulate(*args, tp=2, pp=2, dp=2, memory_reserve=True)
    assert plain.memory_reserve is None and plain.memory_bytes == reserved.memory_bytes
    assert plain.time_s == reserved.time_s
    # every rank: its TP group, its data-parallel group and its one pipeline neighbour
    assert reserved.communicators == [3] * 8
    assert reserved.usable_memory(0) == MemoryReserve().usable(get_device("A100-80GB").memory_bytes, 3)
    capacity = get_device("A100-80GB").memory_bytes
    assert reserved.memory_fraction(0) == pytest.approx(
        (reserved.memory_bytes[0] + capacity - MemoryReserve().usable(capacity, 3)) / capacity)


def test_a_peak_that_does_not_fit_beside_the_reserve_is_out_of_memory():
    args = ("strategies/ddp.py", "1x4xA100-80GB", "toy:layers=4", 8)
    kw = {"microbatch_size": 1}
    peak = max(simulate(*args, **kw).memory_bytes)
    capacity = get_device("A100-80GB").memory_bytes
    # ddp: one communicator a rank (its data-parallel group); leave exactly the peak, then a byte less
    context = capacity - 320 * MiB - peak
    fits = simulate(*args, **kw, memory_reserve=MemoryReserve(context, 320 * MiB, 0.0))
    assert fits.communicators == [1] * 4 and fits.usable_memory(0) == peak
    with pytest.raises(OutOfMemoryError, match=r"rank 0 \(A100-80GB.*out of memory in a real run.*NCCL buffers 1 x"):
        simulate(*args, **kw, memory_reserve=MemoryReserve(context + 1, 320 * MiB, 0.0))
    # reported, not raised, without enforcement
    assert simulate(*args, **kw, enforce_memory=False, memory_reserve=MemoryReserve(context + 1, 320 * MiB, 0.0)).correct


def test_the_headline_names_the_fullest_gpu_by_share_of_its_capacity():
    # data parallelism holds the same bytes on every rank: the 32 GB V100s are fuller than the 80 GB A100s
    result = simulate("strategies/ddp.py", "1x2xA100-80GB+1x2xV100-32GB", "toy:layers=4", 8, microbatch_size=1)
    assert len(set(result.memory_bytes)) == 1 and result.peak_memory_rank == 0
    assert result.fullest_rank == 2
    assert "fullest GPU   rank 2 (V100-32GB)" in result.summary()
    assert result.to_dict()["fullest_rank"] == 2


def test_the_planner_recommends_no_plan_above_capacity_less_its_reserve():
    search = plan("1x4xA100-80GB+1x4xV100-32GB", "gpt-1.3b", 32, top=3, refine_rounds=0)
    for candidate in search.simulated:
        if candidate.simulated is not None:
            assert candidate.peak_fraction <= 1.0
    best = search.best
    result = simulate("strategies/planned.py", "1x4xA100-80GB+1x4xV100-32GB", "gpt-1.3b", 32, plan=best.plan,
                      memory_reserve=True)
    assert best.peak_fraction == pytest.approx(result.memory_fraction(result.fullest_rank))
    assert best.fullest_rank == result.fullest_rank


def test_run_applies_the_reserve_unless_told_off(capsys, tmp_path):
    common = ["run", "ddp", "--cluster", "1x2xV100-32GB", "--workload", "gpt-1.3b", "--batch", "8", "--set",
              "microbatch_size=1", "--json", "--no-plots", "--trace", str(tmp_path / "t.json")]
    assert main([*common, "--memory-headroom", "off"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["status"] == "ok" and off["memory_fraction"] == pytest.approx(max(off["memory_bytes"]) / get_device("V100-32GB").memory_bytes)
    # the same step does not fit beside the default reserve
    assert main(common) == 1
    on = json.loads(capsys.readouterr().out)
    assert "out of memory" in on["error"]
    assert main([*common, "--memory-headroom", "fragmentation=2"]) == 2
    assert "--memory-headroom: fragmentation" in capsys.readouterr().err


def test_folded_replicas_count_the_communicators_of_the_whole_step():
    args = ("strategies/hybrid.py", "2x8xA100-80GB", "toy:layers=4", 16)
    folded = simulate(*args, tp=2, pp=2, dp=4, memory_reserve=True)
    whole = simulate(*args, tp=2, pp=2, dp=4, memory_reserve=True, fold=False)
    assert folded.representatives is not None and whole.representatives is None
    assert folded.communicators == whole.communicators == [3] * 16
