"""A simulated step as Chakra execution traces (MLCommons Chakra, the format ASTRA-sim reads), and back.

Target: Chakra 1.0.0, schema `schema/protobuf/et_def.proto` of github.com/mlcommons/chakra at commit
21585d8f2d65603d791d2121e3d4632351120262. A trace is one file per rank, `<prefix>.<rank>.et` (the naming of
chakra's converters), a stream of length-prefixed messages (`output.protobuf_wire`): a `GlobalMetadata`
(version "1.0.0", as chakra's generator writes) then one `Node` per op. Field numbers from et_def.proto:
Node id 1, name 2, type 3, ctrl_deps 4, data_deps 5, start_time_micros 6, duration_micros 7, attr 10;
AttributeProto name 1 and a oneof value (double_val 3, int32_val 7, int64_val 9, uint64_val 13, bool_val 27,
string_val 29, ...); NodeType COMP_NODE 4, COMM_SEND_NODE 5, COMM_RECV_NODE 6, COMM_COLL_NODE 7;
CollectiveCommType ALL_REDUCE 0, REDUCE 1, ALL_GATHER 2, BROADCAST 5, ALL_TO_ALL 6, REDUCE_SCATTER 7,
BARRIER 9. Attribute names and types are those chakra's feeder (src/feeder/et_feeder_node.cpp) reads:
`is_cpu_op` bool, `num_ops` int64, `tensor_size` uint64, `comm_type` int64, `comm_size` int64, `comm_src`,
`comm_dst`, `comm_tag` int32, `pg_name` string.

What each node holds: a compute op is a COMP_NODE (`num_ops` its FLOPs, `tensor_size` its bytes); a
collective a COMM_COLL_NODE on process group `pg_name` (numbered from 1 in the order of `comm_groups.json`,
written beside the traces in ASTRA-sim's communicator-group format, `{"1": [0, 1], ...}`); a message a
COMM_SEND_NODE or COMM_RECV_NODE whose `comm_tag` is its place on its (src, dst) channel. Besides the
microseconds the schema has, `start_seconds` and `duration_seconds` (doubles) keep the simulated times
exactly, and `layer` the layer. Dependencies (all in `data_deps`, which the feeder resolves) are what the
schedule implies: an op waits for the op before it on its own stream (compute, the group's communicator,
the channel), and for the op of its rank that ended last by its start (what the rank waited for).
`output.chakra_replay` replays them.
"""

from __future__ import annotations

import json
import struct
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dist_lib.errors import SpecError
from dist_lib.output import protobuf_wire as wire

SCHEMA = "mlcommons/chakra schema/protobuf/et_def.proto @ 21585d8f2d65603d791d2121e3d4632351120262 (Chakra 1.0.0)"
VERSION = "1.0.0"
COMP_NODE, COMM_SEND_NODE, COMM_RECV_NODE, COMM_COLL_NODE = 4, 5, 6, 7
NODE_TYPES = {COMP_NODE: "COMP_NODE", COMM_SEND_NODE: "COMM_SEND_NODE", COMM_RECV_NODE: "COMM_RECV_NODE",
              COMM_COLL_NODE: "COMM_COLL_NODE"}
COMM_TYPES = {"all_reduce": 0, "reduce": 1, "all_gather": 2, "broadcast": 5, "all_to_all": 6, "reduce_scatter": 7,
              "barrier": 9}
# AttributeProto's oneof fields by kind
_DOUBLE, _INT32, _INT64, _UINT64, _BOOL, _STRING = 3, 7, 9, 13, 27, 29
ATTRIBUTE_KINDS = {"is_cpu_op": _BOOL, "num_ops": _INT64, "tensor_size": _UINT64, "comm_type": _INT64,
                   "comm_size": _INT64, "comm_src": _INT32, "comm_dst": _INT32, "comm_tag": _INT32,
                   "pg_name": _STRING, "layer": _INT64, "start_seconds": _DOUBLE, "duration_seconds": _DOUBLE}
GROUPS_FILE = "comm_groups.json"


@dataclass
class ChakraNode:
    """One node of a rank's trace."""

    id: int
    name: str
    type: int
    data_deps: list[int] = field(default_factory=list)
    ctrl_deps: list[int] = field(default_factory=list)
    start_time_micros: int = 0
    duration_micros: int = 0
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        """Seconds: exact where the trace kept them, else the schema's microseconds."""
        exact = self.attrs.get("duration_seconds")
        return float(exact) if exact is not None else self.duration_micros * 1e-6


# ---- encoding -----------------------------------------------------------------------------------

def _attribute(name: str, value: Any) -> bytes:
    kind = ATTRIBUTE_KINDS[name]
    body = wire.string_field(1, name)
    if kind == _DOUBLE:
        body += wire.double_field(kind, float(value))
    elif kind == _STRING:
        body += wire.bytes_field(kind, str(value).encode("utf-8"))  # a oneof member is written even when empty
    else:  # varints; a oneof member is written even when zero
        body += wire.key(kind, wire.VARINT) + wire.varint(int(value))
    return body


def encode_node(node: ChakraNode) -> bytes:
    out = (wire.uint_field(1, node.id) + wire.string_field(2, node.name) + wire.uint_field(3, node.type)
           + wire.packed_uints(4, node.ctrl_deps) + wire.packed_uints(5, node.data_deps)
           + wire.uint_field(6, node.start_time_micros) + wire.uint_field(7, node.duration_micros))
    return out + b"".join(wire.bytes_field(10, _attribute(k, v)) for k, v in node.attrs.items())


def encode_metadata(version: str = VERSION) -> bytes:
    return wire.string_field(1, version)


# ---- decoding -----------------------------------------------------------------------------------

def _decode_attribute(data: bytes) -> tuple[str, Any]:
    name, value = "", None
    for number, wire_type, raw in wire.fields(data):
        if number == 1:
            name = bytes(raw).decode("utf-8")  # type: ignore[arg-type]
        elif wire_type == wire.FIXED64 and number == 3:
            value = struct.unpack("<d", raw)[0]  # type: ignore[arg-type]
        elif wire_type == wire.FIXED32 and number == 5:
            value = struct.unpack("<f", raw)[0]  # type: ignore[arg-type]
        elif wire_type == wire.VARINT:
            if number in (7, 9):  # int32, int64
                value = wire.signed64(raw)  # type: ignore[arg-type]
            elif number in (15, 17):  # sint32, sint64: zigzag
                value = (raw >> 1) ^ -(raw & 1)  # type: ignore[operator]
            elif number == 27:
                value = bool(raw)
            else:
                value = raw
        elif wire_type == wire.LENGTH and number == 29:
            value = bytes(raw).decode("utf-8")  # type: ignore[arg-type]
        elif wire_type == wire.LENGTH:
            value = bytes(raw)  # type: ignore[arg-type]  # lists and bytes: kept raw
    return name, value


def decode_node(data: bytes) -> ChakraNode:
    node = ChakraNode(0, "", 0)
    for number, wire_type, value in wire.fields(data):
        if number == 1:
            node.id = int(value)  # type: ignore[arg-type]
        elif number == 2:
            node.name = bytes(value).decode("utf-8")  # type: ignore[arg-type]
        elif number == 3:
            node.type = int(value)  # type: ignore[arg-type]
        elif number == 4:
            node.ctrl_deps += wire.unpack_uints(value, wire_type)
        elif number == 5:
            node.data_deps += wire.unpack_uints(value, wire_type)
        elif number == 6:
            node.start_time_micros = int(value)  # type: ignore[arg-type]
        elif number == 7:
            node.duration_micros = int(value)  # type: ignore[arg-type]
        elif number == 10:
            name, attr = _decode_attribute(bytes(value))  # type: ignore[arg-type]
            node.attrs[name] = attr
    return node


@dataclass
class ChakraTrace:
    """Every rank's nodes, in file order, and the version its metadata names."""

    version: str
    ranks: list[list[ChakraNode]]
    groups: dict[str, list[int]] = field(default_factory=dict)


def read_rank(path: str | Path) -> tuple[str, list[ChakraNode]]:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the Chakra trace ({exc.strerror or exc})") from None
    try:
        messages = list(wire.read_delimited(data))
        if not messages:
            raise wire.WireError("no GlobalMetadata message")
        version = ""
        for number, _, value in wire.fields(messages[0]):
            if number == 1:
                version = bytes(value).decode("utf-8")  # type: ignore[arg-type]
        return version, [decode_node(m) for m in messages[1:]]
    except (wire.WireError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: not a Chakra execution trace: {exc}") from None


def read_chakra(directory: str | Path, prefix: str = "step") -> ChakraTrace:
    """The traces `<prefix>.0.et`, `<prefix>.1.et`, ... of `directory` (ranks from 0 without a gap)."""
    directory = Path(directory)
    ranks, version = [], ""
    while (path := directory / f"{prefix}.{len(ranks)}.et").is_file():
        version, nodes = read_rank(path)
        ranks.append(nodes)
    if not ranks:
        raise SpecError(f"{directory}: no Chakra trace {prefix}.0.et")
    groups_path = directory / GROUPS_FILE
    groups = json.loads(groups_path.read_text()) if groups_path.is_file() else {}
    return ChakraTrace(version, ranks, groups)


# ---- a simulated step as nodes ------------------------------------------------------------------

def _stream_key(event: Any) -> tuple:
    if event.stream == "compute":
        return ("compute",)
    if event.stream == "collective":
        return ("group", event.peers)
    return ("p2p", event.op, event.peers)


def step_nodes(result: Any) -> tuple[list[list[ChakraNode]], dict[str, list[int]]]:
    """Each rank's nodes of a simulated step (`Result`), and the process groups by name."""
    if getattr(result, "representatives", None):
        raise SpecError("a folded step has events for one replica only: simulate it with fold=False to export "
                        "every rank's Chakra trace")
    world = result.cluster.world_size
    by_rank: list[list[Any]] = [[] for _ in range(world)]
    for event in result.events:
        by_rank[event.rank].append(event)
    groups = sorted({e.peers for e in result.events if e.stream == "collective"})
    pg_names = {ranks: str(i + 1) for i, ranks in enumerate(groups)}
    out = []
    for rank, events in enumerate(by_rank):
        events.sort(key=lambda e: (e.start, e.end))  # stable: ties keep the log's order
        out.append(_rank_nodes(events, pg_names))
    return out, {name: list(ranks) for ranks, name in pg_names.items()}


def _rank_nodes(events: list[Any], pg_names: dict[tuple, str]) -> list[ChakraNode]:
    nodes: list[ChakraNode] = []
    last_on_stream: dict[tuple, int] = {}
    seq: dict[tuple, int] = {}
    ends: list[tuple[float, int]] = []  # (end, index) of the nodes so far, sorted by end
    for i, e in enumerate(events):
        deps = []
        stream = _stream_key(e)
        if stream in last_on_stream:
            deps.append(last_on_stream[stream])
        j = bisect_right(ends, (e.start, len(events)))  # the op of this rank that ended last by e's start
        if j:
            waited = ends[j - 1][1]
            if waited not in deps:
                deps.append(waited)
        last_on_stream[stream] = i
        k = seq[stream] = seq.get(stream, -1) + 1
        node = ChakraNode(i, f"{e.op} layer {e.layer}" + (f" {e.detail}" if e.detail else ""), COMP_NODE,
                          data_deps=deps, start_time_micros=round(e.start * 1e6),
                          duration_micros=round(e.duration * 1e6))
        attrs: dict[str, Any] = {"is_cpu_op": False}
        if e.stream == "compute":
            attrs |= {"num_ops": round(e.flops), "tensor_size": e.nbytes}
        elif e.stream == "collective":
            if e.op not in COMM_TYPES:
                raise SpecError(f"rank {e.rank}: collective {e.op!r} has no Chakra CollectiveCommType")
            node.type = COMM_COLL_NODE
            attrs |= {"comm_type": COMM_TYPES[e.op], "comm_size": e.nbytes, "pg_name": pg_names[e.peers]}
        else:
            src, dst = e.peers
            node.type = COMM_SEND_NODE if e.op == "send" else COMM_RECV_NODE
            attrs |= {"comm_src": src, "comm_dst": dst, "comm_tag": k, "comm_size": e.nbytes}
        node.attrs = attrs | {"layer": e.layer, "start_seconds": e.start, "duration_seconds": e.duration}
        nodes.append(node)
        ends.insert(bisect_right(ends, (e.end, i)), (e.end, i))
    return nodes


def write_chakra(result: Any, directory: str | Path, prefix: str = "step") -> list[Path]:
    """Write a simulated step as `<prefix>.<rank>.et` files and `comm_groups.json` in `directory`."""
    ranks, groups = step_nodes(result)
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        paths = []
        for rank, nodes in enumerate(ranks):
            path = directory / f"{prefix}.{rank}.et"
            with path.open("wb") as stream:
                wire.write_delimited(stream, encode_metadata())
                for node in nodes:
                    wire.write_delimited(stream, encode_node(node))
            paths.append(path)
        (directory / GROUPS_FILE).write_text(json.dumps(groups, indent=1) + "\n")
    except OSError as exc:
        raise SpecError(f"{directory}: cannot write the Chakra traces ({exc.strerror or exc})") from None
    return paths
