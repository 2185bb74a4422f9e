"""Runs of consecutive layers in one call: a pipeline stage's chunk forward (`forward_layers`) and its plain
backward with the weight gradients summed (`backward_layers`). A mixin of `Model`.

Each op of a run is the op `forward` or `backward` would be on its own, in the same order: the same checks,
costs, events and allocations, and the tensors a run lets go of are freed where a stage's own loop over its
layers frees them. What a run saves is the caller's loop around each op: a stage of a long pipeline issues
its layers' ops at every microbatch, and the C twin (`native/_tensor_ops.c`) walks the run without
returning to Python between ops.
"""

from __future__ import annotations

from typing import Any


class LayerRuns:
    """`forward_layers` and `backward_layers` on a `Model` (which supplies `forward` and `backward`)."""

    __slots__ = ()
    forward: Any
    backward: Any

    def forward_layers(self, layers: range, act: Any, loaded: dict) -> list:
        """`forward(layer, x, weight)` for each of `layers` in order, each on the one before's output, from
        `act`; `loaded` maps each layer to what `load_weights` returned for it, (weight, optimizer state).
        Returns each layer's input, then the last output: the list `backward_layers` takes, once the
        output's gradient replaces the output at its end."""
        xs = [act]
        for layer in layers:
            act = self.forward(layer, act, loaded[layer][0])
            xs.append(act)
        return xs

    def backward_layers(self, layers: range, held: list, loaded: dict, grads: dict) -> Any:
        """`backward(layer, x, grad, weight)` for each of `layers`, the last first: `held` is each layer's
        input (`x`, as `forward_layers` returned them) and, at its end, the gradient of the last layer's
        output; each backward's input gradient is the next one's `grad`. Each weight gradient is summed into
        `grads[layer]` (`grads[layer] + weight_grad`, or kept as it is the first), then the old sum, the
        weight gradient, the input and the output gradient are let go, in that order. `held` ends empty;
        returns the input gradient of `layers[0]`."""
        grad = held.pop()
        for layer in reversed(layers):
            x = held.pop()
            weight_grad, grad_in = self.backward(layer, x, grad, loaded[layer][0])
            total = grads.get(layer)
            grads[layer] = weight_grad if total is None else total + weight_grad
            del total, weight_grad, x  # freed in this order, as a stage's loop over its layers frees them
            grad = grad_in
        return grad
