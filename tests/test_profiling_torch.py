"""`profile --device cpu` with PyTorch: a small model's layers measured here, written, and read by `simulate`.
Skipped where PyTorch is not installed (the `profile` extra)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from dist_lib import Cluster, Workload, simulate  # noqa: E402
from dist_lib.costs import compute as costs  # noqa: E402
from dist_lib.costs.ops import forward_stash_bytes  # noqa: E402
from dist_lib.hardware.profile_writer import write_profiles  # noqa: E402
from dist_lib.hardware.profiling import measure  # noqa: E402
from dist_lib.workload import architecture as arch  # noqa: E402
from grader.cli import main  # noqa: E402
from tests.test_profile_writer import CPU_CLUSTER, SHAPE  # noqa: E402


@pytest.fixture(scope="module")
def measured():
    w = Workload.parse(SHAPE)
    return w, {(tp, b): measure(w, "cpu", tp=tp, batch=b, dtype="fp32", warmup=1, repeats=3)
               for tp in (1, 2) for b in (1, 2)}


def test_a_layer_is_measured_as_the_workload_shapes_it(measured):
    w, steps = measured
    one = steps[1, 1]
    assert one.device_type == "CPU" and len(one.layer_seconds) == w.num_layers
    assert all(t > 0 for t in (*one.layer_seconds, one.embedding_seconds, one.head_seconds, one.optimizer_seconds))
    # parameters: the embedding (128 x 64 tokens, 32 x 64 positions) and 12h^2 + 13h a layer, 16-bit, split by TP
    assert one.parameter_bytes == (2 * (128 * 64 + 32 * 64), 2 * (12 * 64**2 + 13 * 64), 2 * (12 * 64**2 + 13 * 64), 0)
    assert steps[2, 1].parameter_bytes[1] == one.parameter_bytes[1] / 2
    # what autograd saves grows with the microbatch, at most in proportion (PyTorch may copy a reshaped
    # activation at one size and view it at another); a TP shard saves less than the whole layer
    state = arch.layer_params(w) * 16
    saved = {key: s.memory_bytes[1] - state / key[0] - key[1] * 32 * 64 * 2 for key, s in steps.items()}
    assert saved[1, 1] < saved[1, 2] <= 2 * saved[1, 1]
    assert 0 < saved[2, 1] < saved[1, 1]


def test_measured_profiles_are_what_simulate_runs_on(measured, tmp_path):
    w, steps = measured
    write_profiles([steps[1, 2], steps[2, 2]], tmp_path)
    (tmp_path / "cpu.toml").write_text(CPU_CLUSTER)
    cluster = Cluster.from_toml(tmp_path / "cpu.toml")
    workload = Workload.load(f"profiles:{tmp_path},{SHAPE}")
    cpu = cluster.device_of(0)
    step = steps[1, 2]
    assert costs.forward_time(cpu, workload, 1, 2) == pytest.approx(step.layer_seconds[1] / 3, rel=1e-6)
    assert costs.loss_time(cpu, workload, 2) == pytest.approx(step.head_seconds, rel=1e-6)
    saved = step.memory_bytes[2] - arch.layer_params(w) * 16 - 2 * w.activation_bytes()  # the input, 16-bit
    assert forward_stash_bytes(cpu, workload, 1, 2, 1) == round(saved)
    result = simulate("strategies/ddp.py", cluster, workload, 4, microbatch_size=2)
    assert result.correct
    loss = [e for e in result.events if e.rank == 0 and e.op == "loss"]
    assert [e.duration for e in loss] == [pytest.approx(step.head_seconds, rel=1e-6)]


def test_the_profile_command_writes_a_folder_the_workload_reads(tmp_path, capsys):
    out = tmp_path / "profiles"
    assert main(["profile", "--workload", SHAPE, "--device", "cpu", "--tp", "1,2", "--dtype", "fp32",
                 "--warmup", "0", "--repeats", "1", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["DeviceType.CPU_tp1_bs1.json", "DeviceType.CPU_tp2_bs1.json"]
    document = json.loads((out / "DeviceType.CPU_tp1_bs1.json").read_text())
    assert document["profiler"]["torch"] == torch.__version__
    assert f"--workload profiles:{out},{SHAPE}" in capsys.readouterr().out
    assert Workload.load(f"profiles:{out},{SHAPE}").num_layers == 2
