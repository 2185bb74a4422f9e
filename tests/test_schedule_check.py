"""The schedule check's whole-list path accepts exactly the F/B lists its step-by-step path accepts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_lib.schedules import actions as schedule_actions
from dist_lib.schedules.actions import Action, check_schedule
from dist_lib.schedules.one_f_one_b import schedule as one_f_one_b


def step_by_step_accepts(actions: list[Action], chunks: int, microbatches: int) -> bool:
    """The step-by-step check alone (the whole-list path switched off)."""
    fast = schedule_actions._plain_schedule_passes
    schedule_actions._plain_schedule_passes = lambda *_: False
    try:
        check_schedule(actions, chunks, microbatches)
        return True
    except ValueError:
        return False
    finally:
        schedule_actions._plain_schedule_passes = fast


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 2), st.integers(1, 4), st.data())
def test_both_paths_agree_on_random_forward_backward_lists(chunks, microbatches, data):
    passes = [(c, m) for c in range(chunks) for m in range(microbatches)]
    valid = data.draw(st.permutations([("F", *p) for p in passes] + [("B", *p) for p in passes]))
    # a valid order puts each pass's F before its B; mutate it: swap, drop, duplicate, rename, or none
    actions = [Action(*a) for a in valid]
    mutation = data.draw(st.sampled_from(["none", "swap", "drop", "duplicate", "rename", "out of range"]))
    if mutation == "swap" and len(actions) > 1:
        i, j = data.draw(st.integers(0, len(actions) - 1)), data.draw(st.integers(0, len(actions) - 1))
        actions[i], actions[j] = actions[j], actions[i]
    elif mutation == "drop":
        del actions[data.draw(st.integers(0, len(actions) - 1))]
    elif mutation == "duplicate":
        actions.insert(0, actions[data.draw(st.integers(0, len(actions) - 1))])
    elif mutation == "rename":
        i = data.draw(st.integers(0, len(actions) - 1))
        actions[i] = actions[i]._replace(kind=data.draw(st.sampled_from(["F", "B", "I", "W"])))
    elif mutation == "out of range":
        i = data.draw(st.integers(0, len(actions) - 1))
        actions[i] = actions[i]._replace(mb=microbatches)
    slow = step_by_step_accepts(actions, chunks, microbatches)
    fast = schedule_actions._plain_schedule_passes(actions, chunks * microbatches)
    assert not fast or slow, actions  # what the whole-list path passes, the step-by-step path passes
    if slow and {a.kind for a in actions} <= {"F", "B"}:
        assert fast, actions  # and it takes every F/B list that passes


def test_a_backward_before_its_forward_is_named_at_the_action():
    with pytest.raises(ValueError, match=r"B1 after nothing for chunk 0 microbatch 1"):
        check_schedule([Action("F", 0, 0), Action("B", 0, 1), Action("F", 0, 1), Action("B", 0, 0)], 1, 2)


def test_1f1b_of_a_long_pipeline_takes_the_whole_list_path():
    for stage in (0, 3, 7):
        actions = one_f_one_b(stage, 8, 4096)
        assert schedule_actions._plain_schedule_passes(actions, 4096)
        assert actions[:8 - stage - 1] == [Action("F", 0, i) for i in range(8 - stage - 1)]  # warm-up forwards


def test_1f1b_orders_by_hand():
    """PipeDream-Flush on 3 stages, 4 microbatches: stage s warms up with 2 - s forwards, then alternates."""
    def order(stage: int) -> str:
        return " ".join(f"{a.kind}{a.mb}" for a in one_f_one_b(stage, 3, 4))

    assert order(0) == "F0 F1 F2 B0 F3 B1 B2 B3"
    assert order(1) == "F0 F1 B0 F2 B1 F3 B2 B3"
    assert order(2) == "F0 B0 F1 B1 F2 B2 F3 B3"
    assert one_f_one_b(0, 8, 2) == [Action("F", 0, 0), Action("F", 0, 1), Action("B", 0, 0), Action("B", 0, 1)]
