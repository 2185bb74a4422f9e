"""`python -m grader plan`: the table, the plan file that runs unchanged, and one-line refusals."""

from __future__ import annotations

import json
import os
import shlex

import pytest

from dist_lib import SpecError, simulate
from dist_lib.planner import Plan, plan
from grader.cli import main

ARGS = ["--cluster", "1x2xA100-80GB+1x2xT4", "--workload", "toy:layers=4", "--batch", "8", "--top", "3"]


def test_plan_writes_the_best_plan_as_a_file_that_runs(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", *ARGS, "--out", str(out), "--plot", str(tmp_path / "pareto.png")]) == 0
    printed = capsys.readouterr().out
    assert "Pareto front" in printed and "best plan" in printed
    saved = Plan.load(out)
    best = plan("1x2xA100-80GB+1x2xT4", "toy:layers=4", 8, top=3).best
    assert saved == best.plan
    result = simulate("strategies/planned.py", "1x2xA100-80GB+1x2xT4", "toy:layers=4", 8, plan=str(out))
    assert result.correct and result.time_s == best.simulated
    assert json.loads(out.read_text())["stages"]


def test_plan_refuses_what_no_plan_fits_in_one_line(tmp_path, capsys):
    assert main(["plan", "--cluster", "1x2xT4", "--workload", "gpt-175b", "--batch", "8",
                 "--out", str(tmp_path / "p.json"), "--plot", ""]) == 2
    printed = capsys.readouterr()
    err = printed.err.strip()
    assert err.startswith("error: no plan fits in memory") and "\n" not in err
    assert printed.out == ""  # (no progress bar's leftover line when the output is not a terminal)
    assert not (tmp_path / "p.json").exists()


def test_no_plan_on_all_gpus_of_a_type_says_how_to_leave_some_idle(capsys):
    # three T4s, two layers, one sample: no pipeline of 3 stages, no 3 replicas, no TP across nodes
    assert main(["plan", "--cluster", "3x1xT4", "--workload", "toy:layers=2", "--batch", "1", "--plot", ""]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no plan: a global batch of 1 cannot give every data-parallel replica a sample, "
                          "or 2 layers cannot fill the stages") and "plan on a cluster without them" in err


def test_a_budget_below_every_gpu_is_refused(capsys):
    assert main(["plan", *ARGS, "--budget", "0.1", "--plot", ""]) == 2
    assert "budget" in capsys.readouterr().err


def test_an_unwritable_out_or_plot_is_refused_before_the_search(tmp_path, capsys, monkeypatch):
    import grader.plan
    monkeypatch.setattr(grader.plan, "plan", lambda *a, **k: pytest.fail("searched before checking --out"))
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["plan", *ARGS, "--out", str(blocker / "p.json"), "--plot", ""]) == 2
    assert capsys.readouterr().err.strip() == f"error: --out {blocker / 'p.json'}: {blocker} is a file, not a folder"
    assert main(["plan", *ARGS, "--out", str(tmp_path), "--plot", ""]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --out {tmp_path}: is a folder; give a file path such as "
                                               f"{tmp_path / 'plan.json'}")
    assert main(["plan", *ARGS, "--out", str(tmp_path / "p.json"), "--plot", str(blocker / "x.png")]) == 2
    assert capsys.readouterr().err.strip() == f"error: --plot {blocker / 'x.png'}: {blocker} is a file, not a folder"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
@pytest.mark.parametrize("flag", ["--out", "--plot"])
def test_an_out_the_file_system_refuses_is_named_before_the_search(flag, tmp_path, capsys, monkeypatch):
    # /proc passes the folder's access check for root, yet takes no new file: before, the search ran and
    # saving the plan (or the plot) ended in a FileNotFoundError traceback
    import grader.cli
    import grader.plan
    monkeypatch.setattr(grader.plan, "plan", lambda *a, **k: pytest.fail(f"searched before checking {flag}"))
    monkeypatch.setattr(grader.cli.os, "access", lambda *a, **k: True)  # as for root, whoever runs the test
    paths = {"--out": str(tmp_path / "p.json"), "--plot": ""}
    paths[flag] = "/proc/plan.json" if flag == "--out" else "/proc/pareto.png"  # (a plot is an image)
    assert main(["plan", *ARGS, "--out", paths["--out"], "--plot", paths["--plot"]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {flag} {paths[flag]}: cannot be written (") and "\n" not in err


def test_probing_out_leaves_no_file_and_keeps_an_old_one(tmp_path):
    from grader.cli import output_path
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    old.write_text("kept")
    output_path(str(new), "--out", folder=False)
    output_path(str(old), "--out", folder=False)
    assert not new.exists() and old.read_text() == "kept"


def test_the_run_it_line_names_the_cluster_and_workload_as_given(tmp_path, capsys):
    # a cluster file with a name of its own and node NICs: its name alone is no cluster spec, and the
    # spec its nodes describe has no NICs
    cluster = tmp_path / "lab cluster.toml"
    cluster.write_text('name = "lab"\n[[nodes]]\ndevice = "A100-80GB"\ngpus = 2\n'
                       '[[nodes]]\ndevice = "T4"\ngpus = 2\nnics = 1\nnic_bandwidth_GBps = 1.25\n')
    out = tmp_path / "p.json"
    assert main(["plan", "--cluster", str(cluster), "--workload", "toy:layers=4", "--batch", "8", "--top", "3",
                 "--out", str(out), "--plot", ""]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("best plan:"))
    command = shlex.split(line.split("(run it: ", 1)[1].removesuffix(")"))
    assert command == ["python", "-m", "grader", "run", "planned", "--set", f"plan={out}",
                       "--cluster", str(cluster), "--workload", "toy:layers=4", "--batch", "8"]
    best = plan(str(cluster), "toy:layers=4", 8, top=3).best
    assert simulate("strategies/planned.py", command[8], command[10], 8, plan=str(out)).time_s == best.simulated


@pytest.mark.parametrize("flag,value,expected", [
    ("--batch", "0", "argument --batch: must be a whole number from 1 to 1048576, got 0"),
    ("--batch", "2000000", "argument --batch: must be a whole number from 1 to 1048576, got 2000000"),
    ("--top", "-1", "argument --top: must be a whole number from 0 to 100000, got -1"),
    ("--budget", "0", "argument --budget: must be more than 0 and at most 1e+09 USD/h, got '0'"),
])
def test_an_out_of_range_option_is_refused_naming_the_option(flag, value, expected, capsys, monkeypatch):
    import grader.plan
    monkeypatch.setattr(grader.plan, "plan", lambda *a, **k: pytest.fail("searched with an option out of range"))
    assert main(["plan", *ARGS, flag, value, "--plot", ""]) == 2
    assert capsys.readouterr().err.strip() == f"error: python -m grader plan: {expected}"


def test_a_batch_larger_than_any_run_is_refused_before_the_search(monkeypatch):
    import dist_lib.planner.api
    monkeypatch.setattr(dist_lib.planner.api, "generate", lambda *a, **k: pytest.fail("searched"))
    with pytest.raises(SpecError, match=r"^global_batch_size: must be a whole number from 1 to 1048576, got 2097152$"):
        plan("1x2xA100-80GB", "toy", 2**21)


CUSTOM = '[devices.RTX4090]\npeak_tflops = 165\nmemory_GiB = 24\nhbm_GBps = 1008\n{price}\n' \
         '[[nodes]]\ndevice = "RTX4090"\ngpus = 2\n[[nodes]]\ndevice = "A100-80GB"\ngpus = 2\n'


@pytest.mark.parametrize("option", [["--objective", "cost"], ["--budget", "100"]])
def test_a_cost_search_refuses_a_custom_device_without_a_price(option, tmp_path, capsys):
    # without a price the custom GPUs would count as free: the cheapest plan would be any plan on them
    cluster = tmp_path / "c.toml"
    cluster.write_text(CUSTOM.format(price=""))
    assert main(["plan", "--cluster", str(cluster), "--workload", "toy:layers=4", "--batch", "8", *option,
                 "--out", str(tmp_path / "p.json"), "--plot", ""]) == 2
    needs = "objective 'cost'" if option[0] == "--objective" else "a budget"
    assert capsys.readouterr().err.strip() == (
        f"error: {needs} needs every device's price per GPU-hour, and RTX4090 has none: give price_per_hour (USD) "
        f"in its [devices.RTX4090] table of the cluster file")
    assert not (tmp_path / "p.json").exists()


def test_a_custom_devices_price_is_what_a_cost_search_charges(tmp_path):
    cluster = tmp_path / "c.toml"
    cluster.write_text(CUSTOM.format(price="price_per_hour = 0.5"))
    best = plan(str(cluster), "toy:layers=4", 8, top=3, objective="cost").best
    rates = {0: 0.5, 1: 0.5, 2: 40.9657 / 8, 3: 40.9657 / 8}  # the A100-80GB's catalog price per GPU-hour
    assert best.price_per_hour == pytest.approx(sum(rates[r] for r in best.plan.ranks))
    assert best.dollars_per_step == pytest.approx(best.simulated * best.price_per_hour / 3600)


def test_an_interrupted_search_does_not_promise_a_resume(tmp_path, capsys, monkeypatch):
    import grader.plan

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(grader.plan, "plan", interrupted)
    assert main(["plan", *ARGS, "--out", str(tmp_path / "p.json"), "--plot", ""]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"  # a search keeps nothing to resume from
    assert not (tmp_path / "p.json").exists()


def test_a_plan_file_that_does_not_fit_the_run_is_named_by_grader_run(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["plan", "--cluster", "1x2xA100-80GB", "--workload", "toy:layers=4", "--batch", "4", "--top", "1",
                 "--out", str(out), "--plot", ""]) == 0
    capsys.readouterr()
    assert main(["run", "strategies/planned.py", "--set", f"plan={out}", "--cluster", "1x2xA100-80GB",
                 "--workload", "toy:layers=4", "--batch", "8", "--no-plots"]) == 2
    saved = Plan.load(out)
    assert capsys.readouterr().err.strip() == (f"error: plan file {out}: microbatch_size {saved.microbatch_size} x "
                                               f"microbatches {saved.microbatches} = 4, but the global batch is 8")


def test_the_pareto_front_holds_the_plan_moving_layers_made(tmp_path, capsys):
    # here the simulator's winner improves by moving layers between its stages: that plan, the best
    # printed, is the fastest on the front (it was left out, and a slower plan led the front)
    # (GPT-350M: the interleaved 7/17 plan, 664.1 ms, becomes 632.8 ms; GPT-760M on the same cluster did
    # this until the estimate played out interleaved plans, and now ranks first the plan it simulated best)
    args = ["--cluster", "1x2xA10+1x2xT4", "--workload", "gpt-350m", "--batch", "8", "--top", "3"]
    assert main(["plan", *args, "--out", str(tmp_path / "p.json"), "--plot", ""]) == 0
    printed = capsys.readouterr().out
    search = plan("1x2xA10+1x2xT4", "gpt-350m", 8, top=3)
    assert search.refined_from is not None and search.best.seconds < search.refined_from.seconds
    front = printed.split("Pareto front (time per step, $ per step, $ per million tokens): ", 1)[1]
    assert front.split(" ms", 1)[0] == f"{search.best.seconds * 1e3:.2f}"
