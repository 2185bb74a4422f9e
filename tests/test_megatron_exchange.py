"""Megatron-LM's pipeline exchange (`strategies/_megatron_exchange.py`): a step's sends and receives issued
together and waited for, sends included, before the pass they are waited for, on a slow link where a crossing
is long against the passes."""

from __future__ import annotations

import pytest

from dist_lib import Workload, simulate
from dist_lib.errors import StrategyError
from strategies import interleaved, one_f_one_b
from dist_lib.schedules.actions import Action, check_schedule

SLOW = "2x1xA100-80GB:nics=1x0.3"  # two nodes, one GPU each, a 0.3 GB/s NIC (IB latency 14 us)
SLOW3 = "3x1xA100-80GB:nics=1x0.3"
TOY = Workload("toy", 4, 256, 4, 128, 1000)  # 4 layers, h 256, seq 128
TOY6 = Workload("toy6", 6, 256, 4, 128, 1000)
# one activation of a microbatch of 2 (b * s * h * 2 bytes = 131072 bytes) crossing alone: 14 us + 436.9 us
CROSSING = 14e-6 + 2 * 128 * 256 * 2 / 0.3e9


def _rank0_forward_starts(strategy: str, **options) -> tuple[list[float], float]:
    """(start of each of rank 0's forward passes (one per chunk run), end of its first), seconds: 1F1B on
    2 stages of 2 layers, batch 8; interleaved on 3 stages of 2 chunks of one layer, batch 12."""
    if strategy == "one_f_one_b.py":
        result = simulate(f"strategies/{strategy}", SLOW, TOY, 8, microbatch_size=2, pp=2, **options)
    else:
        result = simulate(f"strategies/{strategy}", SLOW3, TOY6, 12, microbatch_size=2, pp=3, chunks=2, **options)
    assert result.correct, result.problems
    layers = [e for e in sorted(result.events, key=lambda e: e.start) if e.rank == 0 and e.op == "forward"]
    per_pass = 2 if strategy == "one_f_one_b.py" else 1  # layers a pass runs on rank 0
    passes = [layers[i:i + per_pass] for i in range(0, len(layers), per_pass)]
    return [p[0].start for p in passes], passes[0][-1].end


def test_1f1b_waits_for_its_warmup_send_before_the_next_forward():
    # 2 stages, 4 microbatches of 2: stage 0 warms up with one forward, then F1 B0 F2 B1 ... Megatron-LM's
    # `send_forward` after F0 waits for the activation to cross (stage 1 posted its receive at 0, so the
    # crossing runs from F0's end for CROSSING), and only then does F1 start: end of F0 + CROSSING. Sending
    # without blocking, F1 starts as F0 ends.
    starts, first_end = _rank0_forward_starts("one_f_one_b.py", megatron_exchange="blocking")
    assert starts[1] == pytest.approx(first_end + CROSSING, rel=1e-9)
    starts, first_end = _rank0_forward_starts("one_f_one_b.py")
    assert starts[1] == pytest.approx(first_end, rel=1e-9)


@pytest.mark.parametrize("mode", ["blocking", "overlap"])
def test_interleaved_warmup_forwards_wait_for_the_previous_send(mode):
    # 3 stages x 2 chunks of one layer, 6 microbatches: stage 0 warms up with (3 - 0 - 1) * 2 + 1 * 3 = 7
    # forwards (chunk 0 of microbatches 0, 1, 2, then chunk 1 of 0, 1, 2, then chunk 0 of 3); stage 1 posts
    # the receive of its first input at 0 (`recv_forward`). After its first forward stage 0 sends the
    # activation and receives nothing (the next forward is of chunk 0, which takes no input); blocking, or
    # overlapped with its handles waited for before the next forward, the second forward starts once the
    # activation has crossed: end of the first + CROSSING.
    starts, first_end = _rank0_forward_starts("interleaved.py", megatron_exchange=mode)
    assert starts[1] == pytest.approx(first_end + CROSSING, rel=1e-9)
    starts, first_end = _rank0_forward_starts("interleaved.py")
    assert starts[1] == pytest.approx(first_end, rel=1e-9)


def test_the_passes_run_in_the_schedules_order_and_every_message_is_exchanged():
    for p, v, m in ((3, 2, 3), (3, 2, 6), (4, 2, 8), (4, 3, 12), (8, 2, 24)):
        for s in range(p):
            for overlap in (False, True):
                actions = interleaved.megatron_schedule(s, p, m, v, overlap)
                check_schedule(actions, v, m)
                if m != p:  # with m = p, Megatron-LM runs every forward first
                    assert [a for a in actions if a.kind in "FB"] == interleaved.schedule(s, p, m, v)
                # every forward on a virtual stage after the first receives, every other one sends
                receives = sum(a.kind == "XRA" for a in actions)
                assert receives == m * v - (m if s == 0 else 0)
                assert sum(a.kind == "XSA" for a in actions) == m * v - (m if s == p - 1 else 0)
    for p, m in ((2, 4), (4, 3), (3, 8)):
        for s in range(p):
            actions = one_f_one_b.megatron_schedule(s, p, m)
            check_schedule(actions, 1, m)
            assert [a for a in actions if a.kind in "FB"] == one_f_one_b.schedule(s, p, m)


def test_a_pass_taking_an_issued_receive_before_its_wait_is_refused():
    with pytest.raises(ValueError, match="F0 takes an issued receive not yet waited for"):
        check_schedule([Action("XRA", 0, 0), Action("F", 0, 0), Action("XWA", 0, 0), Action("B", 0, 0)], 1, 1)
    check_schedule([Action("XRA", 0, 0), Action("XWA", 0, 0), Action("F", 0, 0), Action("B", 0, 0)], 1, 1)


def test_unknown_exchange_modes_are_refused():
    with pytest.raises(StrategyError, match="megatron_exchange must be None, 'blocking' or 'overlap'"):
        simulate("strategies/interleaved.py", SLOW, TOY, 8, microbatch_size=2, pp=2, megatron_exchange="fast")
    with pytest.raises(StrategyError, match="Megatron-LM's exchange with chunks=2 needs pp > 2, got pp=2"):
        simulate("strategies/interleaved.py", SLOW, TOY, 8, microbatch_size=2, pp=2, megatron_exchange="blocking")
    with pytest.raises(StrategyError, match="overlaps pipeline messages only in its interleaved schedule"):
        simulate("strategies/one_f_one_b.py", SLOW, TOY, 8, microbatch_size=2, pp=2, megatron_exchange="overlap")
