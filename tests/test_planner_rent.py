"""Which mix of the cluster to rent: a search by cost (or within a budget) weighs the first half, quarter,
... of each device type's nodes too, so its cost-vs-time front is a real trade-off; a search by time uses
every GPU of each type it uses."""

from __future__ import annotations

from dist_lib import Cluster, plan
from dist_lib.planner.report import front
from dist_lib.planner.space import orders, rentable

MIXED = "2x8xA100-80GB+2x8xV100-32GB"


def test_a_type_can_be_rented_whole_or_halved_down_to_one_node():
    assert rentable(8) == [8, 4, 2, 1]
    assert rentable(3) == [3, 1]
    assert rentable(1) == [1]


def test_renting_adds_the_subsets_of_each_type_in_every_order():
    cluster = Cluster.parse(MIXED)
    whole = orders(cluster)
    rented = orders(cluster, rent=True)
    # alone: A100 {2, 1} nodes and V100 {2, 1}; in both orders of both types, 2 x 2 choices each
    assert len(whole) == 2 + 2 and len(rented) == 2 + 2 + 2 * 4
    assert {len(o.ranks) for o in rented} == {8, 16, 24, 32}
    assert all(len(o.ranks) in (16, 32) for o in whole)


def test_a_search_by_cost_finds_plans_on_part_of_the_cluster_and_a_front_of_trade_offs():
    search = plan(MIXED, "gpt-1.3b", 64, objective="cost", top=2)
    used = {len(c.plan.ranks) for c in search.candidates}
    assert used - {16, 32}  # some candidate rents part of a type
    points = front(search)
    assert len({len(c.plan.ranks) for c in points}) >= 2
    # along the front, faster costs more per step
    assert all(a.seconds < b.seconds and a.dollars_per_step > b.dollars_per_step for a, b in zip(points, points[1:]))


def test_a_search_by_time_uses_every_gpu_of_each_type_it_uses():
    search = plan(MIXED, "gpt-1.3b", 64, top=0)
    assert {len(c.plan.ranks) for c in search.candidates} <= {16, 32}
