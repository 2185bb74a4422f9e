"""Profile files written from measured figures (`hardware.profile_writer`) read back into the simulator:
no PyTorch needed. The figures are plain numbers, as `profile` and `profile --from-trace` hand them over."""

from __future__ import annotations

import json

import pytest

from dist_lib import Cluster, SpecError, Workload, simulate
from dist_lib.costs import compute as costs
from dist_lib.costs.ops import forward_stash_bytes
from dist_lib.hardware.profile_writer import MeasuredStep, layer_memory_bytes, write_profiles
from dist_lib.hardware.profiles import ProfileSet

SHAPE = "gpt-350m:layers=2,hidden=64,heads=2,seq=32,vocab=128"
CPU_CLUSTER = """
[devices.CPU]
like = "A100-80GB"
peak_tflops = 1
memory_GiB = 16
hbm_GBps = 50

[[nodes]]
device = "CPU"
gpus = 2
"""


def _step(batch: int, layer_ms: tuple[float, float], saved: int, tp: int = 1) -> MeasuredStep:
    w = Workload.parse(SHAPE)
    params = 12 * 64**2 + 13 * 64  # one layer, GPT: 12h^2 + 13h
    input_bytes = batch * w.activation_bytes()
    return MeasuredStep("CPU", tp, batch, embedding_seconds=0.25e-3, layer_seconds=tuple(t * 1e-3 for t in layer_ms),
                        head_seconds=0.5e-3, optimizer_seconds=1.5e-3,
                        parameter_bytes=(2 * 128 * 64 + 2 * 32 * 64, 2 * params, 2 * params, 0),
                        memory_bytes=(0, layer_memory_bytes(params, input_bytes, saved),
                                      layer_memory_bytes(params, input_bytes, saved), 0))


def test_written_profiles_are_what_simulate_times_and_holds(tmp_path):
    write_profiles([_step(1, (3.0, 6.0), 40_000), _step(2, (5.0, 9.0), 80_000)], tmp_path)
    document = json.loads((tmp_path / "DeviceType.CPU_tp1_bs2.json").read_text())
    assert document["execution_time"]["layer_compute_total_ms"] == [0.25, 5.0, 9.0, 0.5]
    assert document["model"]["num_layers"] == 4
    (tmp_path / "cpu.toml").write_text(CPU_CLUSTER)
    cluster = Cluster.from_toml(tmp_path / "cpu.toml")
    workload = Workload.load(f"profiles:{tmp_path},{SHAPE}")
    cpu = cluster.device_of(0)
    # the reader gives back the figures: layer 0 also carries the embedding, forward a third of the total
    assert costs.forward_time(cpu, workload, 0, 2) == pytest.approx((0.25e-3 + 5e-3) / 3)
    assert costs.forward_time(cpu, workload, 1, 2) == pytest.approx(9e-3 / 3)
    assert costs.loss_time(cpu, workload, 2) == pytest.approx(0.5e-3)
    # the stash the simulator keeps is the bytes autograd saved, taken apart from the state and the input
    assert forward_stash_bytes(cpu, workload, 1, 2, 1) == 80_000
    assert forward_stash_bytes(cpu, workload, 1, 1, 1) == 40_000
    # and a step runs on them: DDP, two ranks, two samples each, one pass per layer
    result = simulate("strategies/ddp.py", cluster, workload, 4, microbatch_size=2)
    forwards = sorted((e.layer, e.duration) for e in result.events if e.rank == 0 and e.op == "forward")
    assert forwards == [(0, pytest.approx(5.25e-3 / 3)), (1, pytest.approx(3e-3))]
    backwards = sorted((e.layer, e.duration) for e in result.events if e.rank == 0 and e.op == "backward")
    assert backwards == [(0, pytest.approx(5.25e-3 * 2 / 3)), (1, pytest.approx(6e-3))]


def test_the_profile_folder_reads_back_equal(tmp_path):
    steps = [_step(1, (3.0, 6.0), 40_000), _step(1, (2.0, 3.5), 20_000, tp=2)]
    paths = write_profiles(steps, tmp_path)
    assert [p.name for p in paths] == ["DeviceType.CPU_tp1_bs1.json", "DeviceType.CPU_tp2_bs1.json"]
    profiles = ProfileSet.load(tmp_path)
    for step in steps:
        read = profiles.profiles["CPU", step.tp, 1]
        assert read.layer_seconds == pytest.approx((step.embedding_seconds, *step.layer_seconds, step.head_seconds))
        assert read.layer_memory_bytes == pytest.approx(step.memory_bytes, rel=1e-6)
        assert read.optimizer_seconds == pytest.approx(1.5e-3)


def test_bad_measurements_are_refused_with_what_is_wrong(tmp_path):
    with pytest.raises(SpecError, match="device type must be letters"):
        MeasuredStep("A100 80GB", 1, 1, 0.0, (1.0,), 0.0, 0.0, (0, 0, 0), (0, 0, 0))
    with pytest.raises(SpecError, match="memory_bytes has 2 entries, expected 3"):
        MeasuredStep("CPU", 1, 1, 0.0, (1.0,), 0.0, 0.0, (0, 0, 0), (0, 0))
    with pytest.raises(SpecError, match="must take more than 0 s"):
        MeasuredStep("CPU", 1, 1, 0.0, (0.0,), 0.0, 0.0, (0, 0, 0), (0, 0, 0))
    with pytest.raises(SpecError, match="disagree on the number of layers"):
        write_profiles([MeasuredStep("CPU", 1, 1, 0.0, (1.0,), 0.0, 0.0, (0,) * 3, (0,) * 3),
                        MeasuredStep("CPU", 1, 2, 0.0, (1.0, 1.0), 0.0, 0.0, (0,) * 4, (0,) * 4)], tmp_path)
