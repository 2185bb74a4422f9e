"""Every loader and parser, fed random bytes, wrong types, missing keys and bad numbers, gives a valid object
within the accepted ranges or raises SpecError (InputError for suites) naming the file and field."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dist_lib import Cluster, SpecError, Workload
from dist_lib.hardware.metis import load_cluster
from dist_lib.hardware.devices import get_device
from dist_lib.hardware.profiles import ProfileSet, read_profile

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20)
numbers = st.one_of(st.integers(-5, 5), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3),
                    st.none(), st.booleans())

PROFILE = {"model": {"num_layers": 3, "parameters": {"parameters_per_layer_bytes": [1, 2, 3]}},
           "execution_time": {"layer_compute_total_ms": [1, 2, 3], "optimizer_time_ms": 1,
                              "batch_generator_time_ms": 1},
           "execution_memory": {"layer_memory_total_mb": [1, 2, 3]}}
PATHS = [("model", "num_layers"), ("model", "parameters"), ("execution_time", "layer_compute_total_ms"),
         ("execution_time", "optimizer_time_ms"), ("execution_memory", "layer_memory_total_mb"),
         ("execution_time", "batch_generator_time_ms")]


def _check(call, path: Path) -> None:
    try:
        call()
    except SpecError as exc:
        assert str(path) in str(exc) or path.name in str(exc), str(exc)


@SETTINGS
@given(st.binary(max_size=200))
def test_profile_random_bytes(data):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "DeviceType.A100_tp1_bs1.json"
        path.write_bytes(data)
        _check(lambda: read_profile(path), path)


@SETTINGS
@given(st.sampled_from(PATHS), st.one_of(numbers, json_values), st.booleans())
def test_profile_bad_fields(where, value, delete):
    data = json.loads(json.dumps(PROFILE))
    section, field = where
    if delete:
        data[section].pop(field)
    else:
        data[section][field] = value
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "DeviceType.A100_tp1_bs1.json"
        path.write_text(json.dumps(data))
        _check(lambda: read_profile(path), path)


@SETTINGS
@given(json_values)
def test_profile_any_json(value):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "DeviceType.T4_tp2_bs3.json"
        path.write_text(json.dumps(value))
        _check(lambda: read_profile(path), path)


@SETTINGS
@given(st.binary(max_size=120), st.binary(max_size=120))
def test_metis_random_bytes(hosts, info):
    with tempfile.TemporaryDirectory() as d:
        h, c = Path(d) / "hostfile", Path(d) / "cluster.json"
        h.write_bytes(hosts)
        c.write_bytes(info)
        try:
            load_cluster(h, c)
        except SpecError as exc:
            assert "hostfile" in str(exc) or "cluster.json" in str(exc)


@SETTINGS
@given(st.sampled_from(["instance_type", "inter_bandwidth", "intra_bandwidth", "memory"]),
       st.one_of(numbers, json_values), st.booleans(), st.integers(-2, 20))
def test_metis_bad_fields(field, value, delete, slots):
    entry = {"instance_type": "A100", "inter_bandwidth": 25, "intra_bandwidth": 300, "memory": 80}
    if delete:
        entry.pop(field)
    else:
        entry[field] = value
    with tempfile.TemporaryDirectory() as d:
        h, c = Path(d) / "hostfile", Path(d) / "cluster.json"
        h.write_text(f"10.0.0.1 slots={slots}\n")
        c.write_text(json.dumps({"10.0.0.1": entry}))
        try:
            load_cluster(h, c)
        except SpecError as exc:
            assert "hostfile" in str(exc) or "cluster.json" in str(exc)


@SETTINGS
@given(st.binary(max_size=200))
def test_cluster_and_workload_toml_random_bytes(data):
    with tempfile.TemporaryDirectory() as d:
        for loader in (Cluster.load, Workload.load):
            path = Path(d) / "f.toml"
            path.write_bytes(data)
            try:
                loader(str(path))
            except SpecError:
                pass


# ---- every parser: a valid object within the accepted ranges, or a SpecError naming the field ----------

from dist_lib.hardware.cluster import FIGURE_RANGES, MAX_WORLD_SIZE  # noqa: E402
from dist_lib.workload.transformer import FIELD_RANGES, PRESETS  # noqa: E402

# numbers as a user could type them: huge, tiny, negative, NaN, infinite, fractional, not numbers at all
typed_numbers = st.one_of(st.integers(-3, 10), st.integers(-10**30, 10**30), st.sampled_from(
    ["nan", "inf", "-inf", "1e9", "1e400", "0", "-0", "2.5", "", "x", "1_000", "0x10", "１２", "1" * 5000]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr))
DEVICES = st.sampled_from(["A100-80GB", "T4", "H100-80GB", "V100", "Z9000", ""])


def _within(value: float, bounds: tuple[float, float]) -> bool:
    return bounds[0] <= value <= bounds[1]


def _assert_cluster_in_range(cluster: Cluster) -> None:
    assert 1 <= cluster.world_size <= MAX_WORLD_SIZE
    for node in cluster.nodes:
        for link in (node.intra_link, node.inter_link):
            assert _within(link.bandwidth / 1e9, FIGURE_RANGES["bandwidth_GBps"])
            assert _within(link.latency * 1e6, FIGURE_RANGES["latency_us"])


@SETTINGS
@given(typed_numbers, typed_numbers, DEVICES, st.sampled_from(["inter", "intra", "speed", ""]), typed_numbers,
       st.booleans())
def test_cluster_spec_strings(nodes, gpus, device, key, value, repeat):
    option = f":{key}={value}" + (f":{key}={value}" if repeat else "")
    spec = f"{nodes}x{gpus}x{device}{option}"
    try:
        cluster = Cluster.parse(spec)
    except SpecError as exc:
        message = str(exc)
        assert "\n" not in message and len(message) < 600, message
        assert message.startswith("cluster spec "), message
        return
    _assert_cluster_in_range(cluster)
    assert not repeat and key in ("inter", "intra")


NODE_FIELDS = ["count", "gpus", "intra_bandwidth_GBps", "inter_bandwidth_GBps", "intra_latency_us",
               "inter_latency_us"]
DEVICE_FIELDS = ["peak_tflops", "memory_GiB", "hbm_GBps", "intra_bandwidth_GBps", "max_efficiency", "like"]
toml_values = st.one_of(st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True),
                        st.booleans(), st.text(max_size=6), st.lists(st.integers(), max_size=2))


@SETTINGS
@given(st.sampled_from(["nodes", "devices", "top"]), st.sampled_from(NODE_FIELDS + DEVICE_FIELDS + ["name", "x"]),
       toml_values)
def test_cluster_tables(section, field, value):
    node = {"device": "MyGPU", "count": 2, "gpus": 4}
    device = {"peak_tflops": 100, "memory_GiB": 24, "hbm_GBps": 800}
    data = {"devices": {"MyGPU": device}, "nodes": [node]}
    {"nodes": node, "devices": device, "top": data}[section][field] = value
    try:
        cluster = Cluster.from_dict(data, source="c.toml")
    except SpecError as exc:
        assert str(exc).startswith("c.toml") and field in str(exc), str(exc)
        return
    _assert_cluster_in_range(cluster)
    for node in cluster.nodes:
        assert 0 < node.device.max_efficiency <= 1 and node.device.memory_bytes > 0


@SETTINGS
@given(st.sampled_from(sorted(PRESETS)), st.lists(st.tuples(
    st.sampled_from(["layers", "hidden", "heads", "seq", "vocab", "bytes_per_element", "colour"]), typed_numbers),
    max_size=3))
def test_workload_spec_strings(preset, overrides):
    spec = f"{preset}:" + ",".join(f"{key}={value}" for key, value in overrides)
    try:
        workload = Workload.parse(spec)
    except SpecError as exc:
        message = str(exc)
        assert "\n" not in message
        assert any(key in message for key, _ in overrides), message
        return
    assert len({key for key, _ in overrides}) == len(overrides)  # a key given twice is an error
    for name, bounds in FIELD_RANGES.items():
        assert _within(getattr(workload, name), bounds)


def _toml(value) -> str:
    """A TOML literal (strings as JSON strings, which TOML reads the same for printable text)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(value), repr(value))
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, str) else str(value)


printable = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=6)
file_values = st.one_of(st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True),
                        st.booleans(), printable, st.lists(st.integers(0, 9), max_size=2))


@SETTINGS
@given(st.sampled_from(["layers", "hidden", "heads", "seq", "vocab", "bytes_per_element", "preset", "name"]),
       file_values)
def test_workload_toml_fields(field, value):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "w.toml"
        path.write_text(f'layers = 2\nhidden = 64\nheads = 4\nseq = 16\n{field} = {_toml(value)}\n'
                        if field not in ("layers", "hidden", "heads", "seq") else
                        "\n".join(f"{k} = {_toml(value) if k == field else v}"
                                  for k, v in (("layers", 2), ("hidden", 64), ("heads", 4), ("seq", 16))))
        try:
            workload = Workload.load(str(path))
        except SpecError as exc:
            assert str(path) in str(exc) or "workload" in str(exc), str(exc)
            assert field in str(exc) or "unknown workload" in str(exc) or "divisible" in str(exc), str(exc)
            return
    for name, bounds in FIELD_RANGES.items():
        assert _within(getattr(workload, name), bounds)


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(["10.0.0.1", "10.0.0.2", "h"]), typed_numbers), min_size=1, max_size=3))
def test_metis_hostfile_slots(lines):
    with tempfile.TemporaryDirectory() as d:
        h, c = Path(d) / "hostfile", Path(d) / "cluster.json"
        h.write_text("".join(f"{ip} slots={slots}\n" for ip, slots in lines))
        entry = {"instance_type": "A100", "inter_bandwidth": 25, "intra_bandwidth": 300, "memory": 80}
        c.write_text(json.dumps({ip: entry for ip in ("10.0.0.1", "10.0.0.2", "h")}))
        try:
            cluster = load_cluster(h, c)
        except SpecError as exc:
            assert str(h) in str(exc) or "cluster" in str(exc), str(exc)
            return
    _assert_cluster_in_range(cluster)


SUITE = {"name": '"s"', "limits.timeout_s": "10", "limits.address_space_GiB": "2",
         "scenarios.name": '"a"', "scenarios.cluster": '"2xA100-80GB"', "scenarios.workload": '"toy:layers=2"',
         "scenarios.global_batch": "4", "scenarios.memory_limit_GB": "80", "scenarios.enforce_memory": "true",
         "scenarios.options": "{ microbatch_size = 1 }", "scoring.components.metric": '"mfu"',
         "scoring.components.weight": "1.0", "scoring.components.scale": "100",
         "scoring.components.higher_is_better": "true"}


def _suite_text(values: dict[str, str]) -> str:
    sections = {"": "", "limits": "[limits]", "scenarios": "[[scenarios]]",
                "scoring.components": "[[scoring.components]]"}
    lines = []
    for section, header in sections.items():
        lines.append(header)
        for key, literal in values.items():
            head, _, field = key.rpartition(".")
            if head == section:
                lines.append(f"{field} = {literal}")
    return "\n".join(lines) + "\n"


@SETTINGS
@given(st.sampled_from(sorted(SUITE)), file_values)
def test_suite_fields(key, value):
    from grader.errors import InputError
    from grader.suites import ADDRESS_SPACE_GIB, MAX_TIMEOUT_S, load_suite
    field = key.rpartition(".")[2]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "suite.toml"
        path.write_text(_suite_text({**SUITE, key: _toml(value)}))
        try:
            suite = load_suite(str(path))
        except InputError as exc:
            message = str(exc)
            assert "\n" not in message and str(path) in message or "cluster" in message or "workload" in message
            assert field in message or field in ("cluster", "workload") or "options" in message, message
            return
    assert 0 < suite.limits.timeout_s <= MAX_TIMEOUT_S
    assert ADDRESS_SPACE_GIB[0] * 2**30 <= suite.limits.address_space_bytes <= ADDRESS_SPACE_GIB[1] * 2**30
    scenario = suite.scenarios[0]
    assert isinstance(scenario.enforce_memory, bool) and scenario.global_batch >= 1
    assert scenario.memory_limit_bytes is None or 0 < scenario.memory_limit_bytes < float("inf")
    assert all(math.isfinite(c.weight) and isinstance(c.higher_is_better, bool) for c in suite.rubric.components)


@pytest.mark.parametrize("load, spec, message", [
    (Cluster.load, "1x1000000000xA100-80GB", "gpus: must be a whole number from 1 to 131072, got 1000000000"),
    (Cluster.load, "512x512xA100-80GB", "262144 GPUs in all; a cluster may have at most 131072"),
    (Cluster.load, "2xA100-80GB:inter=nan", "inter_bandwidth_GBps: must be at least 0.001 and at most 2000, got 'nan'"),
    (Cluster.load, "2xA100-80GB:inter=5:inter=6", "inter is given twice"),
    (Workload.load, "toy:layers=2,layers=3", "layers is given twice"),
    (Workload.load, "toy:seq=1e9", "seq: must be a whole number from 1 to 16777216, got 1000000000"),
    (Workload.load, "toy:layers=nan", "layers: expected a whole number from 1 to 10000, got 'nan'"),
    # 5*a*s^2 bytes of attention scores alone: 5 * 16 * (2**17)**2 = 1.37e12 > 2**40
    (Workload.load, "toy:seq=131072", "one sample's activation stash would take"),
])
def test_reported_bad_inputs_name_the_field_and_its_range(load, spec, message):
    with pytest.raises(SpecError) as caught:
        load(spec)
    assert message in str(caught.value)


def _write_profiles(directory: Path, layer_ms_by_batch: dict[int, float]) -> None:
    for batch, ms in layer_ms_by_batch.items():
        data = json.loads(json.dumps(PROFILE))
        data["execution_time"]["layer_compute_total_ms"] = [0.0, ms, 0.0]
        (directory / f"DeviceType.A100_tp1_bs{batch}.json").write_text(json.dumps(data))


def test_a_profile_where_a_larger_batch_is_faster_is_rejected(tmp_path):
    _write_profiles(tmp_path, {1: 10.0, 2: 4.0})
    with pytest.raises(SpecError, match=r"bs2.json: execution_time.layer_compute_total_ms\[1\] is 4 ms at batch 2, "
                                        r"less than 10 ms at batch 1"):
        ProfileSet.load(tmp_path)


def test_below_the_smallest_profiled_batch_time_never_falls_under_its_per_sample_share(tmp_path):
    # bs2 10 ms, bs4 30 ms: the line through them reaches 0 ms at one sample; the share of bs2 is 5 ms
    _write_profiles(tmp_path, {2: 10.0, 4: 30.0})
    profiles, a100 = ProfileSet.load(tmp_path), get_device("A100-80GB")
    assert profiles.layer_time(a100, 0, 1, 1) == pytest.approx(5e-3)
    assert profiles.layer_time(a100, 0, 3, 1) == pytest.approx(20e-3)  # interpolated as before
    assert profiles.layer_time(a100, 0, 6, 1) == pytest.approx(50e-3)  # extrapolated along the line


@SETTINGS
@given(st.dictionaries(st.integers(1, 64), st.floats(0.001, 1e3), min_size=1, max_size=4), st.integers(1, 512))
def test_profiled_time_is_positive_and_grows_with_the_batch(layer_ms_by_batch, samples):
    with tempfile.TemporaryDirectory() as d:
        _write_profiles(Path(d), layer_ms_by_batch)
        try:
            profiles = ProfileSet.load(d)
        except SpecError as exc:
            assert "layer_compute_total_ms[1]" in str(exc) and "a larger batch must not take less time" in str(exc)
            ordered = [layer_ms_by_batch[b] for b in sorted(layer_ms_by_batch)]
            assert any(b < a for a, b in zip(ordered, ordered[1:]))
            return
    a100 = get_device("A100-80GB")
    now, more = profiles.layer_time(a100, 0, samples, 1), profiles.layer_time(a100, 0, samples + 1, 1)
    assert 0 < now <= more < float("inf")


@pytest.mark.parametrize("content", ["deep", "device", "folder", "big"])
def test_files_that_cannot_be_descriptions_are_one_line(tmp_path, content):
    from grader.errors import InputError
    from grader.suites import load_suite
    from dist_lib.specs import MAX_FILE_BYTES
    readers = {"toml": [Cluster.load, Workload.load, load_suite], "json": [read_profile]}
    for kind, loaders in readers.items():
        path = tmp_path / ("DeviceType.A100_tp1_bs1.json" if kind == "json" else "f.toml")
        if content == "deep":  # the parsers recurse once per bracket
            path.write_text("[" * 100_000 if kind == "json" else "a = " + "[" * 100_000)
            expected = "nested too deeply"
        elif content == "big":
            path.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
            expected = "larger than 16 MiB"
        elif content == "folder":
            path.mkdir()
            expected = "not a regular file"
        elif kind == "toml":
            path = Path("/dev/zero")  # would be read forever
            expected = "not a regular file"
        else:
            continue  # a profile's file name must match DeviceType.*.json first
        for load in loaders:
            with pytest.raises((SpecError, InputError), match=expected):
                load(path)
        if content == "folder":
            path.rmdir()
