"""Record tests/data/kineto_step.json: one training step of a small GPT (2 layers, hidden 64, 2 heads,
sequence 32, vocabulary 128, microbatch 2) on the CPU under the PyTorch profiler, annotated as
`profile --from-trace` requires (docs/how-to/profile-your-gpu.md).

    python tests/data/record_kineto_trace.py        # needs torch (pip install 'dist-sandbox[profile]')
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from dist_lib.hardware.profiling import _Embedding, _Head, _layer_module  # noqa: E402
from dist_lib.workload.transformer import Workload  # noqa: E402

SHAPE = "gpt-350m:layers=2,hidden=64,heads=2,seq=32,vocab=128"


def main() -> None:
    torch.manual_seed(0)
    w = Workload.parse(SHAPE)
    embedding = _Embedding(torch, w, 1, torch.float32, "cpu")
    layers = [_layer_module(torch, w, 1, torch.float32, "cpu") for _ in range(w.num_layers)]
    head = _Head(torch, w, 1, torch.float32, "cpu")
    params = [*embedding.parameters(), *(p for layer in layers for p in layer.parameters()), *head.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)  # one op a step: a small trace
    ids = torch.randint(0, w.vocab, (2, w.seq_len))
    labels = torch.randint(0, w.vocab, (2, w.seq_len))

    def step() -> None:
        with record_function("embedding"):
            x = embedding(ids)
        for i, layer in enumerate(layers):
            with record_function(f"layer.{i}"):
                x = layer(x)
        with record_function("head"):
            loss = head(x, labels)
        loss.backward()
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad()

    step()  # warm-up, not recorded
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    path = HERE / "kineto_step.json"
    prof.export_chrome_trace(str(path))
    path.write_text(json.dumps(json.loads(path.read_text()), separators=(",", ":")))  # the same trace, compact


if __name__ == "__main__":
    main()
