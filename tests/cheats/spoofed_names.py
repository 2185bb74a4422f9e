"""Display spoofing: PLANT lays copies of the honest strategy under names that read as another's or as
nothing: `honеst` with a Cyrillic `е`, a full-width `ｈｏｎｅｓｔ`, a blank-looking Hangul filler, a name
holding a line break and a fake board row, and a name that starts with a full-width `＝` (a formula to a
spreadsheet). On the board each is NFKC-normalised, its control characters and line breaks escaped, and
where it could be read as another's name its non-ASCII characters are escaped too; its CSV cell is led by
a `'`. This file itself runs its honest step."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
PLANT = {"hon\u0435st.py": ["copy", "honest"], "\uff48\uff4f\uff4e\uff45\uff53\uff54.py": ["copy", "honest"],
         "\u3164.py": ["copy", "honest"], "x\n1 honest 99.0.py": ["copy", "honest"],
         "\uff1dcmd.py": ["copy", "honest"], "\n=cmd.py": ["copy", "honest"]}
import pathlib as _p, sys as _s  # noqa: E401 - the shared honest step, beside this file
_s.path.insert(0, str(_p.Path(__file__).parent))
import _base  # noqa: E402


async def train(model):
    await _base.train(model)
