"""The plan table: user text (device names from a cluster file) prints as it is, and names stay apart."""

from __future__ import annotations

import io

from rich.console import Console

from dist_lib import Cluster
from dist_lib.planner import Plan, Stage, plan
from dist_lib.planner.report import layout, short_names, table
from dist_lib.planner.search import Candidate

MARKUP_CLUSTER = """
[devices."[red]GPU"]
peak_tflops = 100
memory_GiB = 24
hbm_GBps = 800
intra_bandwidth_GBps = 25
inter_bandwidth_GBps = 12.5

[devices."Z[/x]"]
peak_tflops = 60
memory_GiB = 16
hbm_GBps = 300
intra_bandwidth_GBps = 12
inter_bandwidth_GBps = 6

[[nodes]]
device = "[red]GPU"
gpus = 2

[[nodes]]
device = "Z[/x]"
gpus = 2
"""


def rendered(search, cluster) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(table(search, cluster))
    return out.getvalue()


def test_device_names_that_look_like_markup_print_as_they_are(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text(MARKUP_CLUSTER)
    cluster = Cluster.load(path)
    search = plan(cluster, "toy:layers=4", 4, top=2)
    text = rendered(search, cluster)  # before: MarkupError on the closing tag '[/x]'
    used = {cluster.device_of(r).name for stage in search.best.plan.stages for r in stage.ranks}
    for name in used:
        assert name in text
    assert "[red]GPU" in used or "Z[/x]" in used


def test_short_device_names_stay_apart_on_the_cluster():
    assert short_names(Cluster.load("1x2xA100-80GB+1x2xT4")) == {"A100-80GB": "A100", "T4": "T4"}
    assert short_names(Cluster.load("1x2xA100-80GB+1x2xA100-40GB+1x1xV100-16GB")) == {
        "A100-80GB": "A100-80GB", "A100-40GB": "A100-40GB", "V100-16GB": "V100"}


def test_a_device_whose_name_starts_with_a_dash_keeps_its_whole_name(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text(MARKUP_CLUSTER.replace("[red]GPU", "-GPU"))
    assert short_names(Cluster.load(path)) == {"-GPU": "-GPU", "Z[/x]": "Z[/x]"}


def test_a_stage_of_two_device_types_names_them_in_its_rank_order():
    # before: both plans read "4x1 A100 | 1x1 T4", two rows alike in the table
    cluster = Cluster.load("1x2xA100-80GB+1x2xA100-40GB+1x1xT4")
    shown = []
    for ranks in ((0, 1, 2, 3), (2, 3, 0, 1)):
        p = Plan((Stage(ranks, 1, ((0, 3),), (2, 2, 2, 2)), Stage((4,), 1, ((3, 4),), (8,))), 8, 1)
        shown.append(layout(Candidate(p, 0.1, 0.5, 1.0), cluster))
    assert shown == ["4x1 A100-80GB+A100-40GB | 1x1 T4", "4x1 A100-40GB+A100-80GB | 1x1 T4"]
