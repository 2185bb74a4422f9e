"""dist_lib: an asyncio sandbox for distributed-training strategies on heterogeneous GPU clusters."""

from .comm import Group, Work
from .devices import DEVICES, Device, Link, get_device
from .errors import (CollectiveMismatchError, DeadlockError, IncorrectStepError, OutOfMemoryError,
                     SimulationError, SpecError, StrategyError, TensorError)
from .hardware import Cluster, Node
from .model import Model
from .result import Event, Result
from .simulator import simulate, simulate_async
from .planner import plan
from .tensors import Activation, ActivationGrad, OptState, Weight, WeightGrad
from .trace import validate_trace
from .workload import PRESETS, Workload

__all__ = [
    "Activation", "ActivationGrad", "Cluster", "CollectiveMismatchError", "DEVICES", "DeadlockError", "Device",
    "Event", "Group", "IncorrectStepError", "Link", "Model", "Node", "OptState", "OutOfMemoryError", "PRESETS",
    "Result", "SimulationError", "SpecError", "StrategyError", "TensorError", "Weight", "WeightGrad", "Work",
    "Workload", "get_device", "plan", "simulate", "simulate_async", "validate_trace",
]

from . import metis as _metis, profiles as _profiles  # noqa: E402,F401  register the metis: and profiles: specs
