"""Interleaved 1F1B over padded layers (`interleaved.padded_partition`): the layout Qi et al. 2024 ran their
1F1B-I baseline in, with the first stage's first chunk and the last stage's last chunk holding no layer."""

from __future__ import annotations

import pytest

from dist_lib import Workload, simulate
from dist_lib.errors import StrategyError
from strategies.interleaved import padded_partition


def test_padding_is_taken_from_the_last_block_then_the_first():
    # 62 layers on 32 stages x 2 chunks: padded to 64, one layer a chunk, blocks 0 and 63 empty
    blocks = padded_partition(62, 32, 2)
    assert [len(b) for b in blocks] == [0] + [1] * 62 + [0]
    assert blocks[0] == range(0, 0) and blocks[1] == range(0, 1) and blocks[63] == range(62, 62)
    # 10 layers on 4 stages of one chunk: 12 padded, 3 a stage, the last then the first one fewer
    assert padded_partition(10, 4, 1) == [range(0, 2), range(2, 5), range(5, 8), range(8, 10)]
    # 5 layers on 4 stages x 2 chunks: three padding layers, off the last block, then the first two
    assert [len(b) for b in padded_partition(5, 4, 2)] == [0, 0, 1, 1, 1, 1, 1, 0]
    # no padding needed: every block the same
    assert padded_partition(8, 4, 2) == [range(k, k + 1) for k in range(8)]


def test_chunks_that_do_not_divide_a_padded_stage_are_refused():
    # 6 layers on 4 stages pad to 8, 2 a stage, which 3 chunks do not split (the runtime asserts so)
    with pytest.raises(ValueError, match="choose chunks dividing 2"):
        padded_partition(6, 4, 3)


def test_an_empty_chunk_passes_its_input_on():
    # 6 layers, 4 stages x 2 chunks: blocks 0 and 7 empty; 4 microbatches of 2. Each microbatch crosses
    # every one of the 7 boundaries between the 8 virtual stages forward and backward, the empty chunks
    # included (Megatron-LM's no-op layer hands its input on), so 4 x 7 x 2 = 56 messages; rank 0 runs
    # one layer (block 4) and rank 3 one (block 3), ranks 1 and 2 two each: 4 forwards a layer
    workload = Workload("pad", 6, 256, 4, 128, 1000)
    result = simulate("strategies/interleaved.py", "1x4xA100-80GB", workload, 8, microbatch_size=2, pp=4,
                      chunks=2, partition=padded_partition(6, 4, 2))
    assert result.correct, result.problems
    assert len({e.op_id for e in result.events if e.stream == "p2p"}) == 56
    forwards = [sum(1 for e in result.events if e.rank == r and e.op == "forward") for r in range(4)]
    assert forwards == [4, 8, 8, 4]
    # an explicit empty block must be an empty range at its place; a count of 0 is refused
    with pytest.raises(StrategyError, match="every block needs at least one layer"):
        simulate("strategies/interleaved.py", "1x4xA100-80GB", workload, 8, microbatch_size=2, pp=4, chunks=2,
                 partition=[0, 1, 1, 1, 1, 1, 1, 0])
