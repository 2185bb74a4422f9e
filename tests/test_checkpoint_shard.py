"""With sequence parallelism and full recompute a checkpointed layer keeps its input as its sequence shard
(Korthikanti et al. 2022, sec. 4.2.2: between layers the activation lives split along the sequence), and the
recompute all-gathers it first."""

from __future__ import annotations

from dist_lib import Workload, simulate, testing

LAYERS = 4
SMALL = Workload.parse(f"gpt-125m:layers={LAYERS},vocab=8192")


def _run(sequence_parallel: bool):
    return simulate("strategies/hybrid.py", "1x2xA100-80GB", SMALL, 2, pp=1, tp=2, microbatch_size=2,
                    recompute=True, sequence_parallel=sequence_parallel)


def _activation_bytes_before_loss(result) -> int:
    """Live activation bytes on rank 0 once every layer's forward ran, before the LM head."""
    return testing.live_bytes_before(result, "loss", "activation")


def test_full_recompute_with_sequence_parallelism_keeps_each_layer_input_as_its_shard():
    # one microbatch of b = 2 samples over t = 2 TP ranks; one sample's layer input is 2*s*h bytes (16-bit).
    # Before the head: the L checkpointed inputs and the last layer's output, whole (b * 2sh).
    b, t, sample = 2, 2, 2 * SMALL.seq_len * SMALL.hidden
    whole = _activation_bytes_before_loss(_run(False))
    assert whole == LAYERS * b * sample + b * sample  # without sequence parallelism each input is kept whole
    assert _activation_bytes_before_loss(_run(True)) == LAYERS * b * sample // t + b * sample


def test_the_recompute_gathers_the_checkpointed_shard_before_rerunning_the_layer():
    result = _run(True)
    gathers = [e for e in result.events if e.rank == 0 and e.op == "all_gather"]
    recomputes = [e for e in result.events if e.rank == 0 and e.op == "forward" and e.detail == "recompute"]
    assert len(recomputes) == LAYERS
    for forward in recomputes:  # a gather of that layer's input ends as its recompute starts
        assert any(g.layer == forward.layer and g.end == forward.start for g in gathers)
    assert result.correct
