"""The recorded program of a `--api puzzles|lab` run: the shared vocabulary of `recording.py`, which
writes it in the sandboxed worker, and `replay.py`, which checks it and re-executes it in the grader.

A program is plain JSON: {"api", "function", "options", "ranks", "models": [[rank, layers, batches,
entries, final], ...]}, one item per `Model` of the graded `Dist` in creation order. A model's entries
are its calls in the order it made them; each toy tensor is a handle, numbered per model in the order
of definition (an op's outputs, or a literal):

* ["lit", class, [fields]]: a toy tensor the model met that no op of its own made (built by hand,
  `shard`/`combine`/`+` of others, one shared through a Python variable); defines the next handle;
* ["call", method, handle, [args]]: a toy tensor the file made with `+`, `combine` or `shard` (DERIVED) of
  the tensor `handle` names; defines the next handle;
* ["set", handle, [fields]]: the tensor's fields were written in place since the model last saw it;
* ["mem", [[storage, [deleted keys], [[key, value], ...] replaced, [[key, value], ...] appended], ...]]:
  how the five storage dicts changed since the model's previous event (keys are numbers standing for
  the file's keys, values are encoded values), so each event's memory is the sum over what they hold;
* ["op", name, [args], outputs, turn]: a `Model` op with encoded arguments; `outputs` is how many toy
  tensors its result holds (each defines the next handle), -1 when the call raised (a file caught it);
  `turn` is, for a send, its place among the puts into that mailbox (else null).

`final` lists [layer, value] for the layers the model's `final_weights` holds at the end.
An encoded value is null, true/false, a whole number, or a tagged list: ["h", handle], ["f", float],
["s", text], ["t"|"l"|"fs"|"st", [values]] (tuple, list, frozenset, set), ["r", start, stop, step].
"""

from __future__ import annotations

from typing import Any

from dist_lib.compat._storage import STORAGE_NAMES

FILE_MODULE = "_compat_strategy_"  # the prefix of the module name the loader imports a file as
TENSORS = ("Weight", "Activation", "WeightGrad", "OptState", "ActivationGrad")
KIND = {"W": "Weight", "A": "Activation", "G": "WeightGrad", "O": "OptState", "D": "ActivationGrad"}
# per API, each recorded `Model` op: (its parameters: a letter of KIND for a toy tensor of that class, 'v'
# for any value; how many trailing ones may be left out; whether it is a coroutine)
OPS: dict[str, dict[str, tuple[str, int, bool]]] = {
    "puzzles": {"load_weights": ("vvv", 2, False), "get_activation": ("v", 0, False),
                "forward": ("vAW", 0, False), "backward": ("vADW", 0, False), "loss": ("A", 0, False),
                "update": ("vGWOv", 1, False), "event": ("vvv", 2, False), "allreduce": ("vv", 0, True),
                "scatterreduce": ("vv", 0, True), "allgather": ("vv", 0, True), "pass_to": ("vv", 0, True),
                "receive": ("", 0, True)},
    "lab": {"load_weights": ("vvv", 2, False), "get_input_activation": ("v", 0, False),
            "forward": ("vAW", 0, False), "backward": ("vADW", 0, False), "loss": ("A", 0, False),
            "update": ("vGWO", 0, False), "log_event": ("vvvvvv", 5, False), "all_reduce": ("vv", 0, True),
            "reduce_scatter": ("vv", 0, True), "all_gather": ("vv", 0, True), "send": ("vv", 0, True),
            "receive": ("v", 0, True)},
}
SENDS = ("pass_to", "send")
DERIVED = ("__add__", "combine", "shard")  # the tensors' own methods a file may make a tensor with
STORAGE = STORAGE_NAMES
FUNCTION_MODES = ("main", "notebook")  # a file's own main() or a notebook's cells: the file's own set-up

MAX_INT = 2**53  # any whole number in a program: below it in size (JSON's exact integers)
MAX_TEXT = 256  # characters of a string value (an event's type)
MAX_ITEMS = 1 << 16  # items of one collection value (or range)
MAX_DEPTH = 8  # nesting of collection values
MAX_OUTPUTS = 256  # toy tensors one op's result may hold
MAX_MODELS = 1024  # models of the graded Dist (the end-of-step check reads each one's final weight per layer)
COLLECTIONS = {"t": tuple, "l": list, "fs": frozenset, "st": set}
TAG_OF = {tuple: "t", list: "l", frozenset: "fs", set: "st"}


def tensor_classes(api: str) -> tuple[type, ...]:
    """The API's toy tensor classes, in `TENSORS` order (a literal's class is an index into them)."""
    from dist_lib.compat import lab
    from dist_lib.compat import puzzles
    module = puzzles if api == "puzzles" else lab
    return tuple(getattr(module, name) for name in TENSORS)


def tensors_in(value: Any, classes: tuple[type, ...]) -> list:
    """The toy tensors of a result, depth first through tuples and lists: the handles an op defines."""
    if type(value) in classes:
        return [value]
    if type(value) in (tuple, list):
        return [t for item in value for t in tensors_in(item, classes)]
    return []
