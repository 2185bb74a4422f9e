"""Metis host and cluster files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dist_lib import Cluster, SpecError
from dist_lib.hardware.devices import GB, GiB
from dist_lib.hardware.metis import load_cluster, read_hostfile

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "metis"


def test_example_cluster():
    cluster = Cluster.load(f"metis:{EXAMPLES / 'hostfile'},{EXAMPLES / 'clusterfile.json'}")
    assert cluster.world_size == 12
    assert [n.device.name for n in cluster.nodes] == ["A100-80GB", "A100-40GB", "T4"]
    assert cluster.nodes[0].intra_link.bandwidth == 300 * GB
    assert cluster.nodes[2].inter_link.bandwidth == 6.25 * GB
    assert cluster.nodes[1].device.memory_bytes == 40 * GiB
    # ranks 0-3 on node 0; a p2p from the first A100 node to the T4 node crosses the slower NIC
    assert cluster.p2p_link(0, 8).bandwidth == 6.25 * GB


def test_host_file_forms(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# comment\n1.1.1.1 slots=12\n\n1.1.1.2 3  # trailing\n")
    assert read_hostfile(path) == [("1.1.1.1", 12), ("1.1.1.2", 3)]


def _files(tmp_path, hosts: str, info: dict):
    (tmp_path / "h").write_text(hosts)
    (tmp_path / "c.json").write_text(json.dumps(info))
    return tmp_path / "h", tmp_path / "c.json"


GOOD = {"instance_type": "V100", "inter_bandwidth": 10, "intra_bandwidth": 50, "memory": 16}


@pytest.mark.parametrize("hosts, info, message", [
    ("1.1.1.1 slots=x\n", {"1.1.1.1": GOOD}, r"h:1: slots: expected a whole number from 1 to"),
    ("1.1.1.1 slots=0\n", {"1.1.1.1": GOOD}, "slots: must be a whole number from 1 to 131072, got 0"),
    ("1.1.1.1\n", {"1.1.1.1": GOOD}, "expected 'IP slots=N'"),
    ("1.1.1.1 2\n1.1.1.1 2\n", {"1.1.1.1": GOOD}, "listed twice"),
    ("", {"1.1.1.1": GOOD}, "no hosts"),
    ("1.1.1.2 2\n", {"1.1.1.1": GOOD}, "1.1.1.2: host from"),
    ("1.1.1.1 2\n", {"1.1.1.1": {**GOOD, "memory": -1}}, r"1\.1\.1\.1\.memory"),
    ("1.1.1.1 2\n", {"1.1.1.1": {**GOOD, "inter_bandwidth": 312500000.0}}, "looks like bytes/s"),
    ("1.1.1.1 2\n", {"1.1.1.1": {**GOOD, "intra_bandwidth": 0}}, "intra_bandwidth"),
    ("1.1.1.1 2\n", {"1.1.1.1": {k: v for k, v in GOOD.items() if k != "memory"}}, "missing field.*memory"),
    ("1.1.1.1 2\n", {"1.1.1.1": {**GOOD, "instance_type": "K80"}}, "unknown device"),
    ("1.1.1.1 2\n", {"1.1.1.1": {**GOOD, "memory": "16"}}, "expected a number"),
])
def test_bad_metis_files(tmp_path, hosts, info, message):
    with pytest.raises(SpecError, match=message):
        load_cluster(*_files(tmp_path, hosts, info))


def test_bad_spec_and_json(tmp_path):
    with pytest.raises(SpecError, match="HOSTFILE,CLUSTERFILE"):
        Cluster.load("metis:onlyone")
    hosts, cfile = _files(tmp_path, "1.1.1.1 2\n", {})
    cfile.write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        load_cluster(hosts, cfile)
    with pytest.raises(SpecError, match="cannot read"):
        load_cluster(tmp_path / "missing", cfile)
