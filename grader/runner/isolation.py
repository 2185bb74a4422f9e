"""Run one strategy file on one scenario in a fresh subprocess with a wall-clock timeout and an
address-space limit. A hang, a crash, an infinite loop or a memory blow-up becomes an `Outcome`;
nothing the submission does can stop the caller.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..scenario import Scenario

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 120.0
    address_space_bytes: int = 4 * 2**30


@dataclass
class Outcome:
    """status: ok | bad_input | failed | timeout | crashed. `payload` is the worker's raw JSON (untrusted)."""

    status: str
    message: str = ""
    kind: str = ""
    payload: dict[str, Any] | None = None
    wall_s: float = 0.0


def run_isolated(strategy: str | Path, scenario: Scenario, limits: Limits = Limits(), *,
                 api: str | None = None, function: str | None = None) -> Outcome:
    job = {"strategy": str(Path(strategy).resolve()), "scenario": scenario.to_dict(), "api": api,
           "function": function, "timeout_s": limits.timeout_s, "address_space_bytes": limits.address_space_bytes}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONHASHSEED"] = "0"
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="grader-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))
        proc = subprocess.Popen([sys.executable, "-m", "grader._worker", str(job_path), str(out_path)],
                                cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, stderr = proc.communicate(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            return Outcome("timeout", f"timed out after {limits.timeout_s:g} s of wall-clock time "
                                      f"(an infinite loop or a real blocking call in the strategy?)",
                           kind="Timeout", wall_s=time.monotonic() - started)
        finally:
            _kill(proc)
        wall = time.monotonic() - started
        if not out_path.exists():
            return Outcome("crashed", _crash_message(proc.returncode, stderr, limits), kind="Crash", wall_s=wall)
        try:
            payload = json.loads(out_path.read_text())
        except (OSError, ValueError) as exc:
            return Outcome("crashed", f"the worker wrote an unreadable result ({exc})", kind="Crash", wall_s=wall)
    if not isinstance(payload, dict) or payload.get("status") not in ("ok", "bad_input", "failed"):
        return Outcome("crashed", "the worker wrote a result of the wrong shape", kind="Crash", wall_s=wall)
    status = payload["status"]
    if status != "ok":
        return Outcome(status, str(payload.get("message", "")), kind=str(payload.get("kind", "")), wall_s=wall)
    return Outcome("ok", payload=payload.get("result"), wall_s=wall)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


def _crash_message(code: int | None, stderr: bytes, limits: Limits) -> str:
    tail = stderr.decode(errors="replace").strip().splitlines()[-1:] if stderr else []
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        why = {"SIGKILL": "killed (out of real memory or CPU time?)", "SIGXCPU": "CPU time limit reached",
               "SIGSEGV": "segmentation fault"}.get(name, f"killed by {name}")
        return f"the worker process died: {why}" + (f"; last output: {tail[0]}" if tail else "")
    detail = f": {tail[0]}" if tail else ""
    return f"the worker process exited with code {code} without a result{detail}"
