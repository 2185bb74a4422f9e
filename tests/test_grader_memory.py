"""The memory of a run's processes together: a memory cgroup caps it where the grader may make one (each
process's address-space rlimit alone lets a run hold that much in every process it starts)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grader.runner import Limits, run_isolated, sandbox_problem
from grader.runner.cgroup import PREFIX, RunCgroup, _inside, own_memory_cgroup
from grader.scenario import Scenario

SCENARIO = Scenario(cluster="2xA100-80GB", workload="toy:layers=2", global_batch=2)

HOLDS_ALONE = """
async def train(model, **options):
    if model.rank == 0:
        block = bytearray(400 * 2**20)
        for i in range(0, len(block), 4096):  # (pages count once touched)
            block[i] = 1
"""

HOLDS_IN_FOUR_CHILDREN = """
import os, time


async def train(model, **options):
    if model.rank == 0:
        children = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                block = bytearray(150 * 2**20)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                time.sleep(2)  # (all four hold theirs at once)
                os._exit(0)
            children.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
        raise RuntimeError(f"children: {codes}")
"""


@pytest.fixture
def cgroups():
    group = RunCgroup.make(2**30)
    if group is None:
        pytest.skip("the grader may not make a memory cgroup here")
    group.remove()


def run(tmp_path: Path, source: str, memory_bytes: int):
    (tmp_path / "strategy.py").write_text(source)
    return run_isolated(tmp_path / "strategy.py", SCENARIO, Limits(timeout_s=60, memory_bytes=memory_bytes),
                        confine=sandbox_problem() is None)


def test_a_run_over_its_memory_is_one_crashed_row_saying_so(tmp_path, cgroups):
    outcome = run(tmp_path, HOLDS_ALONE, 256 * 2**20)  # under its 4 GiB address space, over the 256 MiB
    assert outcome.status == "crashed"
    assert outcome.message == ("the worker process died: the run's processes together went over the 0.25 GiB of "
                               "real memory a run may hold, and the kernel stopped it")
    assert run(tmp_path, HOLDS_ALONE, 2**30).status == "ok"


def test_processes_a_run_starts_share_its_memory(tmp_path, cgroups):
    """Four children of 150 MiB each, under 384 MiB together: they never all hold theirs at once (the
    kernel kills some, or the worker)."""
    outcome = run(tmp_path, HOLDS_IN_FOUR_CHILDREN, 384 * 2**20)
    if outcome.status == "crashed":
        assert "went over the 0.375 GiB" in outcome.message
    else:
        assert outcome.status == "failed" and "children: [" in outcome.message, outcome.message
        assert "-9" in outcome.message  # (SIGKILL: the OOM killer)
    assert run(tmp_path, HOLDS_IN_FOUR_CHILDREN, 2**30).message.startswith("rank 0: RuntimeError: children: "
                                                                           "[0, 0, 0, 0]")


def test_a_cgroup_inside_a_mount_of_another_root(tmp_path):
    """In a container the cgroup hierarchy is mounted from the container's own cgroup: /proc/self/cgroup
    names the full path, the mount's root its start."""
    (tmp_path / "run").mkdir()
    assert _inside(str(tmp_path), "/docker/abc", "/docker/abc/run") == tmp_path / "run"
    assert _inside(str(tmp_path), "/docker/abc", "/docker/abc") == tmp_path
    assert _inside(str(tmp_path), "/", "/run") == tmp_path / "run"
    assert _inside(str(tmp_path), "/docker/abc", "/docker/abcd/run") is None  # (not under the root)
    assert _inside(str(tmp_path), "/", "/missing") is None


def test_the_runs_cgroups_are_removed(tmp_path, cgroups):
    """This process's run cgroups (`dist-sandbox-<pid>-<n>`): tests in other processes make and remove their own
    beside them at any time."""
    parent, _ = own_memory_cgroup()
    ours = lambda: {p.name for p in parent.iterdir() if p.name.startswith(f"{PREFIX}{os.getpid()}-")}  # noqa: E731
    before = ours()
    run(tmp_path, HOLDS_ALONE, 2**30)
    assert ours() == before
