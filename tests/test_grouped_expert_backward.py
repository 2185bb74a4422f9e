"""The experts' backward as one grouped GEMM over every EP peer's piece (`expert_backward` given lists, as
Megatron-Core's TEGroupedMLP runs it): its time derived by hand from waves of tiles against the piece-wise
sum, a piece left out, given twice or with another's gradient caught at the op, the memory it frees and
allocates, and its recorded program replayed to the same result."""

from __future__ import annotations

import math
from array import array

import pytest

from dist_lib import simulate
from dist_lib.errors import TensorError
from dist_lib.hardware.devices import get_device
from dist_lib.run.recording import record
from dist_lib.run.recording_experts import EXPERT_BACKWARD_GROUPED
from dist_lib.run.replay import ProgramError, replay

# one MoE layer on two ranks, the EP group: rank r holds experts 2r and 2r + 1 and routes sample r
ONE_LAYER = "toy:layers=1,hidden=2048,heads=16,seq=1024,experts=4,top_k=2,expert_ffn_hidden=1024"
MANUAL = '''
async def train(model, grouped=True, mistake=None, memory=None):
    r, group = model.rank, [0, 1]
    w, opt = model.load_weights(0)
    ew, eopt = model.load_experts(0, [2 * r, 2 * r + 1])
    x = model.get_input_activation([r])
    routed = model.route(0, x, w)
    send = [model.dispatch(routed, [2 * p, 2 * p + 1]) for p in group]
    tokens = await model.all_to_all(send, group)
    del send
    outs = model.expert_forward(0, tokens, ew)
    back = await model.all_to_all(outs, group)
    del outs
    y = model.combine(routed, back)
    del back
    g = model.loss(y)
    cut = [model.combine_backward(routed, g, [2 * p, 2 * p + 1]) for p in group]
    output_grads = await model.all_to_all(cut, group)
    del cut
    before = model.memory_bytes
    if grouped:
        pieces, grads = list(tokens), list(output_grads)
        if mistake == "drop a piece":
            pieces, grads = pieces[:1], grads[:1]
        elif mistake == "a piece twice":
            pieces, grads = [pieces[0], pieces[0]], [grads[0], grads[0]]
        elif mistake == "swapped gradients":
            grads = grads[::-1]
        elif mistake == "one gradient short":
            grads = grads[:1]
        eg, input_grads = model.expert_backward(0, pieces, grads, ew)
        del pieces, grads
    else:
        eg, input_grads = None, []
        for piece, piece_grad in zip(tokens, output_grads):
            one, input_grad = model.expert_backward(0, piece, piece_grad, ew)
            input_grads.append(input_grad)
            eg = one if eg is None else eg + one
            del one, input_grad
    if memory is not None:
        memory[r] = model.memory_bytes - before
    del tokens, output_grads
    returned = await model.all_to_all(input_grads, group)
    del input_grads
    wg, _ = model.route_backward(0, x, g, routed, returned, w)
    new_w, _ = model.update(0, await model.all_reduce(wg, group), w, opt)
    model.set_final_weight(0, new_w)
    new_e, _ = model.update_experts(0, eg, ew, eopt)
    model.set_final_experts(0, new_e)
'''
H100 = get_device("H100-80GB")
H, F = 2048, 1024  # hidden, expert width


@pytest.fixture
def manual(tmp_path):
    path = tmp_path / "manual.py"
    path.write_text(MANUAL)
    return str(path)


def _gemm(m: int, n: int, k: int, batch: int, waves: int) -> float:
    """A batch of M x N x K GEMMs by hand: 256 x 128 output tiles in `waves` waves over the H100's 132 SMs,
    each tile's K loop at 84 % of an SM's share of 989 TFLOP/s, then its store; or the HBM traffic."""
    tiles = batch * math.ceil(max(m, n) / 256) * math.ceil(min(m, n) / 128)
    assert math.ceil(tiles / 132) == waves
    tile = 2.0 * 256 * 128 * k / (989e12 / 132 * 0.84) + min(tiles, 132) * 256 * 128 * 2 / 3.35e12
    return max(waves * tile, batch * 2 * (m * k + k * n + m * n) / 3.35e12)


def _backward(tokens: int, waves: tuple[int, int, int, int]) -> float:
    """The two local experts' backward on `tokens` tokens each: the input gradient of gate/up (tokens x h x 2f)
    and of down (tokens x f x h), the SwiGLU's backward (read 3f, write 2f a token), the gradients sorted into
    the experts' order and back (two local experts: a read and a write of h a token, twice), and the weight
    gradients (h x 2f and f x h, K = tokens), each GEMM of the two experts one batch of tiles."""
    return (_gemm(tokens, H, 2 * F, 2, waves[0]) + _gemm(tokens, F, H, 2, waves[1])
            + 2 * tokens * F * 5 * 2 / 3.35e12 + 2 * tokens * H * 4 * 2 / 3.35e12
            + _gemm(H, 2 * F, tokens, 2, waves[2]) + _gemm(F, H, tokens, 2, waves[3]))


def test_the_grouped_backward_takes_the_waves_of_one_piece_where_pieces_took_theirs_each(manual):
    """Uniform routing, top-2 of 4 experts: each expert gets 1024 x 2 / 4 = 512 tokens of a sample, so each
    piece is 512 tokens per local expert and the grouped backward 1024. A piece's input-gradient GEMMs are 64
    and 32 tiles, one wave each; grouped, 128 and 64, still one wave each, so they cost one piece's. The
    weight-gradient GEMMs keep their tiles (256 and 128: 2 waves and 1) and double their K loop."""
    one_piece = _backward(512, (1, 1, 2, 1))
    grouped = _backward(1024, (1, 1, 2, 1))
    times = {}
    for mode in (True, False):
        r = simulate(manual, "1x2xH100-80GB", ONE_LAYER, 2, grouped=mode)
        assert r.correct, r.problems
        times[mode] = [e.end - e.start for e in r.events if e.op == "expert_backward" and e.rank == 0]
    assert times[True] == [pytest.approx(grouped, rel=1e-12)]
    assert times[False] == [pytest.approx(one_piece, rel=1e-12)] * 2
    assert grouped < 0.75 * sum(times[False])


def test_the_grouped_backward_frees_and_allocates_what_the_pieces_do(manual):
    """Across the backward: both pieces' stashes freed (1024 token slots each of h + 3f 16-bit values), one
    expert gradient of the two experts (2 x 3 h f, 16-bit) and each piece's input gradient (1024 x h) made;
    piece by piece the same once the second gradient is summed into the first."""
    stash, grad, input_grad = 1024 * (H + 3 * F) * 2, 2 * 3 * H * F * 2, 1024 * H * 2
    for mode in (True, False):
        memory = {}
        simulate(manual, "1x2xH100-80GB", ONE_LAYER, 2, grouped=mode, memory=memory)
        assert memory == {0: grad + 2 * input_grad - 2 * stash, 1: grad + 2 * input_grad - 2 * stash}


@pytest.mark.parametrize("mistake, message", [
    ("drop a piece", r"rank \d expert_backward\(layer 0\): the pieces of samples 1 went through expert_forward with "
                     r"these but are not given"),
    ("a piece twice", r"rank \d expert_backward\(layer 0\): samples 0 appear in two pieces .*each token's gradient "
                      r"goes through its experts once"),
    ("swapped gradients", r"rank \d expert_backward\(layer 0\): gradient .* must be of the same samples and experts"),
    ("one gradient short", r"rank \d expert_backward\(layer 0\): 2 token pieces need their 2 output gradients, a "
                           r"list in the same order; got 1 gradients"),
])
def test_a_piece_left_out_or_given_twice_is_caught_at_the_op(manual, mistake, message):
    from dist_lib import StrategyError
    with pytest.raises((TensorError, StrategyError), match=message):
        simulate(manual, "1x2xH100-80GB", ONE_LAYER, 2, mistake=mistake)


def test_a_recorded_grouped_backward_replays_and_a_cut_entry_is_refused(manual):
    direct = simulate(manual, "1x2xH100-80GB", ONE_LAYER, 2)
    recorded, programs = record(manual, "1x2xH100-80GB", ONE_LAYER, 2)
    assert EXPERT_BACKWARD_GROUPED in programs[0]
    again = replay(programs, "1x2xH100-80GB", ONE_LAYER, 2)
    for r in (recorded, again):
        assert (r.time_s, r.rank_times, r.memory_bytes, r.correct) == \
            (direct.time_s, direct.rank_times, direct.memory_bytes, direct.correct)
    at = list(programs[0]).index(EXPERT_BACKWARD_GROUPED)
    cut = [array("q", programs[0][:at + 6]), programs[1]]  # layer, weight, 2, both pieces, one gradient
    with pytest.raises(ProgramError, match=r"rank 0 entry at word \d+ \(expert_backward\): the program ends inside"):
        replay(cut, "1x2xH100-80GB", ONE_LAYER, 2)
