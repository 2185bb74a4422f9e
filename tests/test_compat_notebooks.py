"""Puzzles and lab notebooks as students have them: an .ipynb, or its `# In[ ]:` export, with top-level
`await` test cells and IPython magics. A named function is graded on the notebook's definitions alone
(the same figures as the same function in a .py file); no function runs every cell in order; errors
name the cell and the line in it; a file that is not a notebook is one line, exit code 2."""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pytest

from dist_lib import SpecError, StrategyError
from dist_lib.compat import run_file
from dist_lib.compat.notebook import definitions, read_notebook, strip_magics
from grader.cli import main

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "tests" / "compat_notebooks"
SOLUTIONS = ROOT / "tests" / "compat_solutions"
NOTEBOOK = NOTEBOOKS / "puzzles_notebook.ipynb"
EXPORT = NOTEBOOKS / "puzzles_notebook_export.py"
# the same notebook saved by jupytext 1.19.6 (`jupytext --to py:percent`, `--to py:light`)
PERCENT = NOTEBOOKS / "puzzles_notebook_percent.py"
LIGHT = NOTEBOOKS / "puzzles_notebook_light.py"
FILES = pytest.mark.parametrize("file", [NOTEBOOK, EXPORT, PERCENT, LIGHT], ids=["ipynb", "export", "percent", "light"])


def _code_cell(source) -> dict:
    return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source}


def _notebook(tmp_path: Path, name: str, cells: list) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def _json(capsys, *argv) -> tuple[int, dict]:
    code = main(["run", *map(str, argv), "--json", "--no-plots"])
    return code, json.loads(capsys.readouterr().out)


@FILES
@pytest.mark.parametrize("function, steps, peak", [("ddp", 5.1, 1_572_864), ("gpipe", 33.3, 2_752_512)])
def test_a_named_function_is_graded_as_the_same_function_in_a_py_file(file, function, steps, peak, capsys):
    want = run_file(SOLUTIONS / "puzzles_solutions.py", api="puzzles", function=function)
    got = run_file(file, function=function)  # the API told from the cells' imports
    assert got.strategy == f"{file.stem}.{function}" and got.correct and want.correct
    assert got.notebook_time == want.notebook_time == pytest.approx(steps)
    assert got.notebook_memory == want.notebook_memory == peak
    assert got.raw_events == want.raw_events
    assert "Correct!" not in capsys.readouterr().out  # the notebook's own test cells did not run


@FILES
def test_no_function_runs_every_cell_in_order_and_reports_the_last_dist(file, capsys):
    result = run_file(file)
    out = capsys.readouterr().out
    assert out.count("Correct!") == 2  # the two Model.check cells, after awaiting the tests above them
    assert result.strategy == f"{file.stem}.notebook"
    # the last Dist the cells made is the GPipe test's (the %%time cell, its body run once)
    assert result.notebook_time == pytest.approx(33.3) and result.notebook_memory == 2_752_512
    assert out.strip().splitlines()[-1] == str(result.notebook_time)  # the last cell's own print


def test_the_cli_grades_a_notebook_with_the_original_figures(tmp_path, capsys):
    """tmp_path is private to the grader's user: under the sandbox the notebook is copied in to be read."""
    notebook = tmp_path / "mine.ipynb"
    shutil.copy(NOTEBOOK, notebook)
    code, out = _json(capsys, notebook, "--api", "puzzles", "--function", "gpipe", "--trace", tmp_path / "t.json")
    assert code == 0 and out["strategy"] == "mine.gpipe" and out["notebook_time"] == pytest.approx(33.3)
    assert out["notebook_memory"] == 2_752_512 and out["correct"] is True
    code, out = _json(capsys, EXPORT, "--api", "puzzles", "--trace", tmp_path / "t.json")
    assert code == 0 and out["strategy"] == "puzzles_notebook_export.notebook"


def test_magics_and_shell_lines_are_taken_out_keeping_line_numbers():
    cell = ("import os\n%matplotlib inline\n!pip install chalk\nfiles = !ls\ny = (7\n% 4)\n"
            "def f():\n    %timeit g()\n%time x = 1\nModel?\n")
    assert strip_magics(cell) == ("import os\npass\npass\npass\ny = (7\n% 4)\n"
                                  "def f():\n    pass\nx = 1\npass\n")
    assert strip_magics("%%capture\n!pip install x\nimport os\n") == "\npass\nimport os\n"
    assert strip_magics("%%bash\nls -l\n") is None and strip_magics("%%writefile lib.py\nx = 1\n") is None


def test_definitions_keep_imports_defs_and_plain_assignments_only():
    tree = ast.parse("import asyncio\nfrom lib import Model\nN = 4\nSIZES = [range(i) for i in range(N)]\n"
                     "key = lambda m: sorted(m)\nmodel = Model(layers=2)\nout = await run(model)\n"
                     "model.check([model])\nweights[0] = 1\nasync def f(m):\n    return await g(m)\n"
                     "class C:\n    pass\ntry:\n    import chalk\nexcept ImportError:\n    chalk = None\n"
                     "for i in range(2):\n    print(i)\n")
    kept = ast.unparse(definitions(tree)).splitlines()
    assert kept == ["import asyncio", "from lib import Model", "N = 4", "SIZES = [range(i) for i in range(N)]",
                    "key = lambda m: sorted(m)", "", "async def f(m):", "    return await g(m)", "", "class C:",
                    "    pass", "try:", "    import chalk", "except ImportError:", "    chalk = None"]


def test_an_unfinished_puzzle_elsewhere_does_not_stop_a_named_function(tmp_path):
    """A puzzle left as the notebook hands it out (`assert False`), with its test cell, fails only when the
    notebook runs whole: the error names the cell and line of the assert, and the cell that was running."""
    nb = json.loads(NOTEBOOK.read_text())
    nb["cells"][1:1] = [_code_cell(["def basic(model):\n", "    weights, *_ = model.storage()\n",
                                    "    assert False, 'TODO: Implement me'\n", "    return model\n"]),
                        _code_cell("from lib import Dist, Model\nout = basic(Model(layers=2, batches=4, rank=0, "
                                   "dist=Dist(1)))\nModel.check([out])")]
    path = _notebook(tmp_path, "todo.ipynb", nb["cells"])
    assert run_file(path, function="ddp").notebook_time == pytest.approx(5.1)
    with pytest.raises(StrategyError) as caught:
        run_file(path, function="basic")
    assert str(caught.value) == "todo.ipynb: AssertionError: TODO: Implement me (at todo.ipynb, cell 1, line 3 in basic)"
    with pytest.raises(StrategyError) as caught:
        run_file(path, api="puzzles")
    assert str(caught.value) == ("todo.ipynb: AssertionError: TODO: Implement me (at todo.ipynb, cell 1, line 3 in "
                                 "basic); cell 2 was running")


def test_a_syntax_error_names_the_cell_and_line(tmp_path, capsys):
    path = _notebook(tmp_path, "typo.ipynb", [{"cell_type": "markdown", "metadata": {}, "source": "# title"},
                                              _code_cell("from lib import Model\n"),
                                              _code_cell(["async def ddp(model):\n", "    return model +\n"])])
    with pytest.raises(StrategyError, match=r"^typo\.ipynb, cell 2, line 2: SyntaxError: invalid syntax$"):
        read_notebook(path)
    code, out = _json(capsys, path, "--api", "puzzles", "--function", "ddp", "--trace", tmp_path / "t.json")
    assert code == 1 and out["error"] == "StrategyError: typo.ipynb, cell 2, line 2: SyntaxError: invalid syntax"
    export = tmp_path / "typo_export.py"
    export.write_text("# coding: utf-8\n\n# In[1]:\n\n\nfrom lib import Model\n\n\n# In[2]:\n\n\n"
                      "async def ddp(model):\n    return model +\n")
    with pytest.raises(StrategyError) as caught:
        run_file(export, api="puzzles", function="ddp")
    # cell 2 starts on the file's line 12 (after its marker and two blank lines); its line 2 is the file's 13
    assert str(caught.value) == "typo_export.py, cell 2, line 2 (line 13 of the file): SyntaxError: invalid syntax"


def test_a_runtime_error_in_an_export_names_the_cell_line_and_file_line(tmp_path):
    export = tmp_path / "lines.py"
    export.write_text("#!/usr/bin/env python\n# coding: utf-8\n\n# In[ ]:\n\n\nfrom lib import Model, Dist\n"
                      "get_ipython().system('pip install chalk')\n\n\n# In[ ]:\n\n\nasync def ddp(model):\n"
                      "    model.storage()\n    raise ValueError('half done')\n\n\n# In[ ]:\n\n\n"
                      "import asyncio\nawait asyncio.gather(*[ddp(Model(rank=i, dist=Dist(2))) for i in range(2)])\n")
    with pytest.raises(StrategyError) as caught:
        run_file(export, api="puzzles", function="ddp")
    # cell 2 starts on the file's line 14, after its marker and nbconvert's two blank lines, as it starts in
    # the notebook: `raise` is its line 3, the file's line 16
    assert str(caught.value) == "lines.py: ValueError: half done (at lines.py, cell 2, line 3 (line 16 of the file) in ddp)"
    with pytest.raises(StrategyError, match=r"; cell 3 was running$"):
        run_file(export, api="puzzles")


def test_jupytext_scripts_name_the_cell_or_the_file_line(tmp_path):
    """Percent cells are numbered among code cells as in the notebook (markdown ones skipped), from the line
    after their marker; a light script is read as one piece, so its errors name the file's line."""
    for source, name, line, where in [(PERCENT, "pct.py", 61, "pct.py, cell 5, line 11 (line 61 of the file)"),
                                      (LIGHT, "light.py", 53, "light.py, line 53")]:
        text = source.read_text().replace("    del activations[L]\n", "    del activations[L]; 1 / 0\n", 1)
        path = tmp_path / name
        path.write_text(text)
        assert text.splitlines()[line - 1].endswith("1 / 0")
        with pytest.raises(StrategyError) as caught:
            run_file(path, api="puzzles", function="ddp")
        assert str(caught.value) == f"{name}: ZeroDivisionError: division by zero (at {where} in ddp)"
    bad = tmp_path / "typo.py"
    bad.write_text("# %% [markdown]\n# words\n\n# %%\nfrom lib import Model\n\n# %%\nasync def ddp(model):\n"
                   "    return model +\n")
    with pytest.raises(StrategyError) as caught:
        run_file(bad, api="puzzles", function="ddp")
    assert str(caught.value) == "typo.py, cell 2, line 2 (line 9 of the file): SyntaxError: invalid syntax"


def test_jupytext_commented_magics_are_read_as_magics_in_code_only():
    """Jupytext writes magics commented: `# %time CODE` in a code cell runs CODE, as the notebook did; in
    a light script a paragraph of comments is text unless a magic leads it."""
    from dist_lib.compat.notebook import _light_cells, _percent_cells
    cells = _percent_cells("# %% [markdown]\n# %time is text here\n\n# %%\n# %time x = 1\n# a comment\n"
                           "# !pip install chalk\n")
    assert cells == [(1, 5, "%time x = 1\n# a comment\n!pip install chalk\n")]
    assert strip_magics(cells[0][2]) == "x = 1\n# a comment\npass\n"
    light = "# # Title\n# %time is text here\n\n# %%capture\n# !pip install chalk\n\ny = 2\n# %time x = 1\n"
    assert _light_cells(light) == [(0, 1, "# # Title\n# %time is text here\n\n%%capture\n!pip install chalk\n\n"
                                          "y = 2\n%time x = 1\n")]


@pytest.mark.parametrize("text, message", [
    ("{not json", "bad.ipynb: not a notebook (not JSON: "),
    (json.dumps({"nbformat": 3, "worksheets": []}), "bad.ipynb: not an nbformat 4 notebook (no list of cells; nbformat 3"),
    (json.dumps({"nbformat": 4, "cells": [{"cell_type": "markdown", "source": "# only words"}]}),
     "bad.ipynb: the notebook holds no code cells"),
    (json.dumps({"nbformat": 4, "cells": [{"cell_type": "code", "source": 7}]}),
     "bad.ipynb: code cell 1: source is neither a string nor a list of strings"),
    (json.dumps([1, 2]), "bad.ipynb: not an nbformat 4 notebook (no list of cells)"),
])
def test_a_malformed_notebook_is_one_line_and_exit_code_2(tmp_path, capsys, text, message):
    path = tmp_path / "bad.ipynb"
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        run_file(path, api="puzzles")
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
    assert main(["run", str(path), "--api", "puzzles", "--no-plots", "--trace", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1


def test_a_notebook_needs_api_and_is_not_a_leaderboard_submission(tmp_path, capsys):
    assert main(["run", str(NOTEBOOK), "--no-plots"]) == 2
    assert "puzzles_notebook.ipynb: a notebook runs with --api puzzles|lab" in capsys.readouterr().err
    assert main(["leaderboard", str(NOTEBOOK), "--out", str(tmp_path / "board"), "--trusted"]) == 2
    assert "the leaderboard grades .py strategies" in capsys.readouterr().err
    from grader.leaderboard import collect_submissions
    (tmp_path / "both").mkdir()
    shutil.copy(NOTEBOOK, tmp_path / "both" / "nb.ipynb")
    shutil.copy(ROOT / "tests" / "submissions" / "honest.py", tmp_path / "both" / "honest.py")
    assert collect_submissions([str(tmp_path / "both")]) == [(tmp_path / "both" / "honest.py").resolve()]


def _lab_cells() -> list[dict]:
    """lab_course_styles.py cut into a cell per top-level block, then the cell a notebook runs main() with."""
    text = (SOLUTIONS / "lab_course_styles.py").read_text()
    text = text[text.index("import asyncio"):]
    blocks = re.split(r"\n(?=(?:async )?def |class )", text)
    return [_code_cell(b.strip("\n").splitlines(keepends=True)) for b in blocks] + \
        [_code_cell("%load_ext autoreload\nawait main()")]


def test_a_lab_notebook_runs_main_from_its_await_cell_with_the_files_figures(tmp_path, capsys):
    path = _notebook(tmp_path, "lab_nb.ipynb", _lab_cells())
    want = run_file(SOLUTIONS / "lab_course_styles.py", api="lab")
    got = run_file(path, api="lab")
    assert got.strategy == "lab_nb.notebook" and want.strategy == "lab_course_styles.main"
    assert got.notebook_time == want.notebook_time and got.notebook_memory == want.notebook_memory
    assert got.mfu == want.mfu and got.raw_events == want.raw_events
    out = capsys.readouterr().out
    assert out.count("MFU: ") == 2  # main()'s print, once per run
    named = run_file(path, api="lab", function="part3_training_loop", ranks=2, layers=4, batches=8, batch_size=2)
    same = run_file(SOLUTIONS / "lab_course_styles.py", api="lab", function="part3_training_loop", ranks=2,
                    layers=4, batches=8, batch_size=2)
    assert named.raw_events == same.raw_events and named.mfu == same.mfu
    assert "MFU: " not in capsys.readouterr().out


def test_an_export_that_keeps_the_magics_as_typed_runs_alike(tmp_path, capsys):
    """nbconvert without IPython installed writes each cell as typed (`%%capture`, `!pip`) under its marker."""
    cells = [c for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    export = tmp_path / "raw_export.py"
    export.write_text("#!/usr/bin/env python\n# coding: utf-8\n\n" + "".join(
        f"# In[{n}]:\n\n\n{''.join(c['source'])}\n\n\n" for n, c in enumerate(cells, 1)))
    assert "\n%%capture\n" in export.read_text() and "\n%%time\n" in export.read_text()
    result = run_file(export, api="puzzles", function="gpipe")
    assert result.notebook_time == pytest.approx(33.3) and result.notebook_memory == 2_752_512
    assert "Correct!" not in capsys.readouterr().out
    assert run_file(export, api="puzzles").notebook_memory == 2_752_512
    assert capsys.readouterr().out.count("Correct!") == 2


def test_cells_that_only_define_run_their_lone_puzzle_or_ask_for_one(tmp_path):
    cells = [c for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    imports, ddp, gpipe = cells[1], cells[4], cells[8]  # no test cells
    one = _notebook(tmp_path, "one.ipynb", [imports, gpipe])
    result = run_file(one, api="puzzles")
    assert result.strategy == "one.gpipe" and result.notebook_time == pytest.approx(33.3)
    two = _notebook(tmp_path, "two.ipynb", [imports, ddp, gpipe])
    with pytest.raises(SpecError, match="its cells created no models; name the function to grade"):
        run_file(two, api="puzzles")


COLAB = NOTEBOOKS / "colab_drive_notebook.ipynb"


def test_a_colab_only_import_does_not_stop_a_function_that_does_not_use_it():
    """`from google.colab import drive` works in Colab, where the student graded `basic`: the function is
    graded as it was there. Peak (hand-derived, at the second update, nothing deleted): weights and
    optimizer states 2 x 512^2 each, activations 0..2 and their gradients 6 x 4 batches x 512 x 256,
    weight gradients 2 x 512^2 = 4,718,592; step: 8 forward + 8 backward, then updates at 16 and 16.5."""
    result = run_file(COLAB, function="basic")
    assert result.correct and result.notebook_time == 16.5 and result.notebook_memory == 4_718_592


def test_using_a_name_whose_import_failed_says_which_import_and_cell():
    with pytest.raises(StrategyError) as error:
        run_file(COLAB, function="save_to_drive", ranks=1, layers=2, batches=4)
    message = str(error.value)
    assert ("ImportError: 'drive' comes from `from google.colab import drive` in colab_drive_notebook.ipynb, "
            "cell 2, line 1, which could not be imported here: ModuleNotFoundError: No module named 'google") in message
    assert "cell 5, line 2 in save_to_drive" in message


def test_a_wrong_name_imported_from_the_api_still_fails_the_definitions(tmp_path):
    path = _notebook(tmp_path, "typo.ipynb", [_code_cell("from lib import Model, Dsit\n"),
                                              _code_cell("def basic(model):\n    return model\n")])
    with pytest.raises(StrategyError, match=r"running its definitions raised ImportError: cannot import name "
                                            r"'Dsit' from .* \(at typo.ipynb, cell 1, line 1"):
        run_file(path, api="puzzles", function="basic")
