"""Every loader, fed random bytes, wrong types, missing keys and bad numbers, raises SpecError naming the file."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dist_lib import Cluster, SpecError, Workload
from dist_lib.metis import load_cluster
from dist_lib.profiles import read_profile

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
