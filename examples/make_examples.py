"""Write the example Metis-format profiles and cluster description under examples/ from the analytic model.

    python examples/make_examples.py

The profiles describe gpt-350m cut to 4 transformer layers (Metis counts the embedding and the LM head
as layers too, so num_layers is 6) on A100 and T4 at TP 1 and 2 and batch sizes 1, 2 and 4. They are
this project's analytic estimates, not measurements: they exist to exercise the loaders.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from dist_lib.costs import compute as costs  # noqa: E402
from dist_lib.hardware.devices import DEVICES  # noqa: E402
from dist_lib.workload.transformer import Workload  # noqa: E402

WORKLOAD = Workload.parse("gpt-350m:layers=4")
TYPES = {"A100": DEVICES["A100-80GB"], "T4": DEVICES["T4"]}


def profile(device, tp: int, batch: int) -> dict:
    w = WORKLOAD
    layers = [costs.forward_time(device, w, l, batch, tp) + costs.backward_time(device, w, l, batch, tp)
              for l in range(w.num_layers)]
    head = costs.loss_time(device, w, batch, tp)
    embed_params = w.vocab * w.hidden + w.seq_len * w.hidden
    layer_params = 12 * w.hidden**2 + 13 * w.hidden
    params = [2 * embed_params / tp] + [2 * layer_params / tp] * w.num_layers + [2 * w.hidden * w.vocab / tp]
    stash = batch * (w.stash_bytes(1, tp) + w.activation_bytes())
    memory = [16 * p / 2 / 2**20 for p in params]
    memory = [memory[0]] + [m + stash / 2**20 for m in memory[1:-1]] + [memory[-1]]
    return {
        "model": {"model_name": "GPT", "num_layers": w.num_layers + 2,
                  "parameters": {"total_parameters_bytes": sum(params),
                                 "parameters_per_layer_bytes": [round(p) for p in params]}},
        "execution_time": {
            "total_time_ms": round(1e3 * (sum(layers) + head), 4),
            "forward_backward_time_ms": round(1e3 * (sum(layers) + head), 4),
            "batch_generator_time_ms": 0.5,
            "optimizer_time_ms": round(1e3 * costs.update_time(device, sum(params) / 2), 4),
            "layer_compute_total_ms": [0.05] + [round(1e3 * t, 4) for t in layers] + [round(1e3 * head, 4)]},
        "execution_memory": {"total_memory_mb": round(sum(memory), 2),
                             "layer_memory_total_mb": [round(m, 2) for m in memory]},
    }


def main() -> None:
    out = HERE / "profiles"
    out.mkdir(exist_ok=True)
    for name, device in TYPES.items():
        for tp in (1, 2):
            for batch in (1, 2, 4):
                path = out / f"DeviceType.{name}_tp{tp}_bs{batch}.json"
                path.write_text(json.dumps(profile(device, tp, batch), indent=1) + "\n")
    (HERE / "metis" / "hostfile").write_text("10.0.0.1 slots=4\n10.0.0.2 slots=4\n10.0.0.3 4\n")
    cluster = {
        "10.0.0.1": {"instance_type": "A100", "inter_bandwidth": 25, "intra_bandwidth": 300, "memory": 80},
        "10.0.0.2": {"instance_type": "A100", "inter_bandwidth": 25, "intra_bandwidth": 300, "memory": 40},
        "10.0.0.3": {"instance_type": "T4", "inter_bandwidth": 6.25, "intra_bandwidth": 12, "memory": 16},
    }
    (HERE / "metis" / "clusterfile.json").write_text(json.dumps(cluster, indent=1) + "\n")


if __name__ == "__main__":
    main()
