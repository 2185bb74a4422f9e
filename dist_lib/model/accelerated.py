"""The C twins of the hottest ops, installed once over their Python specifications: the tensor ops (runs of
layers included) and `WeightGrad.__add__`, the weight ops, the collectives, the message path, and the engine's block/wake path
(`Engine.wake`, `Engine._drive`, `Work.__await__`). The Python methods stay on their classes as the twins'
specification and fallback; `DIST_SANDBOX_PURE_PYTHON=1` keeps them in use."""

from __future__ import annotations

import inspect
from typing import Any

from dist_lib.comm import collectives as comm, p2p
from dist_lib.comm.collectives import Work
from dist_lib.engine import core as _engine
from dist_lib.engine.core import Engine
from dist_lib.engine.eventlog import PACK_AT, EventLog
from dist_lib.engine.rank_state import RankState
from dist_lib.memory.tracker import MemoryTracker
from dist_lib import tensors
from dist_lib.model.handle import Model
from dist_lib.native import twin
from dist_lib.tensors import Activation, ActivationGrad, OptState, Stash, Weight, WeightGrad


def _c_doc(method: Any) -> str:
    """A C method's docstring: the Python twin's signature (for `help` and `inspect`) and docstring."""
    sig = inspect.signature(method)
    sig = sig.replace(parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
                      return_annotation=sig.empty)
    return f"{method.__name__}{str(sig).replace('(self', '($self', 1)}\n--\n\n{method.__doc__ or ''}"


# the Python message path the C one replaced (set when installed), for the tests that run both
PYTHON_P2P: dict[str, Any] = {}


def install_c_twins() -> None:
    """Put the C twins on their classes (a no-op without the C accelerator); those `DIST_SANDBOX_C_OFF` names
    stay in Python."""
    if twin("ops") is not None:
        twin("ops").install_ops(
            Model, RankState, MemoryTracker, Activation, ActivationGrad, Weight, WeightGrad, Stash, PACK_AT,
            {m.__name__: _c_doc(m) for m in (Model.forward, Model.backward, Model.backward_input,
                                             Model.backward_weight, WeightGrad.__add__, Model.forward_layers,
                                             Model.backward_layers)})
    if twin("weight_ops") is not None:
        twin("weight_ops").install_weight_ops(
            Model, RankState, MemoryTracker, Weight, OptState, WeightGrad,
            {m.__name__: _c_doc(m) for m in (Model.load_weights, Model.update, Model.set_final_weight)})
    if twin("comm") is not None:
        twin("comm").install_comm_ops(
            Model, RankState, MemoryTracker, comm, Weight, OptState, WeightGrad,
            {m.__name__: _c_doc(m) for m in (Model.all_reduce, Model.all_gather, Model.reduce_scatter)})
    if twin("p2p") is not None:
        # the message path: p2p._finish becomes the C finish too (Python-started messages use it as well)
        PYTHON_P2P.update(send=Model.send, recv=Model.recv, _finish=p2p._finish)
        twin("p2p").install_p2p_ops(Model, RankState, MemoryTracker, p2p, comm, tensors,
                                    {m.__name__: _c_doc(m) for m in (Model.send, Model.recv)})
    if twin("drive") is not None:
        # the engine's block/wake path: Engine.wake, Engine._drive, Engine.schedule and Work.__await__
        twin("drive").install_drive(
            Engine, RankState, Work, EventLog, _engine.WAKE_ME, PACK_AT, _engine.PYTHON_TWINS,
            {m.__name__: _c_doc(m) for m in (Engine.wake, Engine._drive, Engine.schedule, Work.__await__)})
