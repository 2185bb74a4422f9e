"""Copies a classmate: imports `_classmate_layout`, another student's private helper (PLANT; on the
classroom board it lies in that student's own folder in the per-student layout, beside everyone in the flat
one), to score exactly as they do. Every `_*.py` of a folder was once copied into every run. In the
per-student layout a run is given only its own folder's helpers: the import finds nothing, and the row
fails with nothing of the classmate's file in its error text. (In a flat folder every file is shared: a
helper there is given to any submission that names it, as docs/trust-model.md says.)"""
TWIN = "honest"  # the honest strategy this cheat must not rank above
PLANT = {"_classmate_layout.py": ["copy", "honest", "# CLASSMATE_SECRET: a classmate's private layout\n"]}
PLANTED_BY = "honest"  # in the per-student layout, the plant goes in this classmate's folder
import pathlib as _p, sys as _s  # noqa: E401 - the helper, beside this file if the run was given it
_s.path.insert(0, str(_p.Path(__file__).parent))
from _classmate_layout import train  # noqa: E402,F401
