"""Plans that know their hardware: a plan file records each node's device and ranks; a cluster listing the
same nodes in another order runs it remapped (and says so), any other is one error; built-in strategies run
trusted in this process, whatever the length of their program; the printed command works from any folder."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dist_lib import SpecError, simulate
from dist_lib.hardware.cluster import Cluster
from dist_lib.planner.hardware import fit_to, hardware_of
from dist_lib.planner.plan import Plan, Stage
from grader.cli import main

MIXED = "1x2xA100-80GB+1x2xV100-32GB"
SWAPPED = "1x2xV100-32GB+1x2xA100-80GB"
WORKLOAD = "toy:layers=4"


def _plan() -> Plan:
    # the A100 node (ranks 0, 1) holds three layers, the V100 node (ranks 2, 3) one
    stages = (Stage((0, 1), 1, ((0, 3),), (2, 2)), Stage((2, 3), 1, ((3, 4),), (2, 2)))
    return Plan(stages, 4, 2, hardware=hardware_of(Cluster.load(MIXED)))


def test_the_file_records_each_nodes_device_and_ranks(tmp_path):
    path = tmp_path / "plan.json"
    _plan().save(path)
    data = json.loads(path.read_text())
    assert data["hardware"] == [[0, "A100-80GB", 0, 1], [1, "V100-32GB", 2, 3]]
    loaded = Plan.load(path)
    assert loaded == _plan() and loaded.hardware == _plan().hardware
    with pytest.raises(SpecError, match=r"hardware must list \[node, device, first rank, last rank\]"):
        Plan.from_dict({**data, "hardware": [[0, "A100-80GB", 0]]})


def test_a_reordered_cluster_is_remapped_node_for_node_and_says_so():
    plan, note = fit_to(_plan(), Cluster.load(SWAPPED), "plan file p.json")
    assert [s.ranks for s in plan.stages] == [(2, 3), (0, 1)]
    assert "remapped node for node" in note and "node 0 (A100-80GB) -> 1" in note
    # the same step as on the cluster it was made for
    here = simulate("strategies/planned.py", MIXED, WORKLOAD, 8, plan=_plan())
    there = simulate("strategies/planned.py", SWAPPED, WORKLOAD, 8, plan=plan)
    assert there.time_s == here.time_s
    assert fit_to(_plan(), Cluster.load(MIXED)) == (_plan(), "")


def test_other_devices_are_one_error_never_a_silent_run():
    with pytest.raises(SpecError, match=r"made for other hardware: node 1 was 2 x V100-32GB .* is 2 x T4"):
        fit_to(_plan(), Cluster.load("1x2xA100-80GB+1x2xT4"), "plan file p.json")
    # from Python, the strategy refuses a plan whose hardware the cluster is not
    with pytest.raises(SpecError, match="made for other hardware"):
        simulate("strategies/planned.py", SWAPPED, WORKLOAD, 8, plan=_plan())
    # a plan without recorded hardware runs as before
    assert simulate("strategies/planned.py", SWAPPED, WORKLOAD, 8, plan=replace(_plan(), hardware=None)).correct


def test_run_remaps_from_another_folder(tmp_path, monkeypatch, capsys):
    path = tmp_path / "plan.json"
    _plan().save(path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["run", "planned", "--set", f"plan={path}", "--cluster", SWAPPED, "--workload", WORKLOAD,
                 "--batch", "8", "--json", "--no-plots"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["status"] == "ok"
    assert "note: plan file" in captured.err and "remapped" in captured.err
    assert main(["run", "planned", "--set", f"plan={path}", "--cluster", "1x2xA100-80GB+1x2xT4", "--workload",
                 WORKLOAD, "--batch", "8", "--no-plots"]) == 2
    assert "made for other hardware" in capsys.readouterr().err


def test_a_builtin_strategy_runs_trusted_past_the_sandboxs_program_cap(tmp_path, monkeypatch, capsys):
    import grader.runner.isolation as isolation
    # a cap of one byte: any recorded program is over it, and a built-in strategy records none
    monkeypatch.setattr(isolation.Limits, "__init__", _tiny_cap(isolation.Limits.__init__))
    path = tmp_path / "plan.json"
    _plan().save(path)
    assert main(["run", "planned", "--set", f"plan={path}", "--cluster", MIXED, "--workload", WORKLOAD, "--batch", "8",
                 "--json", "--no-plots", "--trace", str(tmp_path / "t.json")]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["status"] == "ok" and row["verified"]
    assert row["time_s"] == simulate("strategies/planned.py", MIXED, WORKLOAD, 8, plan=_plan(),
                                     memory_reserve=True).time_s


def _tiny_cap(init):
    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        object.__setattr__(self, "file_bytes", 1)
    return patched
