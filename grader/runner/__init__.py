"""Running untrusted strategy files: one fresh, confined, resource-limited process per run."""

from .isolation import Limits, Outcome, run_isolated
from .sandbox import problem as sandbox_problem

__all__ = ["Limits", "Outcome", "run_isolated", "sandbox_problem"]
