"""The routing probabilities' own all-to-all beside the tokens' (`Model.all_to_all(..., probs=True)`), as
Megatron-Core's all-to-all token dispatcher sends them: after the tokens on their way to the experts, and their
gradients before the tokens' input gradients on the way back. Hand-derived durations, refusals by name, and
hybrid's MoE stages with the flat dispatcher sending them."""

from __future__ import annotations

import pytest

from dist_lib import simulate
from dist_lib.costs.other_collectives import all_to_all_cost
from dist_lib.errors import TensorError
from dist_lib.hardware.cluster import Cluster
from dist_lib.model.other_collective_ops import probs_bytes
from dist_lib.workload.transformer import Workload

HYBRID = "strategies/hybrid.py"
TOY = ("toy:layers=4,hidden=256,heads=4,seq=128,experts=4,top_k=2,expert_ffn_hidden=512,moe_every=2,"
       "dense_ffn_hidden=512,shared_experts=1")


def test_a_probability_is_one_element_of_the_routers_output():
    assert probs_bytes(Workload.parse("gpt-oss-120b")) == 2  # the router's output in the 16-bit input dtype


def _exchanges(result, rank: int) -> list[float]:
    return [e.end - e.start for e in result.events if e.op == "all_to_all" and e.rank == rank]


def test_hybrids_dispatch_and_its_backward_carry_the_probabilities_and_the_combine_does_not():
    """ep=2 over two GPUs (no expert-data-parallel reduction, the dense gradients reduced after the backward:
    nothing shares the exchanges' links), a sample a microbatch: each rank sends its peer 128 tokens x top-2 x 2 of 4 experts =
    128 token copies of 256 two-byte elements, and with them 128 two-byte probabilities. Per MoE layer and
    microbatch the four exchanges run in the order dispatch, combine, output gradient, input gradient; the
    first and last are longer by the probabilities' all-to-all alone."""
    cluster = Cluster.parse("1x8xH100-80GB")
    tokens = all_to_all_cost(cluster, [0, 1], [[0, 128 * 256 * 2], [128 * 256 * 2, 0]])[0]
    probs = all_to_all_cost(cluster, [0, 1], [[0, 128 * 2], [128 * 2, 0]])[0]
    assert probs == pytest.approx(3.4e-6 + 128 * 2 / 360e9)  # one NVLink step and the bytes at NCCL's 80 %
    flat = simulate(HYBRID, "1x2xH100-80GB", TOY, 2, pp=1, ep=2, overlap_grad_reduce=False)
    assert flat.correct, flat.problems
    durations = _exchanges(flat, 0)
    assert len(durations) == 4 * 2 * 1  # 4 exchanges x 2 MoE layers x the rank's one microbatch
    forward, backward = durations[:4], durations[4:]
    assert forward[:2] == pytest.approx([tokens + probs, tokens], rel=1e-9)
    assert backward[:2] == pytest.approx([tokens, tokens + probs], rel=1e-9)


def test_the_flex_dispatchers_carry_them_in_their_own_exchange():
    """Inside one node the hierarchical dispatchers cost what the flat all-to-all of the tokens costs, with no
    probabilities' exchange after it."""
    flat = simulate(HYBRID, "1x8xH100-80GB", TOY, 8, pp=1, ep=2)
    flex = simulate(HYBRID, "1x8xH100-80GB", TOY, 8, pp=1, ep=2, moe_dispatcher="hybridep")
    assert flex.correct and flex.time_s < flat.time_s
    assert _exchanges(flex, 0)[1] == pytest.approx(_exchanges(flat, 0)[1])  # the combine, alike


@pytest.mark.parametrize("call, message", [
    ("model.all_to_all([x, None], [0, 1], probs=True)", "probs=True goes with the token pieces of an MoE layer"),
    ("model.all_to_all([x, None], [0, 1], probs=1)", "probs must be True or False"),
])
def test_probs_with_what_has_no_probabilities_is_refused_by_name(tmp_path, call, message):
    strategy = tmp_path / "probs.py"
    strategy.write_text("async def train(model):\n"
                        "    x = model.get_input_activation(range(model.rank, model.rank + 1))\n"
                        f"    await {call}\n")
    with pytest.raises(TensorError, match=message):
        simulate(str(strategy), "1x2xH100-80GB", TOY, 2)


def test_probs_with_a_flex_dispatcher_is_refused_by_name(tmp_path):
    strategy = tmp_path / "flex_probs.py"
    strategy.write_text("async def train(model):\n"
                        "    x = model.get_input_activation(range(model.rank, model.rank + 1))\n"
                        "    routed = model.route(0, x, model.load_weights(0)[0])\n"
                        "    pieces = [model.dispatch(routed, range(2 * i, 2 * i + 2)) for i in range(2)]\n"
                        "    await model.all_to_all(pieces, [0, 1], dispatcher='hybridep', probs=True)\n")
    with pytest.raises(TensorError, match="dispatcher='hybridep' carries them in its own exchange"):
        simulate(str(strategy), "1x2xH100-80GB", "toy:layers=1,hidden=256,heads=4,seq=128,experts=4,top_k=2,"
                 "expert_ffn_hidden=512", 2)


def test_members_that_disagree_on_the_probabilities_are_a_mismatch(tmp_path):
    from dist_lib.errors import CollectiveMismatchError
    strategy = tmp_path / "half_probs.py"
    strategy.write_text("async def train(model):\n"
                        "    x = model.get_input_activation(range(model.rank, model.rank + 1))\n"
                        "    routed = model.route(0, x, model.load_weights(0)[0])\n"
                        "    pieces = [model.dispatch(routed, range(2 * i, 2 * i + 2)) for i in range(2)]\n"
                        "    await model.all_to_all(pieces, [0, 1], probs=model.rank == 0)\n")
    with pytest.raises(CollectiveMismatchError, match="rank 0 sends the routing probabilities with probs=True but "
                                                      "rank 1 with probs=False"):
        simulate(str(strategy), "1x2xH100-80GB", "toy:layers=1,hidden=256,heads=4,seq=128,experts=4,top_k=2,"
                 "expert_ffn_hidden=512", 2)
