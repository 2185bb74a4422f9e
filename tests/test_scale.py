"""Scale tests (`python3 dev.py test -m slow`): a 1024-rank, 96-layer step runs through and stays exact."""

from __future__ import annotations

import pytest

from dist_lib import simulate


@pytest.mark.slow
def test_a_1024_rank_96_layer_ddp_step():
    """Every rank run (unfolded: a folded step keeps its representative's events only)."""
    result = simulate("strategies/ddp.py", "128x8xA100-80GB", "toy:layers=96", 1024, microbatch_size=1, fold=False)
    assert result.correct
    # per rank: 96 forwards, one loss, 96 backwards, 96 all-reduces and 96 updates
    assert len(result.raw_events) == 1024 * (96 + 1 + 96 + 96 + 96)
    busy = result.compute_busy()
    assert max(busy) == pytest.approx(min(busy))  # identical ranks do identical work
    collective = {e.start for e in result.events if e.op == "all_reduce" and e.layer == 0}
    assert len(collective) == 1  # the 1024 members of one all-reduce start together


def test_a_large_step_result_prints_as_one_short_line():
    """Printing a result (or a task that holds one) does not format its per-rank lists."""
    result = simulate("strategies/ddp.py", "64x8xA100-80GB", "toy:layers=2", 512, microbatch_size=1)
    text = repr(result)
    assert text.startswith("Result(ddp on 64x8xA100-80GB, toy:layers=2: ") and text.endswith(", correct)")
    assert f"{result.time_s * 1e3:.2f} ms" in text and "\n" not in text and len(text) < 200
