"""Planning a run on mixed hardware with the documented entry points only: `simulate()`, cluster specs and
the bundled strategies' options. Each figure is derived by hand from `dist_lib/costs/`; each error is
one that a user can cause, checked for the option it names."""

from __future__ import annotations

from pathlib import Path

import pytest

from dist_lib import Cluster, StrategyError, Workload, simulate

from dist_lib.costs import compute as costs

from dist_lib.costs import network
from dist_lib.output.trace import chrome_trace, validate_trace

STRATEGIES = Path(__file__).resolve().parent.parent / "strategies"


def strategy(name: str) -> str:
    return str(STRATEGIES / f"{name}.py")


def one_rank_step(device_name: str, workload: Workload, samples: int) -> float:
    """One rank, one microbatch: every forward, the head, every backward, every optimizer step."""
    device = Cluster.parse(device_name).device_of(0)
    layers = range(workload.num_layers)
    return (sum(costs.forward_time(device, workload, layer, samples) for layer in layers)
            + costs.loss_time(device, workload, samples)
            + sum(costs.backward_time(device, workload, layer, samples) for layer in layers)
            + sum(costs.update_time(device, workload.layer_params(layer)) for layer in layers))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_on_one_gpu_is_plain_training(stage):
    """A data-parallel world of one: every shard is the whole tensor and nothing needs gathering, so ZeRO
    costs exactly one rank's compute (it used to fail with 'already complete; nothing to gather')."""
    toy = Workload.parse("toy")
    result = simulate(strategy("zero"), "1xV100-32GB", "toy", 4, stage=stage, microbatch_size=4)
    assert result.time_s == pytest.approx(one_rank_step("1xV100-32GB", toy, 4), rel=1e-12)
    ddp = simulate(strategy("ddp"), "1xV100-32GB", "toy", 4, microbatch_size=4)
    assert result.time_s == pytest.approx(ddp.time_s, rel=1e-12)
    if stage == 3:  # the whole weights are the only copy, as DDP's
        assert result.peak_memory_bytes == ddp.peak_memory_bytes


def test_two_stage_gpipe_on_t4_and_a100_over_a_slow_nic_matches_the_hand_recurrence():
    """GPipe, T4 stage of 2 layers then A100 stage of 6, m = 5, the A100 node's one NIC at 0.1 GB/s:
    stage 1 starts microbatch i at max(its clock, stage 0's i-th forward end) + message; the backwards
    run the same way back; each stage then steps its optimizer on its layers."""
    spec, toy, m = "1x1xT4+1x1xA100-80GB:nics=1x0.1", Workload.parse("toy"), 5
    cluster = Cluster.parse(spec)
    t4, a100 = cluster.device_of(0), cluster.device_of(1)
    first, second = range(0, 2), range(2, 8)
    f0 = sum(costs.forward_time(t4, toy, layer, 1) for layer in first)
    b0 = sum(costs.backward_time(t4, toy, layer, 1) for layer in first)
    f1 = sum(costs.forward_time(a100, toy, layer, 1) for layer in second) + costs.loss_time(a100, toy, 1)
    b1 = sum(costs.backward_time(a100, toy, layer, 1) for layer in second)
    message = network.p2p_time(toy.activation_bytes(), cluster.p2p_link(0, 1))
    assert message == pytest.approx(1e-5 + 2 * 2**20 / 0.1e9, rel=0.01)  # 2 MiB at 0.1 GB/s
    clock1 = 0.0
    for i in range(m):
        clock1 = max(clock1, (i + 1) * f0) + message + f1
    clock0, grads = m * f0, []
    for i in range(m):
        clock1 += b1
        grads.append(clock1)
    for i in range(m):
        clock0 = max(clock0, grads[i]) + message + b0
    end0 = clock0 + sum(costs.update_time(t4, toy.layer_params(layer)) for layer in first)
    end1 = clock1 + sum(costs.update_time(a100, toy.layer_params(layer)) for layer in second)
    result = simulate(strategy("gpipe"), spec, "toy", m, microbatch_size=1, partition=[2, 6])
    assert result.time_s == pytest.approx(max(end0, end1), rel=1e-12)


def test_a_long_step_writes_compute_slices_that_abut_exactly():
    """ZeRO-3 over a 0.01 GB/s link runs 22 s; at 2e7 us a slice's start plus a duration scaled from
    seconds overshot the next slice's start by an ulp, and the trace was 'malformed' (overlap without
    nesting). The written ts + dur of one slice never passes the next one's ts on a rank's compute thread."""
    result = simulate(strategy("zero"), "1x2xA100-80GB:inter=0.01+1x2xA100-80GB", "toy:layers=4", 12,
                      stage=3, microbatch_size=1)
    assert result.time_s > 20
    trace = chrome_trace(result)
    assert validate_trace(trace) == []
    for rank in range(4):
        slices = sorted((e["ts"], e["dur"]) for e in trace["traceEvents"]
                        if e["ph"] == "X" and e["pid"] == rank and e["tid"] == 0)
        assert len(slices) > 20
        for (ts, dur), (next_ts, _) in zip(slices, slices[1:]):
            assert ts + dur <= next_ts


@pytest.mark.parametrize("name", ["gpipe", "one_f_one_b", "interleaved", "zero_bubble", "deepspeed_1f1b"])
def test_pp_zero_is_rejected_not_read_as_the_default(name):
    """`pp=0` used to fall back to the world size silently (`pp or world_size`)."""
    with pytest.raises(StrategyError, match=r"pp must be a whole number >= 1, got 0"):
        simulate(strategy(name), "1x2xV100-32GB", "toy", 4, pp=0)


def test_zero_bubble_max_in_flight_zero_is_rejected_not_read_as_the_default():
    with pytest.raises(StrategyError, match=r"max_in_flight must be a whole number >= 1, got 0"):
        simulate(strategy("zero_bubble"), "1x3xV100-32GB", "toy:layers=9", 6, max_in_flight=0)


def test_hetero_shares_that_are_not_a_list_name_the_option():
    with pytest.raises(StrategyError, match=r"shares must give each of dp=2 replicas .* got 4"):
        simulate(strategy("hetero"), "1x2xT4+1x2xA100-80GB", "toy", 8, dp=2, pp=2, shares=4)


@pytest.mark.parametrize("workload, options, message", [
    ("toy", {"recompute": True, "selective_recompute": True}, "exclude each other"),
    ("toy", {"tp": 4, "pp": 1, "dp": 1, "sequence_parallel": True}, None),  # 16 heads, 1024 tokens: fine
    ("toy:seq=1022", {"tp": 4, "pp": 1, "dp": 1, "sequence_parallel": True}, "1022 tokens does not split into 4"),
    ("toy:seq=1022", {"tp": 4, "pp": 1, "dp": 1}, None),  # no sequence parallelism: nothing to split
    ("toy:heads=8,hidden=1024", {"tp": 4, "pp": 1, "dp": 1}, None),
    ("toy:heads=2,hidden=1024", {"tp": 4, "pp": 1, "dp": 1}, "tp=4 does not divide the 2 attention heads"),
])
def test_hybrid_refuses_what_megatron_refuses(workload, options, message):
    """Megatron-LM splits the heads over the TP group and, with sequence parallelism, the sequence; full and
    selective recompute are one choice. Before, each of these ran and gave a figure for a run that cannot be."""
    run = lambda: simulate(strategy("hybrid"), "1x4xV100-32GB", workload, 4, **options)  # noqa: E731
    if message is None:
        assert run().correct
    else:
        with pytest.raises(StrategyError, match=message):
            run()
