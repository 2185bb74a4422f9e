"""Plans and the planner: what to run on which GPUs, found by a closed-form estimate and the simulator."""

from .api import plan
from .plan import Plan, Stage
from .search import Candidate, Search

__all__ = ["Candidate", "Plan", "Search", "Stage", "plan"]
