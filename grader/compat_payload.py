"""Read the result a `--api puzzles|lab` run reports about itself, checking every field first.

A `--api` run is graded by replaying its recorded program (`dist_lib.compat.replay`); only a run whose
program could not be recorded (`dist_lib.compat.recording` says why) is taken as reported, through
`reported` here (`options['verified']` is False, `options['unverified']` the reason). The report is
untrusted all the same: the sandboxed
process can write any JSON as its header, and the grader's own work on it (the row, the trace, the plots,
the terminal report) must not fail on it. Every field is checked here against the shape the worker's
`_run_compat` writes: types, finite non-negative numbers, one entry per rank of the reported cluster,
events whose rank, times and peers are in range, memory timelines of paired times and bytes. The first
field out of shape is a `PayloadError` naming it; the row is then `invalid`.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

from dist_lib.errors import SpecError
from dist_lib.specs import shown

STREAMS = ("compute", "collective", "p2p")
MAX_TEXT = 4096  # characters of any one reported string (a name, an op, a problem)
MAX_INT = 2**63 - 1  # bytes, layers, op ids: what an 8-byte counter holds
EVENT_FIELDS = 12


class PayloadError(ValueError):
    """A reported `--api` result that is not of the shape the worker writes; the message names the field."""


def reported(compat: Any) -> Any:
    """The `Result` of a `--api` run the worker could not record: {"unreplayable": why, "result": figures}."""
    if not isinstance(compat, dict) or set(compat) != {"unreplayable", "result"}:
        raise PayloadError(f"expected a recorded program or an unreplayable run's figures, got {shown(compat)}")
    reason = _text(compat["unreplayable"], "unreplayable")
    result = compat_result(compat["result"])
    result.options["unverified"] = reason
    return result


def compat_result(payload: Any) -> Any:
    """The `Result` a `--api` run reported, every field checked (`PayloadError` names the first bad one)."""
    from dist_lib import Cluster, Result, Workload
    if not isinstance(payload, dict):
        raise PayloadError(f"the result: expected an object, got {type(payload).__name__}")
    get = _getter(payload)
    try:
        cluster = Cluster.parse(_text(get("cluster"), "cluster"))
        fields = get("workload")
        if not isinstance(fields, dict) or not all(isinstance(k, str) for k in fields):
            raise PayloadError(f"workload: expected an object of named fields, got {shown(fields)}")
        workload = Workload(**fields)
    except (SpecError, TypeError) as exc:
        raise PayloadError(f"cluster or workload: {exc}") from None
    world = cluster.world_size
    options = get("options")
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise PayloadError(f"options: expected an object of named options, got {shown(options)}")
    for key in ("api", "timing"):
        if key in options:
            _text(options[key], f"options.{key}")
    if "notebook" in options:
        _notebook(options["notebook"])
    memory = _per_rank(get("memory_bytes"), "memory_bytes", world, _count)
    return Result(
        cluster=cluster, workload=workload, global_batch_size=_count(get("global_batch"), "global_batch", low=1),
        options={**options, "verified": False}, time_s=_amount(get("time_s"), "time_s"),
        rank_times=_per_rank(get("rank_times"), "rank_times", world, _amount), memory_bytes=memory,
        memory_by_kind=[{} for _ in memory], model_flops=_amount(get("model_flops"), "model_flops"),
        hardware_flops=_amount(get("hardware_flops"), "hardware_flops"), correct=_flag(get("correct"), "correct"),
        problems=[_text(p, f"problems[{i}]") for i, p in enumerate(_list(get("problems"), "problems"))],
        raw_events=[_event(e, f"events[{i}]", world) for i, e in enumerate(_list(get("events"), "events"))],
        timelines=_per_rank(get("timelines"), "timelines", world, _timeline),
        strategy=_text(payload.get("strategy", ""), "strategy"))


NOTEBOOK_FIGURES = {"time": "amount", "memory": "amount", "mfu": "amount", "time_unit": "text", "memory_unit": "text"}


def _notebook(figures: Any) -> None:
    """The figures as the notebook reports them (`options['notebook']`), which the terminal report prints."""
    if not isinstance(figures, dict) or not set(figures) <= set(NOTEBOOK_FIGURES):
        raise PayloadError(f"options.notebook: expected an object of {', '.join(NOTEBOOK_FIGURES)}, got {shown(figures)}")
    for key, value in figures.items():
        (_amount if NOTEBOOK_FIGURES[key] == "amount" else _text)(value, f"options.notebook.{key}")


def _getter(payload: dict[str, Any]) -> Any:
    def get(key: str) -> Any:
        if key not in payload:
            raise PayloadError(f"{key}: missing")
        return payload[key]
    return get


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise PayloadError(f"{where}: expected a list, got {shown(value)}")
    return value


def _per_rank(value: Any, where: str, world: int, read: Any) -> list:
    """One entry per rank of the reported cluster, each read with `read(entry, where)`."""
    items = _list(value, where)
    if len(items) != world:
        raise PayloadError(f"{where}: {len(items)} entries for a cluster of {world} ranks")
    return [read(item, f"{where}[{rank}]") for rank, item in enumerate(items)]


def _amount(value: Any, where: str) -> float:
    """A finite number >= 0 (a time, a FLOP count)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise PayloadError(f"{where}: expected a finite number >= 0, got {shown(value)}")
    return float(value)


def _count(value: Any, where: str, low: int = 0) -> int:
    if value.__class__ is not int or not low <= value <= MAX_INT:
        raise PayloadError(f"{where}: expected a whole number from {low} to {MAX_INT}, got {shown(value)}")
    return value


def _mask(value: Any, where: str) -> int:
    """A samples bit mask: a whole number >= 0 (as wide as the batch; JSON's reader bounds its digits)."""
    if value.__class__ is not int or value < 0:
        raise PayloadError(f"{where}: expected a samples mask (a whole number >= 0), got {shown(value)}")
    return value


def _index(value: Any, where: str, world: int) -> int:
    if value.__class__ is not int or not 0 <= value < world:
        raise PayloadError(f"{where}: expected a rank from 0 to {world - 1}, got {shown(value)}")
    return value


def _flag(value: Any, where: str) -> bool:
    if value is not True and value is not False:
        raise PayloadError(f"{where}: expected true or false, got {shown(value)}")
    return value


def _text(value: Any, where: str) -> str:
    """A string of printable characters (no terminal escapes, no line breaks), at most MAX_TEXT long."""
    if not isinstance(value, str) or len(value) > MAX_TEXT or not value.isprintable():
        raise PayloadError(f"{where}: expected printable text of at most {MAX_TEXT} characters, got {shown(value)}")
    return value


def _event(value: Any, where: str, world: int) -> tuple:
    """(rank, op, stream, start, end, layer, samples, nbytes, flops, peers, op_id, detail), as the
    simulator's raw events are (a layer of -1 is none; op ids are any 8-byte integers)."""
    row = _list(value, where)
    if len(row) != EVENT_FIELDS:
        raise PayloadError(f"{where}: expected {EVENT_FIELDS} fields, got {len(row)}")
    rank, op, stream, start, end, layer, samples, nbytes, flops, peers, op_id, detail = row
    if stream not in STREAMS:
        raise PayloadError(f"{where}[2] (stream): expected one of {', '.join(STREAMS)}, got {shown(stream)}")
    start, end = _amount(start, f"{where}[3] (start)"), _amount(end, f"{where}[4] (end)")
    if end < start:
        raise PayloadError(f"{where}: ends at {end:g} before it starts at {start:g}")
    if peers is not None:
        peers = tuple(_index(p, f"{where}[9] (peers)", world) for p in _list(peers, f"{where}[9] (peers)"))
    return (_index(rank, f"{where}[0] (rank)", world), _text(op, f"{where}[1] (op)"), stream, start, end,
            _count(layer, f"{where}[5] (layer)", low=-MAX_INT),
            _mask(samples, f"{where}[6] (samples)"), _count(nbytes, f"{where}[7] (nbytes)"),
            _amount(flops, f"{where}[8] (flops)"), peers, _count(op_id, f"{where}[10] (op_id)", low=-MAX_INT),
            _text(detail, f"{where}[11] (detail)"))


def _timeline(value: Any, where: str) -> tuple[array, array]:
    """(times, live bytes) of one rank, paired one to one."""
    pair = _list(value, where)
    if len(pair) != 2:
        raise PayloadError(f"{where}: expected [times, bytes], got {len(pair)} lists")
    times = [_amount(t, f"{where}[0]") for t in _list(pair[0], f"{where}[0]")]
    values = [_amount(v, f"{where}[1]") for v in _list(pair[1], f"{where}[1]")]
    if len(times) != len(values):
        raise PayloadError(f"{where}: {len(times)} times but {len(values)} byte counts")
    return array("d", times), array("d", values)
