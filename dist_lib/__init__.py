"""dist_lib: an asyncio sandbox for distributed-training strategies on heterogeneous GPU clusters."""

from dist_lib.comm.collectives import Work

from dist_lib.comm.groups import Group
from dist_lib.hardware.devices import DEVICES, Device, Link, get_device
from dist_lib.errors import CollectiveMismatchError, DeadlockError, IncorrectStepError, OutOfMemoryError, ResourceError, SimulationError, SpecError, StrategyError, TensorError
from dist_lib.hardware.cluster import Cluster, Node
from dist_lib.hardware.reserve import MemoryReserve
from dist_lib.hardware.replicas import ReplicaGrid
from dist_lib.model.handle import Model
from dist_lib.output.result import Event, Result
from dist_lib.run.simulator import simulate, simulate_async
from dist_lib.planner import plan
from dist_lib.tensors import Activation, ActivationGrad, OptState, Weight, WeightGrad
from dist_lib.output.trace import validate_trace
from dist_lib.workload.transformer import PRESETS, Workload

__all__ = [
    "Activation", "ActivationGrad", "Cluster", "CollectiveMismatchError", "DEVICES", "DeadlockError", "Device",
    "Event", "Group", "IncorrectStepError", "Link", "MemoryReserve", "Model", "Node", "OptState", "OutOfMemoryError",
    "PRESETS", "ReplicaGrid", "ResourceError", "Result", "SimulationError", "SpecError", "StrategyError", "TensorError",
    "Weight",
    "WeightGrad", "Work", "Workload", "get_device", "plan", "simulate", "simulate_async", "validate_trace",
]

from dist_lib.hardware import metis as _metis
import dist_lib.hardware.profiles as _profiles  # noqa: E402,F401  register the metis: and profiles: specs
