"""The parent's re-verification: honest logs of every built-in strategy pass, tampered logs do not."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from dist_lib import Cluster, Workload, simulate
from grader._worker import serialize
from grader.verify import verify

ROOT = Path(__file__).resolve().parents[1]
CLUSTER, WORKLOAD, BATCH = "2x2xA100-80GB", "toy:layers=4", 8
BUILTIN = sorted(p for p in (ROOT / "strategies").glob("*.py") if not p.name.startswith("_"))


def _payload(strategy, **options) -> dict:
    result = simulate(strategy, CLUSTER, WORKLOAD, BATCH, **options)
    return json.loads(json.dumps(serialize(result)))


def _verify(payload):
    return verify(payload, Cluster.load(CLUSTER), Workload.load(WORKLOAD), BATCH)


@pytest.fixture(scope="module")
def honest() -> dict:
    return _payload(str(ROOT / "tests" / "submissions" / "honest.py"))


OPTIONS = {"ddp": {"microbatch_size": 1}, "zero": {"microbatch_size": 1}, "interleaved": {"pp": 2},
           "hybrid": {"pp": 2, "tp": 2, "selective_recompute": True}}


@pytest.mark.parametrize("path", BUILTIN, ids=lambda p: p.stem)
def test_every_builtin_strategy_verifies(path):
    checked = _verify(_payload(str(path), **OPTIONS.get(path.stem, {})))
    assert checked.integrity == []
    assert checked.result.correct


def test_honest_figures_are_rederived(honest):
    checked = _verify(honest)
    assert checked.valid and checked.result.correct
    assert checked.result.time_s == pytest.approx(honest["time_s"])
    assert checked.result.memory_bytes == honest["memory_bytes"]


def _tamper(honest, change) -> list[str]:
    payload = copy.deepcopy(honest)
    change(payload)
    return _verify(payload).integrity


def _first(payload, op):
    return next(e for e in payload["events"] if e[1] == op)


def test_shortened_compute_is_flagged(honest):
    def change(p):
        e = _first(p, "forward")
        e[4] = e[3] + (e[4] - e[3]) / 2
    assert any("cost model gives" in m for m in _tamper(honest, change))


def test_collective_member_removed_is_flagged(honest):
    def change(p):
        p["events"].remove(_first(p, "all_reduce"))
    assert any("the group is" in m for m in _tamper(honest, change))


def test_overlapping_compute_is_flagged(honest):
    def change(p):
        compute = [e for e in p["events"] if e[0] == 0 and e[2] == "compute"]
        shift = compute[1][3] - compute[0][3]
        for e in compute[1:]:
            e[3] -= shift
            e[4] -= shift
    assert any("compute stream" in m for m in _tamper(honest, change))


def test_hidden_buffer_is_flagged(honest):
    def change(p):
        deltas = p["memory_log"][0][0]
        i = next(k for k, d in enumerate(deltas) if d > 0)
        deltas[i] = 0
    problems = _tamper(honest, change)
    assert any("no buffer of that size" in m or "peak memory" in m for m in problems)


def test_claimed_step_time_must_match_log(honest):
    def change(p):
        p["time_s"] /= 2
    assert any("reported step time" in m for m in _tamper(honest, change))


def test_fabricated_hand_in_without_update_is_flagged(honest):
    def change(p):
        p["events"] = [e for e in p["events"] if e[1] != "update"]
    assert any("has no update" in m for m in _tamper(honest, change))


def test_message_without_partner_is_flagged():
    payload = _payload(str(ROOT / "strategies" / "one_f_one_b.py"))
    recv = _first(payload, "recv")
    payload["events"].remove(recv)
    assert any("not one send and one recv" in m for m in _verify(payload).integrity)
