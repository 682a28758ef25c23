"""Small inline-SVG charts for the HTML report: lines over steps or time, and a labelled scatter.

Our own few hundred lines instead of a plotting library: the report must open anywhere (no network,
no CDN, no JavaScript) and `jobgen report` must run on a login node without matplotlib. Every text that
came from a run passes through html.escape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from jobgen.results.labels import Box, place, text_width

# Colour-blind-safe (Okabe-Ito, then Tableau); cycles for larger sweeps.
PALETTE = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#D55E00",
    "#CC79A7",
    "#56B4E9",
    "#F0E442",
    "#000000",
    "#4E79A7",
    "#F28E2B",
    "#59A14F",
    "#E15759",
    "#B07AA1",
    "#76B7B2",
    "#EDC948",
    "#9C755F",
)

WIDTH, HEIGHT = 600, 320
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 34, 46
POINT_FONT, DOT_RADIUS = 11, 6  # px; the report's CSS gives svg .point the same font size


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]
    color: str


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def time_unit(max_seconds: float) -> tuple[float, str]:
    """(divisor, unit) that keeps times readable: seconds under 2 minutes, minutes under 2 hours, else hours."""
    if max_seconds < 120:
        return 1.0, "s"
    if max_seconds < 7200:
        return 60.0, "min"
    return 3600.0, "h"


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high] (1, 2, 2.5 or 5 times a power of ten apart)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0, 1.0]
    if high <= low:
        pad = abs(low) * 0.05 or 0.5
        low, high = low - pad, high + pad
    raw = (high - low) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    start = math.floor(low / step) * step
    ticks = [round(start, 10)]
    while ticks[-1] < high - step * 1e-9:
        ticks.append(round(start + len(ticks) * step, 10))
    return ticks


def zoomed_range(
    values: Sequence[float], floor: float | None = None, ceiling: float | None = None
) -> tuple[float, float]:
    """An axis range around the values with a margin, clipped to [floor, ceiling]: differences of a
    fraction of a percent stay visible instead of sitting flat at the top of a 0-100 axis."""
    low, high = min(values), max(values)
    span = high - low or max(abs(high) * 0.02, 0.5)
    low, high = low - span * 0.25, high + span * 0.25
    if floor is not None:
        low = max(low, floor)
    if ceiling is not None:
        high = min(high, ceiling)
    return low, high


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.6g}"


class _Frame:
    """Maps data to pixels and draws the axes, grid and labels."""

    def __init__(self, xs: tuple[float, float], ys: tuple[float, float], width: int, height: int) -> None:
        self.xt, self.yt = nice_ticks(*xs), nice_ticks(*ys)
        self.x0, self.x1 = min(self.xt[0], xs[0]), max(self.xt[-1], xs[1])
        self.y0, self.y1 = min(self.yt[0], ys[0]), max(self.yt[-1], ys[1])
        self.width, self.height = width, height
        # Room for the widest y tick label between the rotated axis label and the frame.
        self.left = max(LEFT, round(22 + 6 + max(text_width(_fmt(t), POINT_FONT) for t in self.yt)))
        # and for half the last x tick label, centred on the frame's right edge.
        self.right = max(RIGHT, round(text_width(_fmt(self.xt[-1]), POINT_FONT) / 2 + 4))

    def x(self, value: float) -> float:
        return self.left + (value - self.x0) / ((self.x1 - self.x0) or 1) * (self.width - self.left - self.right)

    def y(self, value: float) -> float:
        return self.height - BOTTOM - (value - self.y0) / ((self.y1 - self.y0) or 1) * (self.height - TOP - BOTTOM)

    def axes(self, title: str, xlabel: str, ylabel: str) -> list[str]:
        w, h, left, right = self.width, self.height, self.left, self.right
        out = [f'<text x="{w / 2:.0f}" y="20" class="title">{escape(title)}</text>']
        for t in self.yt:
            y = self.y(t)
            out.append(f'<line x1="{left}" x2="{w - right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
            out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_fmt(t)}</text>')
        for t in self.xt:
            x = self.x(t)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{h - BOTTOM}" class="grid"/>')
            # Below the lowest y tick label, which hangs under the frame: the two never touch at the corner.
            out.append(f'<text x="{x:.1f}" y="{h - BOTTOM + 19}" class="tick" text-anchor="middle">{_fmt(t)}</text>')
        out.append(f'<rect x="{left}" y="{TOP}" width="{w - left - right}" height="{h - TOP - BOTTOM}" class="frame"/>')
        out.append(f'<text x="{(left + w - right) / 2:.0f}" y="{h - 8}" class="label">{escape(xlabel)}</text>')
        out.append(
            f'<text transform="translate(14 {(TOP + h - BOTTOM) / 2:.0f}) rotate(-90)" class="label">'
            f"{escape(ylabel)}</text>"
        )
        return out


def _svg(body: list[str], width: int, height: int, css_class: str, title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart {css_class}" role="img" '
        f'aria-label="{escape(title)}" viewBox="0 0 {width} {height}" width="{width}" height="{height}">'
        + "".join(body)
        + "</svg>"
    )


def empty_chart(title: str, message: str, width: int = WIDTH, height: int = 120) -> str:
    body = [f'<text x="{width / 2:.0f}" y="20" class="title">{escape(title)}</text>']
    lines = _wrap(message, width - 40, 12)  # the message stays inside the chart, on as many lines as it needs
    top = 64 - 8 * (len(lines) - 1)
    body += [
        f'<text x="{width / 2:.0f}" y="{top + 16 * n}" class="label">{escape(line)}</text>'
        for n, line in enumerate(lines)
    ]
    return _svg(body, width, height, "empty", title)


def _wrap(text: str, width: float, size: float) -> list[str]:
    """The words of `text` on lines no wider than `width` pixels (a longer word has a line of its own)."""
    lines: list[str] = []
    for word in text.split():
        if lines and text_width(f"{lines[-1]} {word}", size) <= width:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    return lines or [""]


def line_chart(
    title: str,
    xlabel: str,
    ylabel: str,
    series: Sequence[Series],
    y_range: tuple[float, float] | None = None,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """One polyline per series (with dots where a series has few points)."""
    shown = [s for s in series if s.points]
    if not shown:
        return empty_chart(title, "no data")
    xs = [x for s in shown for x, _ in s.points]
    ys = [y for s in shown for _, y in s.points]
    frame = _Frame((min(xs), max(xs)), y_range or (min(ys), max(ys)), width, height)
    body = frame.axes(title, xlabel, ylabel)
    for n, s in enumerate(shown):
        # Earlier series are drawn wider, so a job whose curve another one covers exactly still shows.
        thick = 2 + 3 * (len(shown) - 1 - n) / max(len(shown) - 1, 1) if len(shown) <= 8 else 2
        coords = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in s.points)
        body.append(
            f'<polyline points="{coords}" fill="none" stroke="{s.color}" stroke-width="{thick:.1f}" '
            f'stroke-linejoin="round"><title>{escape(s.name)}</title></polyline>'
        )
        if len(s.points) <= 30:
            body += [
                f'<circle cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="{1 + thick:.1f}" fill="{s.color}"/>'
                for x, y in s.points
            ]
    return _svg(body, width, height, "lines", title)


def scatter_chart(
    title: str,
    xlabel: str,
    ylabel: str,
    points: Sequence[tuple[str, float, float, str]],
    y_range: tuple[float, float] | None = None,
    width: int = WIDTH,
    height: int = HEIGHT,
    missing: str = "no finished job has both a time and an accuracy",
) -> str:
    """Labelled dots: (label, x, y, colour); `missing` says why there are none."""
    if not points:
        return empty_chart(title, missing)
    xs, ys = [p[1] for p in points], [p[2] for p in points]
    x_low, x_high = zoomed_range(xs, floor=0.0)
    frame = _Frame((x_low, x_high), y_range or zoomed_range(ys), width, height)
    body = frame.axes(title, xlabel, ylabel)
    dots = [(frame.x(x), frame.y(y)) for _, x, y, _ in points]
    inner = Box(frame.left + 2, TOP + 2, width - frame.right - 2, height - BOTTOM - 2)
    placed = place(dots, [p[0] for p in points], inner, POINT_FONT, DOT_RADIUS)
    for spot in placed:  # leaders first: dots and labels are drawn over them
        if spot is not None and spot.leader is not None:
            x0, y0, x1, y1 = spot.leader
            body.append(f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y1:.1f}" class="leader"/>')
    for (label, _, _, fill), (cx, cy) in zip(points, dots, strict=True):
        body.append(
            f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{DOT_RADIUS}" fill="{fill}"><title>{escape(label)}</title></circle>'
        )
    for (label, *_), spot in zip(points, placed, strict=True):
        if spot is not None:  # else no free place: the dot's tooltip names it
            body.append(f'<text x="{spot.x:.1f}" y="{spot.y:.1f}" class="point">{escape(label)}</text>')
    return _svg(body, width, height, "scatter", title)
