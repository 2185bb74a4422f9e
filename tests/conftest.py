"""Shared fixtures: small scenarios whose costs are easy to derive by hand."""

from __future__ import annotations

import pytest

from dist_lib import Cluster, Workload
from dist_lib.hardware.devices import DEVICES


@pytest.fixture
def a100():
    return DEVICES["A100-80GB"]


@pytest.fixture
def toy() -> Workload:
    """h=1024, s=1024, 16 heads, no vocabulary: every layer alike."""
    return Workload.parse("toy:layers=2")


@pytest.fixture
def two_a100() -> Cluster:
    return Cluster.parse("2xA100-80GB")
