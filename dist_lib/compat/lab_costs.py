"""The course lab's own cost model (its `RuntimePredictor`), so lab files get the course's numbers.

The lab prices every op of a "layer" as one HIDDEN x HIDDEN matrix multiply on the samples' tokens,
with the analytic roofline of calculon (calculon-ai/calculon: `Processor`, `Memory` and `Network`):
an op takes max(FLOPs / (peak x efficiency(FLOPs)), bytes / (bandwidth x efficiency(bytes))), the
efficiencies read off step curves; a collective takes latency + bytes x (1 + offset/p) / (bandwidth x
efficiency) on the smallest network that spans the world. The figures are those of calculon's
`systems/h100_80g_nvl8.json`, the system the lab loads: they describe the lab's model of an H100,
not this simulator's device catalog, which 'real' timing uses instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HIDDEN_SIZE = 4096
BLOCK_SIZE = 1024
DATATYPE = "float16"
BYTES_PER_ELEMENT = 2


def _step(curve: tuple[tuple[float, float], ...], amount: float, what: str) -> float:
    """The efficiency of the first step of `curve` (descending thresholds) that `amount` reaches."""
    for threshold, efficiency in curve:
        if amount >= threshold:
            return efficiency
    raise AssertionError(f"{what} {amount} is below every step of the efficiency curve")


@dataclass(frozen=True)
class _Engine:
    """A matrix engine: peak FLOP/s per datatype and efficiency by op size (FLOPs)."""

    peak: dict[str, float]
    curve: tuple[tuple[float, float], ...]

    def throughput(self, datatype: str, op_flops: float) -> float:
        assert datatype in self.peak, f"Unsupported type: {datatype}"
        return self.peak[datatype] * _step(self.curve, op_flops, "op FLOPs")


@dataclass(frozen=True)
class _MemoryLevel:
    """A memory: bandwidth (B/s) and efficiency by transfer size (bytes)."""

    bandwidth: float
    curve: tuple[tuple[float, float], ...]

    def throughput(self, op_bytes: float) -> float:
        return self.bandwidth * _step(self.curve, op_bytes, "op bytes")


@dataclass(frozen=True)
class _Network:
    """A network of up to `size` GPUs: bandwidth (B/s), efficiency, latency (s), and per collective
    the offset that adds `offset/p` of the message (1 for an all-reduce within a node)."""

    size: int
    bandwidth: float
    efficiency: float
    latency: float
    offsets: dict[str, float]

    def time(self, op: str, op_bytes: float, members: int) -> float:
        assert members == 2 if op == "p2p" else members >= 2, f"{op} needs {'2' if op == 'p2p' else '>= 2'} " \
                                                             f"members, got {members}"
        assert op_bytes >= 0
        total = op_bytes + (1 / members * op_bytes) * self.offsets[op]  # the same float steps as calculon
        return self.latency + total / (self.bandwidth * self.efficiency)


GB, TFLOPS, MB, GFLOPS = 1e9, 1e12, 1e6, 1e9
# calculon systems/h100_80g_nvl8.json: matrix float16 1000 TFLOP/s; HBM 3072 GB/s; host link 450 GB/s;
# an 8-GPU NVLink domain (450 GB/s, 65 % efficiency, 10 us) and a 50 GB/s network beyond (90 %, 20 us).
SYSTEMS: dict[str, dict[str, Any]] = {
    "h100_80g_nvl8.json": {
        "matrix": _Engine({"float8": 2000 * TFLOPS, "float16": 1000 * TFLOPS},
                          ((128 * GFLOPS, 0.95), (16 * GFLOPS, 0.9), (1 * GFLOPS, 0.6), (0, 0.1))),
        "hbm": _MemoryLevel(3072 * GB, ((100 * MB, 0.90), (10 * MB, 0.75), (1 * MB, 0.6), (0, 0.3))),
        "host": _MemoryLevel(450 * GB, ((100 * MB, 0.95), (10 * MB, 0.9), (1 * MB, 0.7), (0, 0.3))),
        "networks": (
            _Network(8, 450 * GB, 0.65, 1e-5, {"p2p": 0, "reduce_scatter": 0, "all_gather": 0, "all_reduce": 1}),
            _Network(65536, 50 * GB, 0.9, 2e-5, {"p2p": 0, "reduce_scatter": 0, "all_gather": 0, "all_reduce": 0}),
        ),
    },
}

# The lab's FLOP/s per GPU in its theoretical best time (utils.get_model_theoretical_best_time).
LAB_PEAK_FLOPS = 1e15


class RuntimePredictor:
    """Durations (seconds) of the lab's ops, as the lab's `RuntimePredictor` computes them."""

    def __init__(self, world_size: int, config_file_name: str = "h100_80g_nvl8.json") -> None:
        if config_file_name not in SYSTEMS:
            raise ValueError(f"RuntimePredictor: unknown system {config_file_name!r}; known: {sorted(SYSTEMS)}")
        self.world_size = world_size
        self._memo: dict[tuple, float] = {}  # the durations are pure functions of their arguments
        system = SYSTEMS[config_file_name]
        self.processor = system["matrix"]
        self.mem_hbm = system["hbm"]
        self.mem_pcie = system["host"]
        # the smallest network that spans the world (none past the largest: the lab fails there too)
        fitting = [n for n in sorted(system["networks"], key=lambda n: n.size) if n.size >= world_size]
        if fitting:
            self.network = fitting[0]

    def compute_flops_time(self, flops: int) -> float:
        return flops / self.processor.throughput(DATATYPE, flops)

    def compute_mem_time(self, bytes_read_write: int) -> float:
        return bytes_read_write / self.mem_hbm.throughput(bytes_read_write)

    def get_processing_time(self, flops: int, bytes_read_write: int) -> float:
        """Roofline: the op is bound by arithmetic or by HBM traffic, whichever is slower."""
        return max(self.compute_flops_time(flops), self.compute_mem_time(bytes_read_write))

    def get_forward_backward_time(self, batch_size: int) -> float:
        """One [tokens x H] @ [H x H] product: reads the weight and the input, writes the output."""
        hit = self._memo.get(("fb", batch_size))
        if hit is not None:
            return hit
        tokens = batch_size * BLOCK_SIZE
        flops = 2 * HIDDEN_SIZE * HIDDEN_SIZE * tokens
        traffic = (HIDDEN_SIZE * HIDDEN_SIZE + 2 * tokens * HIDDEN_SIZE) * BYTES_PER_ELEMENT
        hit = self._memo[("fb", batch_size)] = self.get_processing_time(flops, traffic)
        return hit

    def get_update_step_time(self, num_shards_on_device: int, num_shards: int) -> float:
        """An element-wise step over this rank's [H x H*on/shards] slice: reads two, writes one."""
        columns = HIDDEN_SIZE * num_shards_on_device // num_shards
        flops = HIDDEN_SIZE * columns
        return self.get_processing_time(flops, 3 * HIDDEN_SIZE * columns * BYTES_PER_ELEMENT)

    def get_comm_bytes(self, v: Any) -> int:
        """Bytes a message carries: a whole H x H matrix for a weight or its gradient (sharded or
        not, as the lab counts it), a shard of one for optimizer state, H x tokens for activations."""
        name = type(v).__name__
        if name in ("Weight", "WeightGrad"):
            elements = HIDDEN_SIZE * HIDDEN_SIZE
        elif name in ("Activation", "ActivationGrad"):
            elements = HIDDEN_SIZE * BLOCK_SIZE * len(v.samples)
        elif name == "OptState":
            elements = HIDDEN_SIZE * HIDDEN_SIZE // v.num_shards
        else:
            raise ValueError(f"Unknown type {type(v)}")
        return elements * BYTES_PER_ELEMENT

    def get_collective_time(self, collective_name: str, v: Any) -> float:
        nbytes = self.get_comm_bytes(v)
        hit = self._memo.get((collective_name, nbytes))
        if hit is None:
            hit = self._memo[(collective_name, nbytes)] = self.network.time(collective_name, nbytes, self.world_size)
        return hit

    def get_send_recv_time(self, v: Any) -> float:
        return self.network.time("p2p", self.get_comm_bytes(v), 2)

    def get_weight_load_time(self, num_shards_on_device: int, num_shards: int) -> float:
        """Copying this rank's share of an H x H weight from host memory."""
        nbytes = HIDDEN_SIZE * HIDDEN_SIZE * num_shards_on_device // num_shards * BYTES_PER_ELEMENT
        return nbytes / self.mem_pcie.throughput(nbytes)


def theoretical_best_time(num_layers: int, global_batch_size: int, world_size: int) -> float:
    """The lab's ideal step: 4 H^2 FLOPs per token per layer (forward and backward of one H x H
    product) at LAB_PEAK_FLOPS on every GPU."""
    flops = 4 * HIDDEN_SIZE * HIDDEN_SIZE * global_batch_size * BLOCK_SIZE * num_layers
    return flops / (LAB_PEAK_FLOPS * world_size)
