"""Jobs on a real local Ray instance: a small leaderboard is the same as one graded locally, a task whose
worker dies is retried and recorded once, a task that dies every time is reported lost."""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import asdict
import sys
from pathlib import Path

import pytest

from grader import leaderboard
from grader.cli import main
from grader.errors import InputError
from grader.jobs import RAY_LOCAL, Backend, JobFailed, import_ray, run_jobs
from grader.leaderboard import collect_submissions, run_leaderboard
from grader.portable import GradeJob, grade_job, save
from grader.runner import sandbox_problem
from grader.suites import load_suite

ROOT = Path(__file__).resolve().parents[1]
SUITE = """
name = "tiny"
[limits]
timeout_s = 30
address_space_GiB = 2
[defaults]
options = { microbatch_size = 1 }
[[scenarios]]
name = "toy2"
cluster = "2xA100-80GB"
workload = "toy:layers=2"
global_batch = 4
[[scenarios]]
name = "toy4"
cluster = "4xA100-80GB"
workload = "toy:layers=4"
global_batch = 8
[[scoring.components]]
metric = "mfu"
scale = 100
"""
CONFINE = sandbox_problem() is None  # confined as in production where bubblewrap runs, else unconfined
SUBMISSIONS = [ROOT / "tests" / "submissions" / "honest.py", ROOT / "tests" / "submissions" / "buggy.py",
               ROOT / "strategies" / "ddp.py"]


@pytest.fixture(scope="module")
def ray_instance():
    """One light local Ray instance for the module: 2 CPUs, no dashboard, the smallest object store."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install '.[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             object_store_memory=80 * 2**20)
    # the job functions below live in this test module, which Ray's workers cannot import: ship them by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    path = tmp_path_factory.mktemp("suite") / "suite.toml"
    path.write_text(SUITE)
    return load_suite(path)


@pytest.fixture(scope="module")
def local_board(tmp_path_factory, suite):
    out = tmp_path_factory.mktemp("local") / "board"
    run_leaderboard(collect_submissions([str(p) for p in SUBMISSIONS]), suite, out, jobs=1, confine=CONFINE)
    return out


def _without_wall_times(out: Path, where: Path) -> str:
    """leaderboard.json with wall times dropped and the output folder written as OUT."""
    data = json.loads((out / "leaderboard.json").read_text())
    for row in data["rows"]:
        row.pop("wall_s")
    return json.dumps(data, indent=1).replace(str(where), "OUT")


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
            and p.suffix in (".json", ".png") and p.name != "leaderboard.json"}


def _result_keys(out: Path) -> list[str]:
    return [json.loads(line)["key"] for line in (out / "results.jsonl").read_text().splitlines()]


def test_board_on_ray_is_the_local_board_byte_for_byte(ray_instance, suite, local_board, tmp_path):
    out = tmp_path / "board"
    # through the command line: `--ray` with no address joins the instance this process holds
    assert main(["leaderboard", *map(str, SUBMISSIONS), "--suite", suite.path, "--out", str(out), "--ray",
                 *([] if CONFINE else ["--trusted"])]) == 0
    # same folder name under a different parent: paths in the rows differ only by that parent
    assert _without_wall_times(out, out) == _without_wall_times(local_board, local_board)
    traces = _files(out)
    assert traces == _files(local_board)
    # honest and ddp run on both scenarios (a trace, and two plots where matplotlib, an optional extra, is
    # installed); buggy fails, with no trace
    plots = (".memory.png", ".schedule.png") if importlib.util.find_spec("matplotlib") else ()
    assert sorted(traces) == [f"runs/{s}/{n}{ext}" for s in ("ddp", "honest") for n in ("toy2", "toy4")
                              for ext in (".json", *plots)]
    keys = _result_keys(out)
    assert sorted(keys) == sorted(set(keys)) and len(keys) == 6


def test_a_worker_killed_mid_run_is_retried_and_its_row_recorded_once(ray_instance, suite, local_board, tmp_path,
                                                                      monkeypatch):
    marker = tmp_path / "killed-once"
    real = leaderboard.grade_job

    def dies_on_first_attempt(job):  # defined here, so Ray ships it by value to its worker processes
        if Path(job.submission).stem == "honest" and job.scenario["name"] == "toy4" and not marker.exists():
            marker.write_text(str(os.getpid()))
            os._exit(1)  # the worker process vanishes mid-task, as on a lost node
        return real(job)

    monkeypatch.setattr(leaderboard, "grade_job", dies_on_first_attempt)
    out = tmp_path / "board"
    run_leaderboard(collect_submissions([str(p) for p in SUBMISSIONS]), suite, out, ray=RAY_LOCAL,
                    confine=CONFINE)
    assert marker.exists()  # the first attempt really died
    keys = _result_keys(out)
    assert len(keys) == len(set(keys)) == 6
    assert _without_wall_times(out, out) == _without_wall_times(local_board, local_board)


def _ready(request, backend: Backend) -> None:
    if backend.ray is not None:
        request.getfixturevalue("ray_instance")


def _exit_when_odd(n: int) -> int:
    if n % 2:
        os._exit(3)
    return n * n


@pytest.mark.parametrize("backend", [Backend(ray=RAY_LOCAL, max_retries=1), Backend(workers=2, max_retries=1)],
                         ids=["ray", "pool"])
def test_a_job_whose_worker_dies_every_time_fails_alone(request, backend):
    _ready(request, backend)
    results = dict(run_jobs(_exit_when_odd, [2, 3, 4], backend))
    assert results[0] == 4 and results[2] == 16
    assert isinstance(results[1], JobFailed) and "each of 2 attempts" in results[1].reason


def _refuse(n: int) -> int:
    if n == 7:
        raise InputError(f"item {n}: refused")
    raise ValueError(f"item {n}: no value")


@pytest.mark.parametrize("backend", [Backend(ray=RAY_LOCAL), Backend(workers=2), Backend()], ids=["ray", "pool", "here"])
def test_a_job_that_raises_fails_alone_but_an_input_error_stops_the_run(request, backend):
    _ready(request, backend)
    assert list(run_jobs(_refuse, [3], backend)) == [(0, JobFailed("ValueError: item 3: no value"))]
    with pytest.raises(InputError) as caught:
        list(run_jobs(_refuse, [7], backend))
    assert str(caught.value) == "item 7: refused"


def test_jobs_finish_in_any_order_and_each_result_comes_once():
    # local pool: same contract as Ray; thousands of jobs, more than a pipe's buffer of start reports
    items = [-i for i in range(5000)]
    results = list(run_jobs(abs, items, Backend(workers=2)))
    assert sorted(results) == [(i, i) for i in range(5000)]


def test_ray_missing_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(InputError, match=r"pip install 'dist-sandbox\[ray\]'"):
        import_ray()


def test_a_job_for_a_submission_this_node_lacks_runs_the_shipped_source(suite, tmp_path):
    """As on a Ray node without the driver's files: the row names the driver's paths, the trace comes back."""
    # a submission that imports its helper, as a class's shared code might
    source = (b"import importlib.util, pathlib\n"
              b"spec = importlib.util.spec_from_file_location('_shared', pathlib.Path(__file__).with_name('_shared.py'))\n"
              b"shared = importlib.util.module_from_spec(spec)\n"
              b"spec.loader.exec_module(shared)\n"
              b"train = shared.train\n")
    helper = ("_shared.py", SUBMISSIONS[0].read_bytes())
    driver_path = tmp_path / "driver-only" / "honest.py"  # never created
    trace = tmp_path / "board" / "honest" / "toy2.json"
    graded = grade_job(GradeJob(str(driver_path), source, (helper,), suite.scenarios[0].to_dict(),
                                asdict(suite.limits), str(trace), plots=False, confine=CONFINE))
    assert graded.row["status"] == "ok" and graded.row["submission"] == str(driver_path)
    assert graded.row["trace"] == str(trace) and list(graded.files) == [str(trace)]
    assert not trace.exists()
    save(graded)
    assert json.loads(trace.read_text())["traceEvents"]


MIXED = "2xA100-80GB+2xV100-32GB"


def _search(**runner):
    # a batch of 16: at 8 the estimate of the best plan (ZB-H1) is its simulated step, and the search
    # simulates that one plan alone, one batch
    from dist_lib.planner import plan
    search = plan(MIXED, "toy:layers=4", 16, top=6, **runner)
    return [(c.plan, c.simulated, c.peak_fraction, c.mfu, c.error) for c in search.simulated], search


@pytest.mark.parametrize("backend", [Backend(ray=RAY_LOCAL), Backend(workers=2)], ids=["ray", "pool"])
def test_a_plan_search_through_jobs_simulates_what_it_does_here(request, backend, tmp_path):
    from grader.plan import _runner
    _ready(request, backend)
    here, search_here = _search()
    there, search_there = _search(runner=_runner(backend), width=1)  # one batch a plan
    # the search stops early once no later estimate can win, so it simulates up to 6 plans: several batches
    assert there == here and 1 < len(here) <= 6 and all(simulated for _, simulated, *_ in here)
    assert search_there.best.plan == search_here.best.plan
    # the command line writes the same best plan
    for name, flags in (("here.json", []), ("there.json", ["--ray"] if backend.ray else ["--jobs", "2"])):
        assert main(["plan", "--cluster", MIXED, "--workload", "toy:layers=4", "--batch", "16", "--top", "6",
                     "--out", str(tmp_path / name), "--plot", str(tmp_path / "pareto.png"), *flags]) == 0
    assert (tmp_path / "there.json").read_bytes() == (tmp_path / "here.json").read_bytes()


def test_simulating_several_at_a_time_keeps_the_candidates_one_at_a_time_keeps():
    """The search stops simulating once the next estimate cannot win; in batches of 4 it takes the
    batch's results in order under the same rule, so it keeps the same candidates."""
    one, _ = _search_top(30, width=1)
    four, _ = _search_top(30, width=4)
    assert four == one and 0 < len(one) < 30  # the rule stopped it before the 30th


def _search_top(top: int, **options):
    from dist_lib.planner import plan
    search = plan(MIXED, "toy:layers=4", 8, top=top, **options)
    return [(c.plan, c.simulated) for c in search.simulated], search


def test_a_node_without_the_sandbox_stops_the_board_naming_itself(suite, monkeypatch, tmp_path):
    import socket

    import grader.runner
    monkeypatch.setattr(grader.runner, "sandbox_problem", lambda: "bubblewrap (bwrap) is not installed")
    job = GradeJob(str(SUBMISSIONS[0]), SUBMISSIONS[0].read_bytes(), (), suite.scenarios[0].to_dict(),
                   asdict(suite.limits), str(tmp_path / "t.json"))
    with pytest.raises(InputError, match=f"^node {socket.gethostname()}: cannot confine untrusted submissions: "
                                         f"bubblewrap \\(bwrap\\) is not installed; .* --trusted"):
        grade_job(job)


def test_ray_option_without_ray_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main(["leaderboard", str(SUBMISSIONS[0]), "--ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --ray needs Ray on this machine and every node: pip install 'dist-sandbox[ray]'"


def test_a_ray_address_where_nothing_answers_is_one_line_at_once(capsys, tmp_path):
    import socket
    with socket.socket() as probe:  # a loopback port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert main(["leaderboard", str(SUBMISSIONS[0]), "--out", str(tmp_path / "board"), "--ray",
                 f"127.0.0.1:{port}"]) == 2
    assert not (tmp_path / "board").exists()  # refused before anything was written
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --ray 127.0.0.1:{port}: nothing answers there (ConnectionRefusedError")
    assert err.endswith("start the cluster with `ray start --head` and give the address it prints")



def _sleep_then_mark(item: tuple[str, float]) -> int:
    """A job that records its worker's pid, sleeps, then leaves a mark that it finished."""
    import time
    folder, seconds = item
    Path(folder).mkdir(exist_ok=True)
    Path(folder, "pid").write_text(str(os.getpid()))
    time.sleep(seconds)
    Path(folder, "finished").write_text("")
    return 0


def test_closing_the_results_early_ends_the_running_jobs_rather_than_waiting(tmp_path):
    """Ctrl-C in `leaderboard --jobs 2` closes the results while a job runs: its worker is killed, not
    awaited (waiting for every job handed to the pool, the command did not end)."""
    import time
    slow = tmp_path / "slow"
    results = run_jobs(_sleep_then_mark, [(str(tmp_path / "fast"), 0.0), (str(slow), 20.0)], Backend(workers=2))
    assert next(results) == (0, 0)  # the fast job is done; the slow one is running or about to
    while not (slow / "pid").exists():
        time.sleep(0.05)
    results.close()
    pid = int((slow / "pid").read_text())
    for _ in range(200):  # the kill is sent; the process is gone within moments
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the slow job's worker {pid} still runs after the results were closed")
    assert not (slow / "finished").exists()
