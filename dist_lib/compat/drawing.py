"""The puzzles' `drawing.py`, drawn as SVG with no plotting dependency.

`draw(models)` prints the figures the original prints (the time axis, the peak memory and where it
happened) and returns the diagram: one timeline row per rank (forward boxes coloured by layer,
backward pale, updates yellow, collectives half-tone, passes grey), then one memory row per rank
with the peak marked. `draw_network` draws the network with one tensor shaded, as the tensors'
`draw()` does; `draw_group` overlays a dict of tensors on one network. Every picture has
`_repr_svg_`, so a notebook shows it, and `save(path)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, FrozenSet, Optional, Sequence
from xml.sax.saxutils import escape


@dataclass(frozen=True)
class Box:
    x: float
    y: float
    w: float
    h: float
    fill: str = "none"
    opacity: float = 1.0
    stroke: str = "none"
    label: str = ""


@dataclass
class Picture:
    """Boxes in diagram units; `a + b` overlays b on a."""

    boxes: list[Box] = field(default_factory=list)
    scale: float = 20.0  # pixels per unit

    def __add__(self, other: Picture) -> Picture:
        return Picture(self.boxes + other.boxes, self.scale)

    def svg(self) -> str:
        if not self.boxes:
            return '<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>'
        left = min(b.x for b in self.boxes)
        top = min(b.y for b in self.boxes)
        width = max(b.x + b.w for b in self.boxes) - left
        height = max(b.y + b.h for b in self.boxes) - top
        k = self.scale
        parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width * k:.0f}" height="{height * k:.0f}" '
                 f'viewBox="{left * k:.1f} {top * k:.1f} {width * k:.1f} {height * k:.1f}">']
        for b in self.boxes:
            parts.append(f'<rect x="{b.x * k:.2f}" y="{b.y * k:.2f}" width="{max(b.w, 0) * k:.2f}" '
                         f'height="{max(b.h, 0) * k:.2f}" fill="{b.fill}" fill-opacity="{b.opacity}" '
                         f'stroke="{b.stroke}" stroke-width="1"/>')
            if b.label:
                parts.append(f'<text x="{(b.x + 0.1) * k:.2f}" y="{(b.y + b.h * 0.75) * k:.2f}" '
                             f'font-size="{0.6 * k:.1f}" font-family="sans-serif">{escape(b.label)}</text>')
        parts.append("</svg>")
        return "\n".join(parts)

    def _repr_svg_(self) -> str:
        return self.svg()

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            f.write(self.svg())


def layer_colours(layers: int) -> list[str]:
    """Green to red in `layers + 1` steps (the original's colour ramp)."""
    steps = max(layers, 1)
    out = []
    for i in range(layers + 1):
        t = i / steps
        out.append(f"rgb({int(255 * t)},{int(160 * (1 - t))},0)")
    return out


def peak(models: Sequence[Any]) -> tuple[float, Optional[tuple[int, float]]]:
    """The largest memory any event recorded and (rank index, time) of the first such event."""
    best, where = 0, None
    for i, m in enumerate(models):
        for e in m.log:
            if e.memory > best:
                best, where = e.memory, (i, e.time)
    return best, where


def draw(models: Sequence[Any]) -> Picture:
    """The timeline and memory diagram of a run; prints the time axis and peak as the original."""
    models = list(models)
    layers = getattr(models[0], "LAYERS", None) or getattr(models[0], "num_layers", 1)
    colours = layer_colours(layers)
    max_time = max(m.log[-1].time for m in models)
    max_mem, where = peak(models)
    print(f"Timesteps: {max_time} \nMaximum Memory: {max_mem} at GPU: {where[0] if where else None} "
          f"time: {where[1] if where else None}")
    unit = 2.0  # horizontal units per step, as the original
    picture = Picture()
    n = len(models)
    for row, m in enumerate(models):
        picture.boxes.append(Box(0, row, unit * (max_time + 1), 1, "lightgrey", label=str(row)))
        for e in m.log:
            length = getattr(e, "length", getattr(e, "duration", 0))
            batches = getattr(e, "batches", getattr(e, "samples", ()))
            x, w = unit * e.time, max(unit * length - 0.05, 0)
            colour = colours[e.layer] if isinstance(e.layer, int) and 0 <= e.layer <= layers else "grey"
            if e.typ == "forward":
                picture.boxes.append(Box(x, row + 0.05, w, 0.9, colour, label=" ".join(map(str, batches))))
            elif e.typ == "backward":
                picture.boxes.append(Box(x, row + 0.05, w, 0.9, colour, 0.2, label=" ".join(map(str, batches))))
            elif e.typ == "update":
                picture.boxes.append(Box(x, row + 0.05, w, 0.9, "yellow", 0.5))
            elif e.typ in ("allreduce", "scatterreduce", "allgather", "all_reduce", "reduce_scatter", "all_gather"):
                picture.boxes.append(Box(x, row + 0.05, w, 0.9, colour, 0.5))
            elif e.typ in ("pass", "send", "recv"):
                picture.boxes.append(Box(x, row + 0.05, w, 0.9, "grey", 0.5))
    for row, m in enumerate(models):
        y = n + row
        picture.boxes.append(Box(0, y, unit * (max_time + 1), 1, "white", stroke="lightgrey"))
        for e in m.log:
            length = getattr(e, "length", getattr(e, "duration", 0))
            h = e.memory / (1.5 * max_mem) if max_mem else 0
            picture.boxes.append(Box(unit * e.time, y + 1 - h, unit * length, h, "grey"))
        if where and row == where[0]:
            picture.boxes.append(Box(unit * where[1], y, 0.1, 1, "red"))
    return picture


def draw_network(layers: int, weight: Optional[int] = None, before: int = -1, after: int = 100,
                 shards: FrozenSet[int] = frozenset({}), total: int = 1, batches: FrozenSet[int] = frozenset({0}),
                 total_batches: int = 1, is_grad: bool = False) -> tuple[Picture, Picture]:
    """(the network's outline, the shaded parts): layer `weight`'s shards (pale for a gradient), the
    connection entering layer `before` or leaving layer `after`, split by batch."""
    colours = layer_colours(layers)
    base, overlay = Picture(), Picture()
    width = 3.0
    for level in range(layers + 1):
        y = 2.0 * (layers - level)  # layer 0 at the bottom
        height = 1.0 if level < layers else 0.0
        if height:
            base.boxes.append(Box(0, y, width, height, "none", stroke="black"))
        base.boxes.append(Box(0.75, y + height, 1.5, 1.0, "none", stroke="black"))
        if level == weight:
            shard_h, shard_w = height / total, width / total_batches
            for shard in shards:
                for batch in batches:
                    overlay.boxes.append(Box(batch * shard_w, y + shard * shard_h, shard_w, shard_h, colours[level],
                                             0.5 if is_grad else 1.0, stroke="white"))
        if level == before or level == after + 1:
            slot = 1.5 / total_batches
            for batch in batches:
                overlay.boxes.append(Box(0.75 + batch * slot, y + height, slot, 1.0, colours[level],
                                         1.0 if level == before else 0.5, stroke="white"))
    return base, overlay


def draw_group(group: dict) -> Picture:
    """Every tensor of a storage dict shaded on one network."""
    tensors = list(group.values())
    picture = tensors[0].draw()[0]
    for t in tensors:
        picture = picture + t.draw()[1]
    return picture
