"""Running untrusted strategy files: one fresh, resource-limited subprocess per run."""

from .isolation import Limits, Outcome, run_isolated

__all__ = ["Limits", "Outcome", "run_isolated"]
