"""Where a scatter chart's point labels go: boxes that touch no other label, no dot and stay in the frame.

Greedy placement over candidate positions (the classic cartographic approach): the most crowded points
choose first; each tries positions on rings around its dot, nearest ring first, right before left, and
takes the cheapest one whose box is free. A label off its first ring gets a leader line to its dot, and
crossing other labels' leaders costs extra. The SVG has no script to measure text, so a label's box is
estimated from DejaVu Sans' advance widths (the default sans-serif of Linux desktops and of headless
Chromium) with a margin: wider than the text in the common fonts, never narrower.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Advance widths in em (DejaVu Sans, rounded up); anything not listed counts as DEFAULT_EM.
_EM = {
    **dict.fromkeys("fijlrtI!|.,:;'`()[]{} ", 0.42),
    **dict.fromkeys("-/\\", 0.4),
    **dict.fromkeys("mwMW%@", 1.0),
    **dict.fromkeys("=+<>~#&×", 0.84),
    "_": 0.52,
    **dict.fromkeys("ABCDEFGHJKLNOPQRSTUVXYZ", 0.78),
}
DEFAULT_EM = 0.65
ASCENT_EM, DESCENT_EM = 0.95, 0.26  # of the text's box around its baseline
PAD = 2.0  # free pixels kept around every label box
RINGS = 14  # distances tried, RING_STEP apart after the first
RING_STEP = 11.0
MANY = 40  # more dots than this: labels only right beside their dots (no leaders)
MAX_LABELLED = 300  # more than this: no labels at all (they would cover the chart); the dots keep tooltips
# Directions, preferred first: beside the dot, then diagonal, then above and below.
_DIRECTIONS = [(1, 0), (-1, 0), (1, -1), (1, 1), (-1, -1), (-1, 1), (0, -1), (0, 1)]
_FINE = [(math.cos(a), math.sin(a)) for a in (math.radians(d) for d in range(0, 360, 15))]


@dataclass(frozen=True)
class Box:
    x0: float
    y0: float
    x1: float
    y1: float

    def hits(self, other: Box) -> bool:
        return self.x0 < other.x1 and other.x0 < self.x1 and self.y0 < other.y1 and other.y0 < self.y1

    def inside(self, other: Box) -> bool:
        return other.x0 <= self.x0 and self.x1 <= other.x1 and other.y0 <= self.y0 and self.y1 <= other.y1

    def grown(self, by: float) -> Box:
        return Box(self.x0 - by, self.y0 - by, self.x1 + by, self.y1 + by)

    def nearest(self, x: float, y: float) -> tuple[float, float]:
        return min(max(x, self.x0), self.x1), min(max(y, self.y0), self.y1)


@dataclass(frozen=True)
class Placed:
    """A label's text position (start-anchored, at its baseline), its box, and a leader line or None."""

    x: float
    y: float
    box: Box
    leader: tuple[float, float, float, float] | None


def text_width(text: str, size: float) -> float:
    return size * sum(_EM.get(ch, DEFAULT_EM) for ch in text) * 1.04


def place(
    dots: Sequence[tuple[float, float]], labels: Sequence[str], frame: Box, size: float, radius: float
) -> list[Placed | None]:
    """A place for each dot's label; None for a label that has no free place (its dot keeps its tooltip)."""
    if len(dots) > MAX_LABELLED:
        return [None] * len(dots)
    dot_boxes = [Box(x - radius, y - radius, x + radius, y + radius) for x, y in dots]
    many = len(dots) > MANY  # hundreds of labels cannot all be read: only beside their dots, and quick
    order = range(len(dots)) if many else sorted(range(len(dots)), key=lambda i: -_crowding(dots, i))
    obstacles = _Grid()
    for dot in dot_boxes:
        obstacles.add(dot)
    leaders: list[tuple[float, float, float, float]] = []
    out: list[Placed | None] = [None] * len(dots)
    for i in order:
        best: tuple[float, Placed] | None = None
        for cost, placed in _candidates(dots[i], labels[i], size, radius, 1 if many else RINGS):
            if best is not None and cost >= best[0]:
                break  # candidates come in rising base cost: nothing later can win
            padded = placed.box.grown(PAD)
            if not placed.box.inside(frame) or any(padded.hits(b) for b in obstacles.near(padded)):
                continue
            if placed.leader is not None:
                cost += 40 * sum(_crosses(placed.leader, other) for other in leaders)
                cost += 40 * sum(_through(placed.leader, b) for j, b in enumerate(dot_boxes) if j != i)
            if best is None or cost < best[0]:
                best = (cost, placed)
        if best is not None:
            out[i] = best[1]
            obstacles.add(best[1].box)
            if best[1].leader is not None:
                leaders.append(best[1].leader)
    return out


class _Grid:
    """Boxes filed by the CELL-pixel squares they cover: a box is checked against its neighbours only."""

    CELL = 48.0

    def __init__(self) -> None:
        self.cells: dict[tuple[int, int], list[Box]] = {}

    def _keys(self, box: Box) -> list[tuple[int, int]]:
        c = self.CELL
        xs = range(math.floor(box.x0 / c), math.floor(box.x1 / c) + 1)
        return [(x, y) for x in xs for y in range(math.floor(box.y0 / c), math.floor(box.y1 / c) + 1)]

    def add(self, box: Box) -> None:
        for key in self._keys(box):
            self.cells.setdefault(key, []).append(box)

    def near(self, box: Box) -> list[Box]:
        return [b for key in self._keys(box) for b in self.cells.get(key, ())]


def _crowding(dots: Sequence[tuple[float, float]], i: int) -> int:
    x, y = dots[i]
    return sum(1 for j, (u, v) in enumerate(dots) if j != i and abs(u - x) < 80 and abs(v - y) < 30)


def _candidates(
    dot: tuple[float, float], label: str, size: float, radius: float, rings: int
) -> list[tuple[float, Placed]]:
    cx, cy = dot
    width, ascent, descent = text_width(label, size), ASCENT_EM * size, DESCENT_EM * size
    height = ascent + descent
    found: list[tuple[float, Placed]] = []
    for ring in range(rings):
        gap = radius + 3 + ring * RING_STEP
        directions = _DIRECTIONS if ring < 2 else _FINE
        for n, (ux, uy) in enumerate(directions):
            norm = math.hypot(ux, uy)
            ux, uy = ux / norm, uy / norm
            # The box's edge nearest the dot sits `gap` away from it along the direction.
            mid_x = cx + ux * gap + math.copysign(width / 2, ux) * (abs(ux) > 0.3)
            mid_y = cy + uy * gap + math.copysign(height / 2, uy) * (abs(uy) > 0.3)
            box = Box(mid_x - width / 2, mid_y - height / 2, mid_x + width / 2, mid_y + height / 2)
            leader = None
            if ring > 0:
                ex, ey = box.nearest(cx, cy)
                dist = math.hypot(ex - cx, ey - cy) or 1.0
                leader = (cx + (ex - cx) * radius / dist, cy + (ey - cy) * radius / dist, ex, ey)
            found.append((ring * 100 + n, Placed(box.x0, box.y0 + ascent, box, leader)))
    return found


def _crosses(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    def side(p: tuple[float, float], q: tuple[float, float], r: tuple[float, float]) -> float:
        return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])

    p1, p2, q1, q2 = (a[0], a[1]), (a[2], a[3]), (b[0], b[1]), (b[2], b[3])
    return side(p1, p2, q1) * side(p1, p2, q2) < 0 and side(q1, q2, p1) * side(q1, q2, p2) < 0


def _through(segment: tuple[float, float, float, float], box: Box) -> bool:
    """Whether the segment passes through the box (sampled: leaders are short)."""
    x0, y0, x1, y1 = segment
    return any(Box(p, q, p, q).hits(box.grown(0.01)) for p, q in _samples(x0, y0, x1, y1))


def _samples(x0: float, y0: float, x1: float, y1: float) -> list[tuple[float, float]]:
    steps = max(int(math.hypot(x1 - x0, y1 - y0) / 3), 1)
    return [(x0 + (x1 - x0) * k / steps, y0 + (y1 - y0) * k / steps) for k in range(1, steps + 1)]
