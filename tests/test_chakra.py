"""Chakra execution traces: the wire format, a simulated step exported and replayed to the same times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dist_lib import SpecError, simulate
from dist_lib.output import protobuf_wire as wire
from dist_lib.output.chakra import (COMM_COLL_NODE, COMM_RECV_NODE, COMM_SEND_NODE, COMP_NODE, ChakraNode,
                                    decode_node, encode_node, read_chakra, write_chakra)
from dist_lib.output.chakra_replay import replay
from grader.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_the_wire_format_is_protobufs():
    # https://protobuf.dev/programming-guides/encoding/: 150 is 96 01; field 1 = 150 is 08 96 01
    assert wire.varint(150) == b"\x96\x01" and wire.varint(300) == b"\xac\x02"
    assert wire.uint_field(1, 150) == b"\x08\x96\x01"
    assert wire.string_field(2, "testing") == b"\x12\x07testing"
    assert wire.varint(-2) == b"\xfe" + b"\xff" * 8 + b"\x01"  # an int64 -2: ten bytes
    assert wire.signed64(wire.read_varint(wire.varint(-2), 0)[0]) == -2
    assert wire.packed_uints(4, [3, 270, 86942]) == b"\x22\x06\x03\x8e\x02\x9e\xa7\x05"  # the docs' packed example
    with pytest.raises(wire.WireError, match="runs past the end"):
        list(wire.read_delimited(b"\x05ab"))


def test_a_node_reads_back_as_written():
    node = ChakraNode(7, "all_reduce layer 0", COMM_COLL_NODE, data_deps=[3, 5], start_time_micros=12,
                      duration_micros=0, attrs={"is_cpu_op": False, "comm_type": 0, "comm_size": 2**40,
                                                "pg_name": "1", "duration_seconds": 1.25e-7, "comm_tag": 0})
    assert decode_node(encode_node(node)) == node
    # field 1 (id) = 7, field 2 (name), field 3 (type) = 7; zero duration left out as proto3 does
    assert encode_node(node)[:2] == b"\x08\x07" and b"\x38" not in encode_node(node)[:40].split(b"layer 0")[1][:4]


CASES = {
    "1f1b-dp": ("hybrid", "1x4xA100-80GB", "gpt-350m:layers=4", 8, {"pp": 2, "dp": 2, "microbatch_size": 2}),
    "tp-pp-dp": ("hybrid", "2x4xA100-80GB", "gpt-350m:layers=4", 16, {"pp": 2, "dp": 2, "tp": 2,
                                                                      "microbatch_size": 2}),
    "zero-mixed": ("zero", "1x2xA100-80GB+1x2xV100-32GB", "gpt-350m:layers=2", 16, {}),
    "moe": ("moe", "1x4xA100-80GB", "mixtral-8x7b:layers=2,seq=256", 8, {}),
}


@pytest.mark.parametrize("case", CASES)
def test_an_exported_step_replays_to_the_same_times(case, tmp_path):
    name, cluster, workload, batch, options = CASES[case]
    result = simulate(ROOT / "strategies" / f"{name}.py", cluster, workload, batch, fold=False,
                      enforce_memory=False, **options)
    paths = write_chakra(result, tmp_path)
    assert [p.name for p in paths] == [f"step.{r}.et" for r in range(result.cluster.world_size)]
    trace = read_chakra(tmp_path)
    assert trace.version == "1.0.0"
    events = sorted((e.rank, e.start, e.end, e.op) for e in result.events)
    nodes = sorted((r, n.attrs["start_seconds"], n.attrs["start_seconds"] + n.duration, n.name.split()[0])
                   for r, rank in enumerate(trace.ranks) for n in rank)
    assert nodes == events  # every op, once, with its times
    replayed = replay(trace)
    assert replayed.end == pytest.approx(result.time_s, rel=1e-12)
    for r, rank in enumerate(trace.ranks):  # not just the end: every op starts when it started
        for n in rank:
            assert replayed.starts[r][n.id] == pytest.approx(n.attrs["start_seconds"], rel=1e-12, abs=1e-15)
    # with only the schema's whole microseconds, the step ends within a microsecond an op
    for rank in trace.ranks:
        for n in rank:
            del n.attrs["duration_seconds"]
    ops = max(len(rank) for rank in trace.ranks)
    assert replay(trace).end == pytest.approx(result.time_s, abs=ops * 0.5e-6)
    kinds = {n.type for rank in trace.ranks for n in rank}
    assert COMP_NODE in kinds and COMM_COLL_NODE in kinds
    if case == "1f1b-dp":
        assert {COMM_SEND_NODE, COMM_RECV_NODE} <= kinds
        assert json.loads((tmp_path / "comm_groups.json").read_text()) == {"1": [0, 1], "2": [2, 3]}


def test_a_broken_trace_is_named(tmp_path):
    result = simulate(ROOT / "strategies" / "ddp.py", "1x2xA100-80GB", "gpt-350m:layers=2", 8, fold=False)
    write_chakra(result, tmp_path)
    (tmp_path / "step.1.et").unlink()
    with pytest.raises(SpecError, match="never starts"):
        replay(read_chakra(tmp_path))  # rank 0's all-reduces wait for a member that is gone
    (tmp_path / "step.0.et").write_bytes(b"\x09abc")
    with pytest.raises(SpecError, match="step.0.et: not a Chakra execution trace"):
        read_chakra(tmp_path)
    with pytest.raises(SpecError, match="fold=False"):
        write_chakra(simulate(ROOT / "strategies" / "ddp.py", "2x2xA100-80GB", "gpt-350m:layers=2", 16), tmp_path)


def test_the_command_writes_and_checks_the_traces(tmp_path, capsys):
    out = tmp_path / "chakra"
    assert main(["export-chakra", "ddp", "--cluster", "1x2xA100-80GB", "--workload", "gpt-350m:layers=2",
                 "--batch", "8", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    simulated, replayed = (line for line in printed.splitlines() if line.startswith("step")).__next__().split(",")
    assert simulated.split()[1] == replayed.split()[0]
    assert sorted(p.name for p in out.iterdir()) == ["comm_groups.json", "step.0.et", "step.1.et"]
