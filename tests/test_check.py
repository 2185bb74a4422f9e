"""The end-of-step check over hand-built `HandedIn` records: each problem it names, and silence for a
correct step."""

from dist_lib.model.correctness import HandedIn, check_final_weights, check_kept

EVERY = 0b1111  # a global batch of 4 samples


def record(rank=0, layer=0, step=1, samples=EVERY, shards=1, num_shards=1, tp_rank=0, tp_size=1) -> tuple:
    return tuple(HandedIn(rank, layer, step, samples, shards, num_shards, tp_rank, tp_size))


def test_a_correct_step_has_no_problems_whichever_way_it_is_split():
    replicas = [record(rank=r, layer=layer) for r in range(4) for layer in range(2)]  # DDP
    zero = [record(rank=r, layer=layer, shards=1 << r, num_shards=4) for r in range(4) for layer in range(2)]
    tp = [record(rank=r, layer=layer, tp_rank=r, tp_size=2) for r in range(2) for layer in range(2)]
    for finals in (replicas, zero, tp):
        assert check_final_weights(finals, 2, 4) == []


def test_each_wrong_update_is_named_with_its_rank():
    finals = [record(rank=0, step=0), record(rank=1, step=2), record(rank=2, samples=0b0101), record(rank=3)]
    assert check_final_weights(finals, 1, 4) == [
        "layer 0: rank 0 handed in a weight that was never updated",
        "layer 0: rank 1 handed in a weight updated 2 times",
        "layer 0: rank 2's weight was updated with gradients of samples 0, 2, missing 1, 3",
    ]


def test_missing_layers_slices_and_shards_are_named():
    assert check_final_weights([record(layer=1)], 2, 4) == [
        "layer 0: no rank handed in its final weight (call set_final_weight)"]
    assert check_final_weights([record(tp_rank=1, tp_size=2)], 1, 4) == [
        "layer 0 TP slice 0/2: no rank handed in this tensor-parallel slice"]
    assert check_final_weights([record(tp_size=2), record(rank=1, tp_size=4)], 1, 4) == [
        "layer 0: final weights mix tensor-parallel degrees [2, 4]"]
    assert check_final_weights([record(shards=0b01, num_shards=2), record(rank=1, shards=0b010, num_shards=3)],
                               1, 4) == ["layer 0: final shards use different shard counts [2, 3]"]
    assert check_final_weights([record(shards=0b0011, num_shards=4), record(rank=1, shards=0b0100, num_shards=4)],
                               1, 4) == ["layer 0: ZeRO shards 3 of 4 were never handed in"]


def test_a_rank_hands_in_every_part_of_a_layer_it_loaded():
    """Parts of a layer as spans of [0, 1): TP slice t of T is [t/T, (t+1)/T), ZeRO shard i of n of it its
    i-th n-th. Records: (layer, shards, num_shards, tp_rank, tp_size) loaded; handed-in ones are `HandedIn`."""
    def handed(rank, shards, num_shards, tp_rank=0, tp_size=1, layer=0):
        return (rank, layer, 1, 0, shards, num_shards, tp_rank, tp_size)

    whole = (0, 0b1, 1, 0, 1)
    assert check_kept([[whole]], [handed(0, 0b1, 1)]) == []
    # shard 0 of 2 is [0, 1/2): shards 0 and 1 of 4 cover it; shard 1 of 2, [1/2, 1), is not inside shard 2 of 4
    assert check_kept([[(0, 0b1, 2, 0, 1)]], [handed(0, 0b11, 4)]) == []
    assert check_kept([[(0, 0b10, 2, 0, 1)]], [handed(0, 0b100, 4)]) != []
    # shard 0 of 3, [0, 1/3), is inside shard 0 of 2; shard 1 of 3, [1/3, 2/3), is not
    assert check_kept([[(0, 0b1, 3, 0, 1)]], [handed(0, 0b1, 2)]) == []
    assert check_kept([[(0, 0b10, 3, 0, 1)]], [handed(0, 0b1, 2)]) != []
    # TP slice 1 of 2 whole is [1/2, 1): its two ZeRO shards cover it, slice 0's do not
    assert check_kept([[(0, 0b1, 1, 1, 2)]], [handed(0, 0b1, 2, 1, 2), handed(0, 0b10, 2, 1, 2)]) == []
    assert check_kept([[(0, 0b1, 1, 1, 2)]], [handed(0, 0b11, 2, 0, 2)]) != []
    # loaded whole, handed in a shard: ZeRO-2 without the all-gather of the updated shards
    assert check_kept([[whole], [whole]], [handed(0, 0b1, 2), handed(1, 0b10, 2)]) == [
        f"layer 0: rank {rank} loaded the whole layer but handed in ZeRO shard {rank} of 2: a rank ends the step "
        f"holding, updated, every weight it loaded (with ZeRO-1/2, all_gather the updated shards and hand in the "
        f"whole)" for rank in (0, 1)]
    # another rank's hand-in is not this rank's; a layer not loaded asks nothing
    assert check_kept([[whole], []], [handed(1, 0b1, 1)])[0].startswith(
        "layer 0: rank 0 loaded the whole layer but handed in nothing of it")
    assert len(check_kept([[whole]] * 30, [])) == 21 and check_kept([[whole]] * 30, [])[-1] == "... and 10 more"


def test_a_piece_handed_in_exactly_counts_only_for_its_own_rank_and_layer():
    """Ranks that hand in exactly the pieces they loaded pass at once; the others are still looked at piece
    by piece, with the records in any order (a split step's ranks come back interleaved)."""
    def handed(rank, layer, shards=0b1, num_shards=1):
        return (rank, layer, 1, 0, shards, num_shards, 0, 1)

    whole = (0, 0b1, 1, 0, 1)
    # rank 0 exact; rank 1 covers the whole with two shards; rank 2 hands in the same piece of layer 1 only
    finals = [handed(1, 0, 0b10, 2), handed(0, 0), handed(2, 1), handed(1, 0, 0b01, 2), handed(0, 1)]
    assert check_kept([[whole], [whole], [whole]], finals) == [
        "layer 0: rank 2 loaded the whole layer but handed in nothing of it: a rank ends the step holding, "
        "updated, every weight it loaded (with ZeRO-1/2, all_gather the updated shards and hand in the whole)"]
    # rank 0's records split in two runs by another rank's: both count
    assert check_kept([[whole, (1, 0b1, 1, 0, 1)]], [handed(0, 0), handed(1, 1), handed(0, 1)]) == []
    # a generator of records is read once
    assert check_kept([[whole]], iter([handed(0, 0)])) == []


def test_kept_pieces_are_found_in_time_linear_in_the_records():
    """tests/cheats/slow_kept_check.py's shape, larger: a rank hands in the whole layer and 3000 tiny ZeRO
    pieces of it (shard 0 of 65536, 65535, ...) and loaded 3000 more it never handed in (shard 1 of each).
    Each loaded piece is inside the whole: no problem. Comparing each with every piece handed in, shard by
    shard, took about 2 ms a pair (hours here); merged once, the check takes well under a second."""
    import time
    count = 3000
    handed = [(0, 0, 1, 0, 0b1, 1, 0, 1)] + [(0, 0, 1, 0, 0b1, 65536 - i, 0, 1) for i in range(count)]
    loaded = [[(0, 0b1, 1, 0, 1)] + [(0, 0b10, 65536 - i, 0, 1) for i in range(count)]]
    started = time.process_time()
    assert check_kept(loaded, handed) == []
    assert time.process_time() - started < 5
    # without the whole, shard 1 of 65536 - i is [1/(65536-i), 2/(65536-i)), not inside the shards 0 handed in
    # (the widest of which, of 62537, ends at 1/62537): all 3000 are missing
    problem = check_kept(loaded, handed[1:])
    assert len(problem) == 1 and problem[0].startswith("layer 0: rank 0 loaded the whole layer and ZeRO shard 1 of "
                                                       "65536 and ZeRO shard 1 of 65535")


def test_runs_of_shards_are_spans():
    from dist_lib.tensors import describe_mask, mask_runs
    assert mask_runs(0b1101) == [(0, 1), (2, 4)]
    assert mask_runs(0) == [] and mask_runs(0b1) == [(0, 1)] and mask_runs((1 << 70) - 1 << 3) == [(3, 73)]
    assert describe_mask(0b11110110) == "1-2, 4-7" and describe_mask(0) == "none"
    assert describe_mask((1 << 70) - 1 << 3 | 1) == "0, 3-72"


def test_missing_tp_slices_are_one_line_and_the_check_is_linear_in_what_was_handed_in():
    """tests/cheats/wide_tp_slices.py's shape: 20000 slices of 65536 handed in, never updated. The check
    walked all 65536 slices and, for each, every weight (1.3e9 steps here); now each weight is looked at
    once, and the 45536 slices no one handed in are one line."""
    import time
    count = 20000
    finals = [record(step=0, tp_rank=t, tp_size=65536) for t in range(count)]
    started = time.process_time()
    problems = check_final_weights(finals, 1, 4)
    assert time.process_time() - started < 5
    assert problems[:count] == ["layer 0: rank 0 handed in a weight that was never updated"] * count
    assert problems[count:] == ["layer 0: no rank handed in tensor-parallel slices 20000-65535 of 65536"]
    # two of three slices handed in, the third not
    assert check_final_weights([record(tp_rank=0, tp_size=3), record(tp_rank=2, tp_size=3)], 1, 4) == [
        "layer 0 TP slice 1/3: no rank handed in this tensor-parallel slice"]
