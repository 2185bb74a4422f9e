"""Metis-format profiles: reading, interpolation, errors, and the costs they feed."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

import pytest

from dist_lib import SpecError, Workload, simulate

from dist_lib.costs import compute as costs
from dist_lib.hardware.devices import DEVICES
from dist_lib.hardware.profiles import ProfileSet, read_profile

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "profiles"
A100, T4, V100 = DEVICES["A100-80GB"], DEVICES["T4"], DEVICES["V100-32GB"]


def _write(directory: Path, name: str, layer_ms, *, memory_key="layer_memory_total_mb", **extra) -> Path:
    n = len(layer_ms)
    data = {"model": {"num_layers": n, "parameters": {"parameters_per_layer_bytes": [100] * n}},
            "execution_time": {"layer_compute_total_ms": layer_ms, "optimizer_time_ms": 3.0,
                               "batch_generator_time_ms": 0.5},
            "execution_memory": {memory_key: [10.0] * n}}
    for key, value in extra.items():
        section, field = key.split("__")
        data[section][field] = value
    path = directory / name
    path.write_text(json.dumps(data))
    return path


def test_example_profiles_are_what_the_cost_model_gives_now():
    """examples/ holds what `python examples/make_examples.py` writes from today's costs (a change to a
    device's figures must regenerate them)."""
    make = runpy.run_path(str(EXAMPLES.parent / "make_examples.py"))
    for path in sorted(EXAMPLES.glob("DeviceType.*.json")):
        name, tp, batch = re.fullmatch(r"DeviceType\.(\w+)_tp(\d+)_bs(\d+)\.json", path.name).groups()
        expected = json.loads(json.dumps(make["profile"](make["TYPES"][name], int(tp), int(batch))))
        assert json.loads(path.read_text()) == expected, f"{path.name} is stale: run examples/make_examples.py"


@pytest.fixture
def small(tmp_path):
    _write(tmp_path, "DeviceType.A100_tp1_bs1.json", [1.0, 10.0, 12.0, 2.0])
    _write(tmp_path, "DeviceType.A100_tp1_bs4.json", [1.0, 31.0, 36.0, 5.0], memory_key="total_memory")
    return tmp_path


def test_example_profiles_load(small):
    profiles = ProfileSet.load(EXAMPLES)
    assert profiles.device_types == ["A100", "T4"]
    assert profiles.num_layers == 6
    w = Workload.load(f"profiles:{EXAMPLES},gpt-350m")
    assert (w.num_layers, w.hidden) == (4, 1024)
    # without a shape the hidden size is solved from 12h^2 + 13h parameters per layer
    assert Workload.load(f"profiles:{EXAMPLES}").hidden == 1024


def test_layer_times_come_from_the_profile_and_interpolate(small):
    profiles = ProfileSet.load(small)
    # layer 1 is profile entry 2: 12 ms at bs1, 36 ms at bs4 -> bs2 is 12 + (36-12)/3 = 20 ms
    assert profiles.layer_time(A100, 1, 1, 1) == pytest.approx(12e-3)
    assert profiles.layer_time(A100, 1, 2, 1) == pytest.approx(20e-3)
    # beyond the largest size: extrapolate from the two nearest, bs8 = 36 + 4*8 = 68 ms
    assert profiles.layer_time(A100, 1, 8, 1) == pytest.approx(68e-3)
    # layer 0 carries the embedding too: 10 + 1 ms
    assert profiles.layer_time(A100, 0, 1, 1) == pytest.approx(11e-3)
    assert profiles.head_time(A100, 1, 1) == pytest.approx(2e-3)
    assert profiles.layer_memory_bytes(A100, 1, 4, 1) == pytest.approx(10 * 2**20)
    assert profiles.layer_memory_bytes(A100, 0, 4, 1) == pytest.approx(20 * 2**20)  # with the embedding
    assert profiles.optimizer_time(A100, 1) == pytest.approx(3e-3)
    w = Workload.load(f"profiles:{small},toy")
    # forward is a third of the measured forward+backward, backward two thirds
    assert costs.forward_time(A100, w, 1, 2) == pytest.approx(20e-3 / 3)
    assert costs.backward_time(A100, w, 1, 2) == pytest.approx(40e-3 / 3)
    assert costs.loss_time(A100, w, 4) == pytest.approx(5e-3)


def test_a100_40gb_uses_the_a100_profile(small):
    profiles = ProfileSet.load(small)
    assert profiles.layer_time(DEVICES["A100-40GB"], 1, 1, 1) == pytest.approx(12e-3)


def test_missing_device_or_tp_names_the_missing_file(small):
    profiles = ProfileSet.load(small)
    with pytest.raises(SpecError, match=r"DeviceType\.V100_tp1_bs1\.json"):
        profiles.layer_time(V100, 1, 1, 1)
    with pytest.raises(SpecError, match=r"DeviceType\.A100_tp2_bs1\.json"):
        profiles.layer_time(A100, 1, 1, 2)


def test_simulation_runs_on_profiled_times(small):
    w = Workload.load(f"profiles:{small},toy")

    async def train(model):
        weights = [model.load_weights(l) for l in range(model.num_layers)]
        act = model.get_input_activation([0])
        acts = []
        for l, (wt, _) in enumerate(weights):
            acts.append(act)
            act = model.forward(l, act, wt)
        grad = model.loss(act)
        for l in reversed(range(model.num_layers)):
            wg, grad = model.backward(l, acts[l], grad, weights[l][0])
            new, _ = model.update(l, wg, *weights[l])
            model.set_final_weight(l, new)

    result = simulate(train, "A100-80GB", w, 1)
    # 11 + 12 ms of layers, 2 ms of head, plus two Adam updates
    updates = sum(costs.update_time(A100, w.layer_params(l)) for l in range(2))
    assert result.time_s == pytest.approx(23e-3 + 2e-3 + updates)


def test_stash_comes_from_the_measured_layer_memory(tmp_path):
    # Layer 0 measured at 0 + 300 MiB for one sample and 0 + 600 MiB for four, so two samples hold
    # 300 + (600 - 300) / 3 = 400 MiB. The toy layer's model state (16 bytes x 12*1024^2 + 13*1024
    # parameters = 201,539,584 bytes) and the two input activations (2 x 2 MiB) are tensors of their
    # own; the stash is the rest.
    _write(tmp_path, "DeviceType.A100_tp1_bs1.json", [1.0, 10.0, 12.0, 2.0],
           execution_memory__layer_memory_total_mb=[0.0, 300.0, 300.0, 0.0])
    _write(tmp_path, "DeviceType.A100_tp1_bs4.json", [1.0, 31.0, 36.0, 5.0],
           execution_memory__layer_memory_total_mb=[0.0, 600.0, 600.0, 0.0])
    w = Workload.load(f"profiles:{tmp_path},toy")
    seen = {}

    async def train(model):
        weight, _ = model.load_weights(0)
        x = model.get_input_activation(range(2))
        before = model.memory_bytes
        y = model.forward(0, x, weight)
        seen["stash"] = model.memory_bytes - before - y.nbytes

    simulate(train, "A100-80GB", w, 2, check=False)
    assert seen["stash"] == 400 * 2**20 - 201_539_584 - 2 * 2 * 2**20


@pytest.mark.parametrize("name, mutate, message", [
    ("DeviceType.A100_tp1.json", None, "file name"),
    ("DeviceType.A100_tp1_bs1.json", lambda d: d.pop("model"), "model: expected a JSON object"),
    ("DeviceType.A100_tp1_bs1.json", lambda d: d["model"].update(num_layers="4"), "model.num_layers"),
    ("DeviceType.A100_tp1_bs1.json", lambda d: d["execution_time"].update(layer_compute_total_ms=[1, 2]),
     "layer_compute_total_ms has 2 entries"),
    ("DeviceType.A100_tp1_bs1.json", lambda d: d["execution_time"]["layer_compute_total_ms"].__setitem__(1, -1),
     r"layer_compute_total_ms\[1\]"),
    ("DeviceType.A100_tp1_bs1.json", lambda d: d["execution_memory"].clear(), "total_memory"),
    ("DeviceType.A100_tp1_bs1.json", lambda d: d["execution_time"].update(optimizer_time_ms="x"),
     "optimizer_time_ms"),
])
def test_malformed_profiles_name_file_and_field(tmp_path, name, mutate, message):
    path = _write(tmp_path, "DeviceType.A100_tp1_bs1.json", [1.0, 10.0, 2.0])
    if mutate is not None:
        data = json.loads(path.read_text())
        mutate(data)
        path.write_text(json.dumps(data))
    path = path.rename(tmp_path / name)
    with pytest.raises(SpecError, match=message) as info:
        read_profile(path)
    assert str(path) in str(info.value)


def test_inconsistent_layer_counts_and_empty_dirs(tmp_path):
    with pytest.raises(SpecError, match="no DeviceType"):
        ProfileSet.load(tmp_path)
    with pytest.raises(SpecError, match="not found"):
        ProfileSet.load(tmp_path / "nope")
    _write(tmp_path, "DeviceType.A100_tp1_bs1.json", [1.0, 10.0, 2.0])
    _write(tmp_path, "DeviceType.A100_tp1_bs2.json", [1.0, 10.0, 10.0, 2.0])
    with pytest.raises(SpecError, match="num_layers"):
        ProfileSet.load(tmp_path)
