"""Cluster specs, files, and the errors bad ones give."""

from __future__ import annotations

import pytest

from dist_lib import Cluster, SpecError
from dist_lib.hardware.devices import GB, GiB


def test_spec_lays_ranks_out_node_by_node():
    cluster = Cluster.parse("2x8xA100-80GB+1x4xT4")
    assert cluster.world_size == 20
    assert [cluster.node_of(r) for r in (0, 7, 8, 15, 16, 19)] == [0, 0, 1, 1, 2, 2]
    assert cluster.device_of(16).name == "T4"
    assert cluster.device_of(3).memory_bytes == 80 * GiB
    assert list(cluster.ranks_of_node(1)) == list(range(8, 16))
    assert cluster.name == "2x8xA100-80GB+1x4xT4"


def test_short_forms_and_link_overrides():
    assert Cluster.parse("8xH100-80GB").world_size == 8
    assert Cluster.parse("t4").device_of(0).name == "T4"
    cluster = Cluster.parse("2x4xA100-80GB:inter=50:intra=100")
    assert cluster.nodes[0].inter_link.bandwidth == 50 * GB
    assert cluster.nodes[0].intra_link.bandwidth == 100 * GB


def test_node_nics_are_shared_by_the_node_gpus_and_round_trip_through_toml(tmp_path):
    # AWS p3.8xlarge: one 10 Gb/s (1.25 GB/s) NIC for four V100s; g4dn.12xlarge: 50 Gb/s for four T4s
    cluster = Cluster.parse("2x4xV100-16GB:nics=1x1.25+1x4xT4:nics=1x6.25")
    v100, t4 = cluster.nodes[0], cluster.nodes[2]
    assert (v100.nics, v100.inter_link.bandwidth, t4.nics, t4.inter_link.bandwidth) == (1, 1.25 * GB, 1, 6.25 * GB)
    # a ring over all 12 GPUs crosses nodes through one NIC per node, not four
    assert cluster.topology(range(12)).nics == 1
    assert Cluster.parse("2x4xV100-16GB").topology(range(8)).nics == 4
    # both GPUs' messages leave node 0 through its one NIC (the same link id, one unit each)
    assert cluster.p2p_usage(0, 4)[0] == cluster.p2p_usage(1, 5)[0]
    path = tmp_path / "cloud.toml"
    path.write_text(cluster.to_toml())
    assert "nics = 1" in path.read_text() and "nic_bandwidth_GBps = 1.25" in path.read_text()
    assert Cluster.from_toml(path) == cluster


def test_every_cluster_spec_in_the_reference_table_parses():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "reference" / "cluster-toml.md").read_text()
    section = text[text.index("| spec | meaning |"):text.index("## TOML file")]
    specs = re.findall(r"^\| `([^`]+)` \|", section, flags=re.M)
    clusters = {spec: Cluster.parse(spec) for spec in specs}
    assert len(clusters) >= 4
    shared = clusters["2x4xV100-16GB:nics=1x1.25+1x4xT4:nics=1x6.25"]
    assert [node.nics for node in shared.nodes] == [1, 1, 1]


def test_node_nics_in_toml_need_a_count(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[[nodes]]\ndevice = "T4"\ngpus = 4\nnic_bandwidth_GBps = 6.25\n')
    with pytest.raises(SpecError, match=r"bad.toml: nodes\[0\]: nic_bandwidth_GBps needs nics, the count"):
        Cluster.from_toml(path)


def test_node_nics_in_toml_exclude_a_per_gpu_nic_and_default_to_the_inter_node_figure(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[[nodes]]\ndevice = "T4"\ngpus = 4\nnics = 1\ninter_bandwidth_GBps = 6.25\n')
    with pytest.raises(SpecError, match=r"nics and inter_bandwidth_GBps exclude each other"):
        Cluster.from_toml(path)
    path.write_text('[[nodes]]\ndevice = "T4"\ngpus = 4\nnics = 1\n')
    node = Cluster.from_toml(path).nodes[0]
    assert node.nics == 1 and node.inter_link == Cluster.parse("1x4xT4").nodes[0].inter_link


@pytest.mark.parametrize("spec, message", [
    ("", "expected terms"),
    ("2x8xB300", "unknown device 'B300'"),
    ("0x8xA100-80GB", "nodes: must be a whole number from 1 to 131072"),
    ("2x8xA100-80GB:inter=fast", "expected a number"),
    ("2x8xA100-80GB:speed=3", "expected inter=GBps"),
    ("2x8xA100-80GB+", "expected terms"),
    ("2x8xA100-80GB:inter=-1", r"inter_bandwidth_GBps: must be at least 0.001 and at most 2000"),
    ("4xT4:nics=one", "expected nics=COUNTxGBps"),
    ("4xT4:nics=0x6.25", "nics: must be a whole number from 1"),
    ("4xT4:nics=1x0", r"nic_bandwidth_GBps: must be at least 0.001"),
])
def test_bad_specs_name_the_problem(spec, message):
    with pytest.raises(SpecError, match=message):
        Cluster.parse(spec)


def test_unknown_device_suggests_close_names():
    with pytest.raises(SpecError, match="did you mean.*A100-80GB"):
        Cluster.parse("4xA100-80G")


def test_toml_cluster_with_custom_device(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("""
[devices.MI250]
peak_tflops = 362
memory_GiB = 128
hbm_GBps = 3277
intra_bandwidth_GBps = 100

[[nodes]]
device = "A100-80GB"
count = 2
gpus = 4
inter_bandwidth_GBps = 12.5

[[nodes]]
device = "MI250"
gpus = 2
""")
    cluster = Cluster.load(str(path))
    assert cluster.world_size == 10
    assert cluster.nodes[1].inter_link.bandwidth == 12.5 * GB
    assert cluster.device_of(9).name == "MI250"
    assert cluster.device_of(9).peak_flops == 362e12
    assert cluster.nodes[2].intra_link.bandwidth == 100 * GB


@pytest.mark.parametrize("text, message", [
    ("nodes = 3", "at least one"),
    ("[[nodes]]\ngpus = 4", r"nodes\[0\].device: missing"),
    ("[[nodes]]\ndevice = 'T4'\ngpus = 0", r"nodes\[0\].gpus"),
    ("[[nodes]]\ndevice = 'T4'\ncolour = 'red'", "unknown field"),
    ("[[nodes]\n", "not valid TOML"),
    ("[devices.X]\npeak_tflops = 1\n[[nodes]]\ndevice='X'", r"devices.X.memory_GiB: missing"),
    ("[devices.A100-80GB]\npeak_tflops = 1\nmemory_GiB = 8\nhbm_GBps = 100\n[[nodes]]\ndevice='A100-80GB'",
     r"devices.A100-80GB: 'A100-80GB' already names the device A100-80GB \(names are case-insensitive\); give yours "
     r"another name, with like = \"A100-80GB\" to start from its figures"),
    ("[devices.t4]\npeak_tflops = 1\nmemory_GiB = 8\nhbm_GBps = 100\n[[nodes]]\ndevice='T4'",
     r"devices.t4: 't4' already names the device T4"),
    ("[devices.My]\npeak_tflops = 1\nmemory_GiB = 8\nhbm_GBps = 100\n[devices.MY]\npeak_tflops = 2\nmemory_GiB = 8\n"
     "hbm_GBps = 100\n[[nodes]]\ndevice='My'", r"devices.MY: 'MY' already names the device My \(names are "
     r"case-insensitive\); give yours another name$"),
])
def test_bad_cluster_files_name_file_and_field(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SpecError, match=message) as info:
        Cluster.from_toml(path)
    assert "bad.toml" in str(info.value)


def test_missing_cluster_file(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        Cluster.load(str(tmp_path / "nope.toml"))
