"""The README and the docs stay true: their examples run and print what they show, and the reference
pages list what the code accepts (every key, flag, device, preset and strategy option)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()


def page(name: str) -> str:
    return (DOCS / name).read_text()


def blocks(text: str, language: str = "python") -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def output_after(text: str, block: str) -> str:
    """The plain ``` block that follows `block` in `text` (what the docs say it prints)."""
    rest = text[text.index(block) + len(block):].removeprefix("```")  # past the block's own closing fence
    return re.search(r"```\n(.*?)```", rest, flags=re.S).group(1).strip()


# ---- the README ---------------------------------------------------------------------------------

def test_the_readme_is_a_front_door_not_a_manual():
    assert len(README.splitlines()) <= 250
    for target in re.findall(r"\]\(((?:docs/|CHANGELOG|CONTRIBUTING|LICENSE|CITATION)[^)#]*)", README):
        assert (ROOT / target).exists(), target


def test_quickstart_is_two_commands():
    block = re.search(r"## Quickstart.*?```(?:sh|bash)\n(.*?)```", README, flags=re.S).group(1)
    commands = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert commands == ["python3 dev.py run", "python3 dev.py test"]


@pytest.mark.parametrize("text", [README, page("tutorials/first-strategy.md")], ids=["README", "tutorial"])
def test_the_example_strategy_shown_is_the_file_that_runs(text):
    assert (ROOT / "examples" / "my_ddp.py").read_text() in blocks(text)


@pytest.mark.parametrize("text", [README, page("tutorials/first-strategy.md")], ids=["README", "tutorial"])
def test_the_usage_snippet_runs_and_prints_what_is_shown(text, tmp_path, monkeypatch, capsys):
    snippet = next(b for b in blocks(text) if "simulate(" in b and "examples/my_ddp.py" in b)
    monkeypatch.chdir(ROOT)
    exec(compile(snippet.replace("traces/my_ddp.json", str(tmp_path / "t.json")), "docs", "exec"), {})
    assert capsys.readouterr().out.strip() == output_after(text, snippet)


def test_the_out_of_memory_error_shown_is_what_the_code_raises():
    from dist_lib import OutOfMemoryError, simulate
    with pytest.raises(OutOfMemoryError) as caught:
        simulate(str(ROOT / "examples" / "my_ddp.py"), cluster="1x4xA100-80GB+1x4xV100-32GB", workload="gpt-1.3b",
                 global_batch_size=32, microbatch_size=2)
    shown = " ".join(output_after(page("tutorials/first-strategy.md"), "## 3. Break it").split())
    assert shown == " ".join(f"OutOfMemoryError: {caught.value}".split())
    assert shown in " ".join(page("reference/errors.md").split())


def test_the_bad_input_line_shown_is_what_the_code_prints():
    from dist_lib import SpecError, Workload
    with pytest.raises(SpecError) as caught:
        Workload.parse("toy:seq=1e9")
    line = f"error: {caught.value}"
    for name in ("reference/cli.md", "troubleshooting.md"):
        assert line in page(name), name


def test_the_plan_shown_is_the_one_the_planner_finds():
    from dist_lib import plan
    best = plan("1x4xA100-80GB+1x4xV100-32GB", "gpt-1.3b", 32).best
    line = f"best plan: {best.plan.describe()} -> plan.json"
    for text in (README, page("tutorials/planning-a-mixed-cluster.md")):
        assert line in text
    for name in ("reference/plan-file.md", "tutorials/planning-a-mixed-cluster.md"):
        shown = json.loads(blocks(page(name), "json")[0])
        assert shown == best.plan.to_dict(), name
    assert f"{best.simulated * 1e3:.2f}" in page("tutorials/planning-a-mixed-cluster.md")


def test_the_long_context_how_to_shows_what_the_planner_finds_exports_and_runs(tmp_path):
    from dist_lib import Cluster, Workload, plan
    from dist_lib.planner.export import export
    from grader.launch_cli import settings_run
    text = page("how-to/plan-a-long-context-run.md")
    cluster, workload = Cluster.load("4x8xH100-80GB"), Workload.load("llama-3-8b:seq=131072")
    best = plan(cluster, workload, 8, framework="torchtitan").best
    assert f"{best.estimate * 1e3:.2f}  {best.simulated * 1e3:.2f}" in text
    toml = blocks(text, "toml")[0]
    assert toml == export(best.plan, "torchtitan", workload, cluster).settings
    # `run --from` on the exported config, with the workload named without its sequence length
    (tmp_path / "plan.torchtitan.toml").write_text(toml)
    assert settings_run("torchtitan", str(tmp_path / "plan.torchtitan.toml"), "4x8xH100-80GB",
                        "llama-3-8b")[2] == workload.name
    assert f"step time     {best.simulated * 1e3:.2f} ms" in text


def test_the_schedule_comparison_prints_what_the_tutorial_shows(monkeypatch, capsys):
    text = page("tutorials/comparing-schedules.md")
    snippet = blocks(text)[0]
    monkeypatch.chdir(ROOT)
    exec(compile(snippet, "comparing-schedules", "exec"), {})
    assert capsys.readouterr().out.strip() == output_after(text, snippet)


# ---- the reference pages list what the code accepts ---------------------------------------------

def table_keys(text: str, heading: str) -> set[str]:
    """The backticked first cells of the table under `heading`."""
    section = text.split(heading, 1)[1].split("\n#", 1)[0]
    return set(re.findall(r"^\| `([\w.-]+)`", section, flags=re.M))


def test_the_device_page_is_the_catalog():
    from dist_lib import DEVICES
    from dist_lib.hardware.devices import GiB
    text = page("reference/devices.md")
    for d in DEVICES.values():
        row = (f"| `{d.name}` | {d.peak_flops / 1e12:g} | {d.memory_bytes / GiB:g} | {d.hbm_bandwidth / 1e9:g} | "
               f"{d.sms} | {d.max_efficiency:g} | {d.intra_link.name}, {d.intra_link.bandwidth / 1e9:g} GB/s | "
               f"{d.inter_link.name}, {d.inter_link.bandwidth / 1e9:g} GB/s | {d.price_per_hour:.4g} |")
        assert row in text, d.name
    assert len(re.findall(r"^\| `", text, flags=re.M)) == len(DEVICES)


def test_the_preset_table_is_the_presets():
    from dist_lib import PRESETS
    text = page("reference/workload-toml.md")
    for name, w in PRESETS.items():
        assert re.search(rf"^\| `{re.escape(name)}` \| {w.num_layers} \| {w.hidden} \| {w.heads} \| {w.seq_len} \| "
                         rf"{w.vocab}\b", text, flags=re.M), name
    assert table_keys(text, "## Presets") == set(PRESETS)


def test_the_workload_page_lists_every_key_the_reader_knows():
    from dist_lib import SpecError, Workload
    with pytest.raises(SpecError) as caught:
        Workload.parse("toy:no_such_key=1")
    known = set(re.search(r"\(known: (.*)\)", str(caught.value)).group(1).split(", "))
    assert table_keys(page("reference/workload-toml.md"), "## Keys") == known | {"preset", "name"}


def test_the_cluster_page_lists_every_key_the_reader_accepts(tmp_path):
    from dist_lib import Cluster, SpecError
    from dist_lib.hardware.cluster import FIGURE_RANGES
    text = page("reference/cluster-toml.md")
    node_keys = table_keys(text, "### `[[nodes]]`")
    device_keys = table_keys(text, "### `[devices.NAME]`")
    samples = {"count": 2, "gpus": 4, "intra_bandwidth_GBps": 20, "inter_bandwidth_GBps": 10, "intra_latency_us": 3,
               "inter_latency_us": 10, "nics": 1, "nic_bandwidth_GBps": 1.25}
    for key in node_keys - {"device"}:
        entry = {"device": "A100-80GB", key: samples[key]}
        if key == "nic_bandwidth_GBps":
            entry["nics"] = 1
        Cluster.from_dict({"nodes": [entry]})  # a documented key is accepted
    with pytest.raises(SpecError):
        Cluster.from_dict({"nodes": [{"device": "A100-80GB", "no_such_key": 1}]})
    with pytest.raises(SpecError) as caught:
        Cluster.from_dict({"devices": {"X": {"peak_tflops": 1, "memory_GiB": 1, "hbm_GBps": 1, "bogus": 1}},
                           "nodes": [{"device": "X"}]})
    known = set(re.search(r"\(known: (.*)\)", str(caught.value)).group(1).split(", "))
    assert device_keys == known
    assert table_keys(text, "### Top level") == {"name", "devices", "nodes"}
    assert node_keys == set(samples) | {"device"}
    for suffix in FIGURE_RANGES:  # every range the reader checks is given
        assert suffix.split("_")[-1] in text


def test_the_suite_page_lists_every_key_the_reader_accepts():
    from grader.scoring import METRICS
    from grader.suites import SCENARIO_FIELDS
    text = page("reference/suite-toml.md")
    assert table_keys(text, "## `[[scenarios]]`") == SCENARIO_FIELDS
    assert table_keys(text, "## `[limits]`") == {"timeout_s", "address_space_GiB"}
    assert table_keys(text, "## Top level") == {"name", "description", "limits", "defaults", "scenarios", "scoring"}
    components = table_keys(text, "## `[[scoring.components]]`")
    assert components >= {"name", "metric", "weight", "higher_is_better", "steps", "otherwise", "scale"}
    assert "`min`, `max`" in text
    for metric in METRICS:
        assert f"| `{metric}` |" in text, metric


def test_the_plan_page_lists_every_field():
    from dist_lib.planner.plan import RECOMPUTE, SCHEDULES, Plan, Stage
    text = page("reference/plan-file.md")
    assert table_keys(text, "## Top level") == {f.name for f in dataclasses.fields(Plan)}
    assert table_keys(text, "## A stage") == {f.name for f in dataclasses.fields(Stage)}
    for value in (*SCHEDULES, *RECOMPUTE):
        assert f'`"{value}"`' in text, value


def test_the_profile_and_metis_pages_name_every_field_read():
    profiles = page("reference/profile-files.md")
    for key in ("model.num_layers", "parameters_per_layer_bytes", "layer_compute_total_ms", "optimizer_time_ms",
                "batch_generator_time_ms", "layer_memory_total_mb", "total_memory"):
        assert key in profiles, key
    metis = page("reference/metis-files.md")
    for key in ("instance_type", "inter_bandwidth", "intra_bandwidth", "memory", "slots="):
        assert key in metis, key


def test_every_toml_example_in_the_docs_reads(tmp_path):
    from dist_lib import Cluster, Workload
    from grader.suites import load_suite
    found = 0
    for path in sorted(DOCS.rglob("*.md")):
        for i, block in enumerate(blocks(path.read_text(), "toml")):
            data = tomllib.loads(block)
            file = tmp_path / f"{path.stem}-{i}.toml"
            file.write_text(block)
            if "scenarios" in data:
                load_suite(file)
            elif "nodes" in data:
                Cluster.load(file)
            elif "preset" in data or "layers" in data:
                Workload.load(file)
            else:
                continue  # a fragment (a scoring component)
            found += 1
    assert found >= 5


def test_the_command_line_page_names_every_command_and_flag():
    from grader.cli import build_parser
    text = page("reference/cli.md")
    parser = build_parser()
    commands = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict)).choices
    for name, sub in commands.items():
        assert f"## `{name}`" in text, name
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in text, (name, flag)


def test_the_strategy_table_names_options_each_strategy_takes():
    rows = re.findall(r"^\| `(\w+)\.py` \| .*? \| (.*?) \|$", page("reference/strategies.md"), flags=re.M)
    bundled = {p.stem for p in (ROOT / "strategies").glob("*.py") if not p.name.startswith("_")}
    assert {name for name, _ in rows} == bundled
    previous: set[str] = set()
    for name, cell in rows:
        taken = set(list(inspect.signature(importlib.import_module(f"strategies.{name}").train).parameters)[1:])
        listed = set(re.findall(r"`(\w+)`", cell)) - {"hybrid"}
        if cell.startswith("same"):
            listed = previous
        elif cell.startswith("+"):  # "+ x": the options of the row it follows, and x
            listed |= previous
        assert listed <= taken, (name, sorted(listed - taken))
        previous = listed


def test_the_strategies_benchmark_runs_every_bundled_strategy():
    """The docs say `python -m benchmarks.strategies` prints every strategy."""
    from benchmarks.strategies import RUNS
    bundled = {p.stem for p in (ROOT / "strategies").glob("*.py") if not p.name.startswith("_")}
    assert {name for name, _ in RUNS} == bundled


def test_the_python_api_page_documents_every_public_name():
    import dist_lib
    text = page("reference/python-api.md")
    documented = set(re.findall(r"^::: dist_lib\.(\w+)$", text, flags=re.M))
    assert documented == set(dist_lib.__all__)
