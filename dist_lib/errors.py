"""Every error a user can cause, one class each, all under `SimulationError`.

Messages name the rank, op, layer, file or field involved, so the first line alone says what to fix.
"""

from __future__ import annotations


class SimulationError(Exception):
    """Base class: anything that stops a simulated step."""


class SpecError(SimulationError, ValueError):
    """A cluster, workload, profile or suite description is malformed (names the file and field)."""


class TensorError(SimulationError):
    """A compute or communication op was given the wrong tensor (names rank, op and layer)."""


class CollectiveMismatchError(SimulationError):
    """Members of one group issued different ops or incompatible tensors at the same position."""


class DeadlockError(SimulationError):
    """Every unfinished rank waits on something that no rank will provide."""


class OutOfMemoryError(SimulationError):
    """A rank's live tensors exceeded its device's memory."""


class ResourceError(SimulationError):
    """The machine running the simulation ran out of real memory (names the rank it was simulating)."""


class StrategyError(SimulationError):
    """The strategy itself raised on some rank; the original exception is chained."""


class IncorrectStepError(SimulationError):
    """The step finished but the final weights are not a correct training step."""
