"""Pipeline schedule actions and the check every schedule passes before it runs.

A schedule is what each stage does, as a list of `Action`s (the shape PyTorch's
`torch.distributed.pipelining` uses): `F` forward, `B` full backward, `I` input-gradient half and `W`
deferred weight-gradient half of a split backward (Qi et al. 2023), each naming a model chunk (0 unless
interleaved) and a microbatch; besides those, blocking messages a schedule places itself (`MESSAGES`), messages
it issues together and waits for later (`EXCHANGES`) and receives it posts ahead of the pass that takes them
(`POSTS`). `_pipeline.py` carries the lists out.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, repeat
from operator import eq, lt
from typing import NamedTuple

class Action(NamedTuple):
    kind: str  # "F", "B", "I" or "W"; or a blocking message (`MESSAGES`) or a posted receive (`POSTS`)
    chunk: int
    mb: int

    def __repr__(self) -> str:
        return f"{self.kind}{self.mb}" + (f"c{self.chunk}" if self.chunk else "")


# Blocking messages a schedule may place itself (DeepSpeed's engine: deepspeed_1f1b.py): receive or send an
# activation (to the next stage) or a gradient (to the previous one). A schedule that uses them owns every
# message of the stage; otherwise forwards receive their input and send their output themselves, without
# blocking.
MESSAGES = {"RA": "activation", "SA": "activation", "RG": "activation gradient", "SG": "activation gradient"}

# Megatron-LM's exchange (`_megatron_exchange.py`): issue, without blocking, the send of an activation or gradient
# a pass produced ("XSA", "XSG") or the receive of one a later pass takes ("XRA", "XRG"); then wait for every
# activation ("XWA") or gradient ("XWG") message issued since, sends included, before going on. Like `MESSAGES`,
# a schedule that uses them owns every message of the stage (the wait actions name chunk and microbatch 0).
EXCHANGES = {"XSA": "activation", "XRA": "activation", "XWA": "activation",
             "XSG": "activation gradient", "XRG": "activation gradient", "XWG": "activation gradient"}

# Non-blocking receives a schedule may post ahead of the pass that takes them (the Zero Bubble reference
# implementation's placement: `_early_receives.py`): post the receive of a chunk's input activation or of its
# output gradient for a microbatch now; that pass then awaits the posted receive instead of receiving itself.
# A chunk with one receive of a kind posted has every one of that kind posted; the stage runs with
# `_early_receives.run_posted_stage`.
POSTS = {"PA": "activation", "PG": "activation gradient"}


def check_schedule(actions: Sequence[Action], chunks: int, microbatches: int) -> None:
    """Each (chunk, microbatch) forwarded once, then backward once (B, or I then W); a posted receive
    (`POSTS`) comes once, before the pass that takes it, and a chunk has every receive of a kind posted or none;
    an issued receive (`EXCHANGES`) is waited for before the pass that takes it."""
    if _plain_schedule_passes(actions, chunks * microbatches):
        return
    seen: dict[tuple[int, int], str] = {}
    unwaited: dict[str, set] = {"activation": set(), "activation gradient": set()}  # issued receives not waited for
    posted: dict[str, set] = {"PA": set(), "PG": set()}
    taken: dict[str, set] = {"PA": set(), "PG": set()}  # passes that took a posted receive
    unposted: dict[str, set] = {"PA": set(), "PG": set()}  # passes that took their input without a post
    for a in actions:
        if a.kind in MESSAGES:
            continue
        if a.kind in EXCHANGES:
            _check_exchange(a, unwaited)
            continue
        key, done = (a.chunk, a.mb), seen.get((a.chunk, a.mb), "")
        takes = "activation" if a.kind == "F" else "activation gradient" if a.kind in ("B", "I") else None
        if takes is not None and key in unwaited[takes]:
            raise ValueError(f"schedule: {a!r} takes an issued receive not yet waited for (chunk {a.chunk} "
                             f"microbatch {a.mb}); place XWA (activations) or XWG (gradients) before it")
        need = _NEED.get(a.kind)
        if need is None:
            _check_post(a, done, posted)
            continue
        if done != need:
            raise ValueError(f"schedule: {a!r} after {done or 'nothing'} for chunk {a.chunk} microbatch {a.mb}")
        seen[key] = done + a.kind
        post = _TAKES.get(a.kind)
        if post is not None:
            (taken if key in posted[post] else unposted)[post].add(key)
    complete = {k for k, v in seen.items() if v in ("FB", "FIW")}
    if len(complete) != chunks * microbatches or len(seen) != len(complete):
        raise ValueError("schedule: not every chunk and microbatch ran forward and backward exactly once")
    for kind in POSTS:
        for chunk, mb in sorted(posted[kind] - taken[kind]):
            raise ValueError(f"schedule: {Action(kind, chunk, mb)!r} posts a receive that no pass takes (chunk "
                             f"{chunk} microbatch {mb})")
        chunks_posted = {chunk for chunk, _ in posted[kind]}
        for chunk, mb in sorted(unposted[kind]):
            if chunk in chunks_posted:
                raise ValueError(f"schedule: chunk {chunk} microbatch {mb} takes its {POSTS[kind]} without a "
                                 f"posted receive ({kind}) while other microbatches of the chunk have one; post "
                                 f"every receive of a kind or none")


def _plain_schedule_passes(actions: Sequence[Action], passes: int) -> bool:
    """Whether `actions` are only F and B, each (chunk, microbatch) forwarded once and then backward once, over
    `passes` distinct pairs: what `check_schedule` accepts of such a list, decided in whole-list sweeps (a
    stage of a long pipeline has thousands of actions, and every stage is checked). False sends the list to
    the step-by-step check, which accepts the other kinds and names the first wrong action."""
    if len(actions) != 2 * passes:
        return False
    kinds, chunk_ids, mbs = zip(*actions) if actions else ((), (), ())
    keys = list(zip(chunk_ids, mbs))
    is_forward, is_backward = list(map(eq, kinds, repeat("F"))), list(map(eq, kinds, repeat("B")))
    forward_at = dict(zip(compress(keys, is_forward), compress(range(len(keys)), is_forward)))
    backward_at = dict(zip(compress(keys, is_backward), compress(range(len(keys)), is_backward)))
    return (len(forward_at) == passes and len(backward_at) == passes  # F and B only, none twice
            and forward_at.keys() == backward_at.keys()
            and all(map(lt, forward_at.values(), map(backward_at.__getitem__, forward_at))))


_NEED = {"F": "", "B": "F", "I": "F", "W": "FI"}  # what a pass of a (chunk, microbatch) comes after
_TAKES = {"F": "PA", "B": "PG", "I": "PG"}  # the post whose receive a pass takes


def _check_post(a: Action, done: str, posted: dict[str, set]) -> None:
    """A posted receive: a known kind, once, and before the pass that takes it."""
    if a.kind not in POSTS:
        raise ValueError(f"schedule: unknown action kind {a.kind!r} in {a!r} (F, B, I, W, {', '.join(MESSAGES)}, "
                         f"{', '.join(EXCHANGES)} or {', '.join(POSTS)})")
    key = (a.chunk, a.mb)
    if key in posted[a.kind]:
        raise ValueError(f"schedule: {a!r} posted twice for chunk {a.chunk} microbatch {a.mb}")
    if done != "" and not (a.kind == "PG" and done == "F"):
        raise ValueError(f"schedule: {a!r} after {done} for chunk {a.chunk} microbatch {a.mb}: a receive is "
                         f"posted before the pass that takes it")
    posted[a.kind].add(key)


def _check_exchange(a: Action, unwaited: dict[str, set]) -> None:
    """An issued receive is remembered until the wait of its kind."""
    what = EXCHANGES[a.kind]
    if a.kind in ("XWA", "XWG"):
        unwaited[what].clear()
    elif a.kind in ("XRA", "XRG"):
        unwaited[what].add((a.chunk, a.mb))
