"""The README's example and quickstart stay true."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_the_example_strategy_in_the_readme_is_the_file_that_runs():
    example = (ROOT / "examples" / "my_ddp.py").read_text()
    assert example in python_blocks()


def test_the_usage_snippet_runs_and_prints_what_the_readme_shows(tmp_path, monkeypatch, capsys):
    snippet = next(b for b in python_blocks() if "simulate(" in b and "examples/my_ddp.py" in b)
    monkeypatch.chdir(ROOT)
    exec(compile(snippet.replace("traces/my_ddp.json", str(tmp_path / "t.json")), "README", "exec"), {})
    printed = capsys.readouterr().out.strip()
    assert printed and printed in README


def test_quickstart_is_two_commands():
    block = re.search(r"## Quickstart.*?```(?:sh|bash)\n(.*?)```", README, flags=re.S).group(1)
    commands = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert commands == ["python3 dev.py run", "python3 dev.py test"]


def test_the_device_list_is_the_catalog():
    from dist_lib.hardware.devices import DEVICES
    listed = re.search(r"^Devices: (.*?) \(figures in", README, flags=re.M).group(1).split(", ")
    assert sorted(listed) == sorted(DEVICES)


def test_the_strategy_table_names_options_each_strategy_takes():
    import importlib
    import inspect
    rows = re.findall(r"^\| `(\w+)\.py` \| .*? \| (.*?) \|$", README, flags=re.M)
    assert len(rows) >= 10
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
    """The README says `python -m benchmarks.strategies` prints every strategy."""
    from benchmarks.strategies import RUNS
    bundled = {p.stem for p in (ROOT / "strategies").glob("*.py") if not p.name.startswith("_")}
    assert {name for name, _ in RUNS} == bundled
