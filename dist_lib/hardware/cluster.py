"""Clusters: nodes of (possibly different) GPUs, the links between them, and how ranks map onto them.

Ranks are laid out node by node: a `2x8xA100-80GB+1x4xT4` cluster has ranks 0-7 on node 0, 8-15 on
node 1 and 16-19 on the T4 node. Three ways to describe one:

* a spec string: `NODESxGPUSxDEVICE` terms joined by `+`, each optionally followed by
  `:inter=GBps`, `:intra=GBps` (per-GPU bandwidth each way, decimal GB/s), e.g. `2x8xA100-80GB:inter=50`,
  or `:nics=COUNTxGBps` for NICs that belong to the node and are shared by its GPUs (many cloud
  instances: AWS p3.8xlarge has one 10 Gb/s NIC for four V100s, `4xV100-16GB:nics=1x1.25`);
  `8xA100-80GB` is one node of eight, a bare `T4` one GPU;
* a TOML file (see `Cluster.from_toml`);
* other `scheme:argument` specs registered in `SPEC_SCHEMES` (e.g. Metis cluster files).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from dist_lib.hardware.topology import Topology, ring_bandwidth
from dist_lib.hardware.devices import GB, GiB, Device, Link, get_device
from dist_lib.errors import SpecError
from dist_lib.specs import load_spec, number, read_toml, shown, table, text, whole


# Accepted ranges of the figures a cluster description gives, by field-name suffix (units as named):
# beyond them a value is a typo or a unit mistake (NVLink 5 is 900 GB/s per GPU each way, the largest
# GPU memory 192 GB, the fastest dense 16-bit peak about 2.5 PFLOP/s).
FIGURE_RANGES = {"bandwidth_GBps": (1e-3, 2000.0), "latency_us": (0.0, 1e6), "peak_tflops": (1e-3, 1e5),
                 "memory_GiB": (1e-3, 1024.0), "hbm_GBps": (1e-3, 1e5), "max_efficiency": (1e-3, 1.0),
                 "price_per_hour": (1e-6, 1e4)}
MAX_WORLD_SIZE = 2**17  # GPUs in one cluster, above the largest built (about 100,000)


@dataclass(frozen=True, slots=True)
class Node:
    """A host with `gpus` devices of one type, an intra-node link and its network links: a NIC per GPU
    (`nics` = 0, `inter_link` is each GPU's), or `nics` NICs that belong to the node and are shared by
    its GPUs (`inter_link` is one NIC's)."""

    device: Device
    gpus: int
    intra_link: Link
    inter_link: Link
    nics: int = 0

    def __post_init__(self) -> None:
        whole(self.gpus, f"node of {self.device.name}: gpus", 1, MAX_WORLD_SIZE, exact=True)
        whole(self.nics, f"node of {self.device.name}: nics", 0, MAX_WORLD_SIZE, exact=True)

    def nics_for(self, members: int) -> int:
        """NICs that `members` of this node's GPUs drive side by side (NCCL runs a ring channel per NIC)."""
        return members if not self.nics else min(members, self.nics)


@dataclass(frozen=True)
class Cluster:
    """An ordered tuple of nodes; rank r lives on `node_of(r)`."""

    nodes: tuple[Node, ...]
    name: str = ""
    _rank_node: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _node_start: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise SpecError("a cluster needs at least one node")
        object.__setattr__(self, "nodes", tuple(self.nodes))
        _check_world_size(sum(node.gpus for node in self.nodes), self.name or "cluster")
        rank_node = tuple(i for i, node in enumerate(self.nodes) for _ in range(node.gpus))
        object.__setattr__(self, "_rank_node", rank_node)
        starts = [0]
        for node in self.nodes:
            starts.append(starts[-1] + node.gpus)
        object.__setattr__(self, "_node_start", tuple(starts))
        if not self.name:
            object.__setattr__(self, "name", _describe(self.nodes))

    @property
    def world_size(self) -> int:
        return len(self._rank_node)

    def node_of(self, rank: int) -> int:
        return self._rank_node[rank]

    def device_of(self, rank: int) -> Device:
        return self.nodes[self._rank_node[rank]].device

    def ranks_of_node(self, node: int) -> range:
        return range(self._node_start[node], self._node_start[node + 1])

    # ---- the links transfers share (see `engine/transfers.py`) ------------------------------------------
    # Link ids: each GPU's NVLink/PCIe port out and in, its own NIC out and in (4 per rank), then each
    # node's shared NICs out and in. Capacities and demands are whole bytes/s (achieved bandwidth), so
    # that sums of demands are exact and shares the same whatever order transfers start in.

    def link_capacities(self) -> list[int]:
        """Bytes/s each link carries, by link id."""
        capacity: list[int] = []
        for node in self.nodes:
            port, nic = round(node.intra_link.achieved_bandwidth), round(node.inter_link.achieved_bandwidth)
            capacity += [port, port, nic, nic] * node.gpus
        for node in self.nodes:
            shared = round(node.inter_link.achieved_bandwidth) * max(node.nics, 1)
            capacity += [shared, shared]
        return capacity

    def _nic_links(self, rank: int) -> tuple[int, int]:
        """(out, in) ids of the NIC `rank` sends and receives through."""
        node = self._rank_node[rank]
        if self.nodes[node].nics:
            base = 4 * self.world_size + 2 * node
            return base, base + 1
        return 4 * rank + 2, 4 * rank + 3

    def p2p_usage(self, src: int, dst: int) -> tuple[tuple[int, int], ...]:
        """(link id, bytes/s) a message from `src` to `dst` wants: its link's bandwidth on the sender's
        port or NIC out and the receiver's in (links are full duplex)."""
        rate = round(self.p2p_link(src, dst).achieved_bandwidth)
        if self._rank_node[src] == self._rank_node[dst]:
            return ((4 * src, rate), (4 * dst + 1, rate))
        return ((self._nic_links(src)[0], rate), (self._nic_links(dst)[1], rate))

    def collective_usage(self, ranks: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """(link id, bytes/s) a collective over `ranks` wants each way: within a node the ring's bandwidth
        on every member's port; across nodes the ring's bandwidth through each node's NICs (its
        bottleneck; the intra-node phases are not counted against the ports), spread over the members'
        own NICs or on the node's shared ones. A ring slowed by a slower node wants only that much of
        a faster node's NIC."""
        if len(ranks) <= 1:
            return ()
        rate = ring_bandwidth(self.topology(ranks))
        nodes = [self._rank_node[r] for r in ranks]
        if len(set(nodes)) == 1:
            return tuple((4 * r + d, round(rate)) for r in ranks for d in (0, 1))
        members: dict[int, int] = {}
        for n in nodes:
            members[n] = members.get(n, 0) + 1
        usage: dict[int, int] = {}
        for r, n in zip(ranks, nodes):
            out, into = self._nic_links(r)
            share = rate if self.nodes[n].nics else rate / members[n]
            usage[out] = usage[into] = round(share)
        return tuple(usage.items())

    def p2p_link(self, src: int, dst: int) -> Link:
        """The link a point-to-point transfer crosses: NVLink/PCIe inside a node, else the slower NIC."""
        a, b = self._rank_node[src], self._rank_node[dst]
        if a == b:
            return self.nodes[a].intra_link
        return _bottleneck((self.nodes[a].inter_link, self.nodes[b].inter_link))

    def ring_link(self, ranks: Sequence[int]) -> Link:
        """The slowest hop of a ring over `ranks` (in rank order): a ring moves at its bottleneck."""
        nodes = [self._rank_node[r] for r in ranks]
        links: set[Link] = set()
        for a, b in zip(nodes, nodes[1:] + nodes[:1]):
            if a == b:
                links.add(self.nodes[a].intra_link)
            else:
                links.update((self.nodes[a].inter_link, self.nodes[b].inter_link))
        return _bottleneck(tuple(links))

    def topology(self, ranks: Sequence[int]) -> Topology:
        """Where a group's ranks sit, for choosing between a flat ring and a hierarchical collective."""
        nodes = [self._rank_node[r] for r in ranks]
        counts: dict[int, int] = {}
        for n in nodes:
            counts[n] = counts.get(n, 0) + 1
        per_node = next(iter(counts.values())) if len(set(counts.values())) == 1 else 0
        shared = [self.nodes[n].intra_link for n, c in counts.items() if c > 1]
        inter = _bottleneck(tuple(self.nodes[n].inter_link for n in counts)) if len(counts) > 1 else None
        nics = min(self.nodes[n].nics_for(c) for n, c in counts.items())
        return Topology(len(nodes), len(counts), per_node, self.ring_link(ranks),
                        _bottleneck(tuple(shared)) if shared else None, inter, nics)

    def __str__(self) -> str:
        return self.name

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def parse(cls, spec: str) -> Cluster:
        """Build a cluster from a spec string such as `2x8xA100-80GB+1x4xT4:inter=12.5`."""
        terms = [t.strip() for t in spec.split("+")]
        if not spec.strip() or any(not t for t in terms):
            raise SpecError(f"cluster spec {shown(spec)}: expected terms like 2x8xA100-80GB joined by '+'")
        nodes: list[Node] = []
        for term in terms:
            nodes.extend(_parse_term(term, spec))
        return cls(tuple(nodes))

    @classmethod
    def from_toml(cls, path: str | Path) -> Cluster:
        """Read a cluster file::

            [devices.MyGPU]              # optional custom devices
            peak_tflops = 100
            memory_GiB = 24
            hbm_GBps = 800
            intra_bandwidth_GBps = 25    # defaults for nodes of this device
            inter_bandwidth_GBps = 12.5
            max_efficiency = 0.6
            price_per_hour = 1.5         # USD per GPU-hour, for the planner's cost objective and budget

            [[nodes]]
            device = "A100-80GB"
            count = 2                    # identical nodes, default 1
            gpus = 8
            inter_bandwidth_GBps = 25    # optional overrides, also intra_bandwidth_GBps,
                                         # intra_latency_us, inter_latency_us
            # or NICs that belong to the node, shared by its GPUs (instead of one per GPU):
            # nics = 1
            # nic_bandwidth_GBps = 1.25  # each NIC's, each way (10 Gb/s); default: the inter-node link's
        """
        return cls.from_dict(read_toml(path, "cluster"), source=str(path))

    @classmethod
    def from_dict(cls, data: dict, source: str = "<cluster>") -> Cluster:
        if not isinstance(data, dict):
            raise SpecError(f"{source}: expected a table with [[nodes]]")
        table(data, source, {"name", "devices", "nodes"})
        custom: dict[str, Device] = {}
        for name, spec in table(data.get("devices", {}), f"{source}: devices").items():
            _check_new_device_name(name, custom, f"{source}: devices.{name}")
            custom[name] = _custom_device(name, spec, f"{source}: devices.{name}")
        entries = data.get("nodes")
        if not isinstance(entries, list) or not entries:
            raise SpecError(f"{source}: needs at least one [[nodes]] entry")
        nodes: list[Node] = []
        total = 0
        for i, entry in enumerate(entries):
            where = f"{source}: nodes[{i}]"
            entry = table(entry, where)
            unknown = set(entry) - {"device", "count", "gpus", "intra_bandwidth_GBps", "inter_bandwidth_GBps",
                                    "intra_latency_us", "inter_latency_us", "nics", "nic_bandwidth_GBps"}
            if unknown:
                raise SpecError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
            if "device" not in entry or not isinstance(entry["device"], str):
                raise SpecError(f"{where}.device: missing or not a string")
            device = _device(entry["device"], f"{where}.device", custom)
            count = whole(entry.get("count", 1), f"{where}.count", 1, MAX_WORLD_SIZE)
            gpus = whole(entry.get("gpus", 1), f"{where}.gpus", 1, MAX_WORLD_SIZE)
            total += count * gpus
            _check_world_size(total, f"{where}.count x gpus")
            node = Node(device, gpus, device.intra_link, device.inter_link)
            node = _with_links(node, entry, where)
            nodes.extend([node] * count)
        return cls(tuple(nodes), name=text(data.get("name", ""), f"{source}: name"))

    def to_toml(self) -> str:
        """The cluster as a file `from_toml` reads back to an equal cluster (catalog devices only)."""
        lines = [f"name = {self.name!r}".replace("'", '"')]
        i = 0
        while i < len(self.nodes):
            node, j = self.nodes[i], i
            while j < len(self.nodes) and self.nodes[j] == node:
                j += 1
            device = get_device(node.device.name)
            if device != node.device:
                raise SpecError(f"cluster {self.name}: to_toml writes catalog devices only, not {node.device.name}")
            lines += ["", "[[nodes]]", f'device = "{device.name}"', f"count = {j - i}", f"gpus = {node.gpus}"]
            links = (("intra", node.intra_link, device.intra_link), ("inter", node.inter_link, device.inter_link))
            for key, link, default in links:
                if link.latency != default.latency:
                    lines.append(f"{key}_latency_us = {link.latency * 1e6!r}")
                if link.bandwidth != default.bandwidth:
                    name = "nic" if key == "inter" and node.nics else key
                    lines.append(f"{name}_bandwidth_GBps = {link.bandwidth / GB!r}")
            if node.nics:
                lines.append(f"nics = {node.nics}")
            i = j
        return "\n".join(lines) + "\n"

    @classmethod
    def load(cls, cluster: Cluster | str | Path) -> Cluster:
        """Accept a `Cluster`, a TOML path, a `scheme:argument` spec, or a spec string."""
        return load_spec(cluster, cls, "cluster", cls.from_toml, SPEC_SCHEMES, cls.parse)


# `scheme:argument` cluster specs (other modules register readers here, e.g. "metis").
SPEC_SCHEMES: dict[str, Callable[[str], Cluster]] = {}

_TERM = re.compile(r"^(?:(\d+)\s*[xX]\s*)?(?:(\d+)\s*[xX]\s*)?([A-Za-z][\w.-]*)$")


def _parse_term(term: str, spec: str) -> list[Node]:
    head, *options = term.split(":")
    m = _TERM.match(head.strip())
    if not m:
        raise SpecError(f"cluster spec {shown(spec)}: cannot read {shown(term)}; expected NODESxGPUSxDEVICE, "
                        f"e.g. 2x8xA100-80GB")
    first, second, device_name = m.groups()
    where = f"cluster spec {shown(spec)}" + ("" if term == spec.strip() else f", term {shown(term)}")
    if second is not None:
        n_nodes = whole(first, f"{where} nodes", 1, MAX_WORLD_SIZE)
        gpus = whole(second, f"{where} gpus", 1, MAX_WORLD_SIZE)
    else:
        n_nodes, gpus = 1, whole(first, f"{where} gpus", 1, MAX_WORLD_SIZE) if first is not None else 1
    _check_world_size(n_nodes * gpus, where)
    device = _device(device_name, where)
    values: dict[str, float] = {}
    for opt in options:
        key, sep, value = opt.partition("=")
        key = key.strip()
        if not sep or key not in ("inter", "intra", "nics"):
            raise SpecError(f"cluster spec {shown(spec)}: option {shown(opt)}; expected inter=GBps, intra=GBps or "
                            f"nics=COUNTxGBps")
        field_name = "nics" if key == "nics" else f"{key}_bandwidth_GBps"
        if field_name in values:
            raise SpecError(f"cluster spec {shown(spec)}: {key} is given twice in {shown(term)}")
        if key == "nics":
            count, x, bandwidth = value.strip().partition("x")
            if not x:
                raise SpecError(f"cluster spec {shown(spec)}: option {shown(opt)}; expected nics=COUNTxGBps, e.g. "
                                f"nics=1x1.25 for one 10 Gb/s NIC per node")
            values["nics"] = count
            values["nic_bandwidth_GBps"] = bandwidth
        else:
            values[field_name] = value  # range-checked with the file's figures in _with_links
    node = _with_links(Node(device, gpus, device.intra_link, device.inter_link), values,
                       f"cluster spec {shown(spec)}")
    return [node] * n_nodes


def _with_links(node: Node, entry: dict, where: str) -> Node:
    """Apply bandwidth/latency overrides from a spec or file entry to a node's default links."""
    intra, inter = node.intra_link, node.inter_link
    if "intra_bandwidth_GBps" in entry:
        intra = replace(intra, bandwidth=_figure(entry["intra_bandwidth_GBps"], f"{where}.intra_bandwidth_GBps") * GB)
    if "inter_bandwidth_GBps" in entry:
        inter = replace(inter, bandwidth=_figure(entry["inter_bandwidth_GBps"], f"{where}.inter_bandwidth_GBps") * GB)
    if "intra_latency_us" in entry:
        intra = replace(intra, latency=_figure(entry["intra_latency_us"], f"{where}.intra_latency_us") * 1e-6)
    if "inter_latency_us" in entry:
        inter = replace(inter, latency=_figure(entry["inter_latency_us"], f"{where}.inter_latency_us") * 1e-6)
    nics = node.nics
    if "nics" in entry or "nic_bandwidth_GBps" in entry:
        if "nics" not in entry:
            raise SpecError(f"{where}: nic_bandwidth_GBps needs nics, the count of NICs the node's GPUs share")
        if "inter_bandwidth_GBps" in entry:
            raise SpecError(f"{where}: nics and inter_bandwidth_GBps exclude each other (inter_bandwidth_GBps is a "
                            f"NIC per GPU); give each node NIC's figure as nic_bandwidth_GBps")
        nics = whole(entry["nics"], f"{where}.nics", 1, MAX_WORLD_SIZE)
        if "nic_bandwidth_GBps" in entry:
            inter = replace(inter, bandwidth=_figure(entry["nic_bandwidth_GBps"], f"{where}.nic_bandwidth_GBps") * GB)
    return replace(node, intra_link=intra, inter_link=inter, nics=nics)


def _check_new_device_name(name: str, custom: dict[str, Device], where: str) -> None:
    """A custom device may not take a catalog device's name (or alias) or another custom device's in
    another case: nodes naming it would silently get one of the two."""
    try:
        taken = get_device(name, custom).name
    except SpecError:
        return
    hint = "" if taken in custom else f", with like = \"{taken}\" to start from its figures"
    raise SpecError(f"{where}: {name!r} already names the device {taken} (names are case-insensitive); give "
                    f"yours another name{hint}")


def _custom_device(name: str, spec: dict, where: str) -> Device:
    spec = table(spec, where, {"like", "peak_tflops", "memory_GiB", "hbm_GBps", "intra_bandwidth_GBps",
                               "inter_bandwidth_GBps", "max_efficiency", "price_per_hour"})
    required = ("peak_tflops", "memory_GiB", "hbm_GBps")
    for key in required:
        if key not in spec:
            raise SpecError(f"{where}.{key}: missing")
    base = _device(text(spec.get("like", "A100-80GB"), f"{where}.like"), f"{where}.like")
    intra, inter = base.intra_link, base.inter_link
    if "intra_bandwidth_GBps" in spec:
        intra = Link(f"{name}-intra", _figure(spec["intra_bandwidth_GBps"], f"{where}.intra_bandwidth_GBps") * GB,
                     intra.latency)
    if "inter_bandwidth_GBps" in spec:
        inter = Link(f"{name}-inter", _figure(spec["inter_bandwidth_GBps"], f"{where}.inter_bandwidth_GBps") * GB,
                     inter.latency)
    efficiency = _figure(spec.get("max_efficiency", base.max_efficiency), f"{where}.max_efficiency")
    # no price is 0: unknown, which the planner's cost objective and budget refuse (`Device.price_per_hour`)
    price = _figure(spec["price_per_hour"], f"{where}.price_per_hour") if "price_per_hour" in spec else 0.0
    return Device(name, _figure(spec["peak_tflops"], f"{where}.peak_tflops") * 1e12,
                  int(_figure(spec["memory_GiB"], f"{where}.memory_GiB") * GiB),
                  _figure(spec["hbm_GBps"], f"{where}.hbm_GBps") * GB, intra, inter, efficiency,
                  price_per_hour=price)


@lru_cache(maxsize=4096)  # a few kinds of link meet again and again: a planner's crossing asks once a message
def _bottleneck(links: tuple[Link, ...]) -> Link:
    slowest = min(links, key=lambda link: link.achieved_bandwidth)
    latency = max(link.latency for link in links)
    return slowest if slowest.latency == latency else replace(slowest, latency=latency)


def _describe(nodes: tuple[Node, ...]) -> str:
    parts: list[str] = []
    i = 0
    while i < len(nodes):
        j = i
        while j < len(nodes) and nodes[j] == nodes[i]:
            j += 1
        parts.append(f"{j - i}x{nodes[i].gpus}x{nodes[i].device.name}")
        i = j
    return "+".join(parts)


def _device(name: str, where: str, custom: dict[str, Device] | None = None) -> Device:
    try:
        return get_device(name, custom)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None


def _check_world_size(gpus: int, where: str) -> None:
    """Before anything is built per GPU: a cluster larger than `MAX_WORLD_SIZE` is a typo, not a plan."""
    if gpus > MAX_WORLD_SIZE:
        raise SpecError(f"{where}: {gpus} GPUs in all; a cluster may have at most {MAX_WORLD_SIZE}")


def _figure(value: object, where: str) -> float:
    """A cluster figure, within the accepted range of its kind (the field name's suffix)."""
    low, high = FIGURE_RANGES[next(kind for kind in FIGURE_RANGES if where.endswith(kind))]
    return number(value, where, low, high)
