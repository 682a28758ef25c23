"""`jobgen summary --plot`: the summary as a PNG: training time and test accuracy per configuration,
and what each cost against its accuracy (as the HTML report's chart).

Bars start at zero: a bar's length is its value, so an axis cut at 99.25 would make 99.3 against 99.7
look five-fold; the numbers are written at the bars' ends instead. Error ticks are one sample standard
deviation and only where there is one (n >= 2). matplotlib is imported here only, when a plot is asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobgen.results.charts import time_unit, zoomed_range
from jobgen.results.columns import Line, Stat, cost_metric
from jobgen.results.labels import Box, place

BAR = "#4c72b0"
DPI = 120
LABEL_PT = 8


def draw_plot(lines: list[Line], path: Path) -> Any:
    """Draw the three charts and save them as PNG; returns the figure (closed, for tests to read)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a login node
    from matplotlib import pyplot as plt

    fig = plt.figure(figsize=(17, max(3.8, 1.4 + 0.45 * len(lines))), layout="constrained")
    grid = fig.add_gridspec(1, 3, width_ratios=[1, 1, 1.25])
    ax_time = fig.add_subplot(grid[0])
    ax_acc = fig.add_subplot(grid[1], sharey=ax_time)
    ax_cost = fig.add_subplot(grid[2])
    labels = [ln.label for ln in lines]
    longest = max((ln.metrics["train_s"].mean or 0.0 for ln in lines), default=0.0)
    divisor, unit = time_unit(longest)
    _bars(ax_time, labels, [ln.metrics["train_s"] for ln in lines], 1 / divisor, lines)
    ax_time.set(title="Training time", xlabel=f"training time ({unit})")
    ax_time.margins(x=0.15)
    _bars(ax_acc, labels, [ln.metrics["test_acc"] for ln in lines], 100, lines, inside=True)
    ax_acc.set(title="Test accuracy", xlabel="test accuracy (%)", xlim=(0, 100))
    ax_acc.tick_params(labelleft=False)
    ax_time.invert_yaxis()  # first configuration on top, as in the table
    _cost(fig, ax_cost, lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return fig


def _bars(ax: Any, labels: list[str], stats: list[Stat], scale: float, lines: list[Line], inside: bool = False) -> None:
    values = [(s.mean or 0.0) * scale for s in stats]
    errors = [(s.std or 0.0) * scale for s in stats]
    rows = range(len(values))  # positions, not categories: two lines with one label keep two bars
    ax.barh(rows, values, color=BAR)
    ax.set_yticks(rows, labels)
    spread = [(y, v, e) for y, v, e in zip(rows, values, errors, strict=True) if e]
    if spread:  # n = 1 has no spread to show: no tick at all rather than a zero-width one
        ys, xs, errs = zip(*spread, strict=True)
        ax.errorbar(xs, ys, xerr=errs, fmt="none", ecolor="#222", capsize=3, lw=1)
    for y, stat, value, error, line in zip(rows, stats, values, errors, lines, strict=True):
        at = {"textcoords": "offset points", "va": "center", "fontsize": 8}
        if stat.mean is None:  # no bar: say why
            ax.annotate(line.state, (0, y), xytext=(3, 0), **at)
        elif inside and value > 60:  # a long bar on a fixed 0-100 axis: its number goes inside, clear of the tick
            ax.annotate(_bar_text(value), (value - error, y), xytext=(-4, 0), ha="right", color="white", **at)
        else:
            ax.annotate(_bar_text(value), (value + error, y), xytext=(3, 0), **at)


def _bar_text(value: float) -> str:
    return f"{value:.1f}" if abs(value) >= 1 else f"{value:.2g}"


def _cost(fig: Any, ax: Any, lines: list[Line]) -> None:
    """GPU-hours (or CPU-hours) against test accuracy, each dot labelled where its label has room."""
    metric, what = cost_metric(lines)
    priced = [ln for ln in lines if ln.metrics[metric].mean is not None and ln.metrics["test_acc"].mean is not None]
    ax.set(title=f"{what} vs test accuracy", xlabel=f"{what} (all attempts)", ylabel="test accuracy (%)")
    if not priced:
        ax.text(
            0.5,
            0.5,
            f"no finished job has both {what} and an accuracy",
            ha="center",
            va="center",
            transform=ax.transAxes,
            fontsize=9,
            color="#555",
        )
        ax.set(xticks=[], yticks=[])
        return
    xs = [ln.metrics[metric].mean or 0.0 for ln in priced]
    ys = [100 * (ln.metrics["test_acc"].mean or 0.0) for ln in priced]
    ax.scatter(xs, ys, s=40, color=BAR, zorder=3)
    ax.set_xlim(*zoomed_range(xs, floor=0.0))
    ax.set_ylim(*zoomed_range(ys, 0.0, 100.0))
    ax.grid(color="#eee")
    # Freeze the layout, then place the labels in pixels (y downwards, as labels.place counts).
    fig.canvas.draw()
    fig.set_layout_engine("none")
    height = fig.bbox.height
    to_px = ax.transData.transform
    dots = [(float(x), height - float(y)) for x, y in (to_px((u, v)) for u, v in zip(xs, ys, strict=True))]
    box = ax.get_window_extent()
    frame = Box(box.x0 + 2, height - box.y1 + 2, box.x1 - 2, height - box.y0 - 2)
    size_px = LABEL_PT * DPI / 72
    radius = (40**0.5) / 2 * DPI / 72 + 1  # a marker of area s=40 pt²
    from_px = ax.transData.inverted().transform
    for line, spot in zip(priced, place(dots, [ln.label for ln in priced], frame, size_px, radius), strict=True):
        if spot is None:
            continue
        x, y = from_px((spot.x, height - spot.y))
        ax.annotate(line.label, (x, y), fontsize=LABEL_PT, color="#333", ha="left", va="baseline")
        if spot.leader is not None:
            x0, y0, x1, y1 = spot.leader
            start, end = from_px((x0, height - y0)), from_px((x1, height - y1))
            ax.plot([start[0], end[0]], [start[1], end[1]], color="#aaa", lw=0.8, zorder=2)
