"""Plans and the planner: what to run on which GPUs, found by a closed-form estimate and the simulator."""

from dist_lib.planner.api import plan
from dist_lib.planner.plan import Plan, Stage
from dist_lib.planner.search import Candidate, Search

__all__ = ["Candidate", "Plan", "Search", "Stage", "plan"]
