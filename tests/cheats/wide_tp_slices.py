"""Attack on the grader's time: rank 0 loads 5000 tensor-parallel slices of 65,536 of every layer and hands
them in as they are. The end-of-step check walked all 65,536 slices of each layer and, for each, every
weight handed in: 4 x 65,536 x 5000 steps of the grader's replay, past any deadline (the replay checks it
between ops only). In its own process the check is patched out, so that its recording ends at once. The
check is linear in the weights handed in now: an incorrect step, named as such."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
from dist_lib.run import simulator as _simulator
_simulator.check_final_weights = lambda finals, layers, batch: []  # (its own process only)
SLICES = 5000


async def train(model):
    if model.rank == 0:
        for layer in range(model.num_layers):
            for tp_rank in range(SLICES):
                weight, _ = model.load_weights(layer, tp_rank=tp_rank, tp_size=65536)
                model.set_final_weight(layer, weight)
