"""Collected job rows -> one table: time and accuracy side by side, speed-up against a baseline.

`summarize()` is what `jobgen summary` calls. Runs of the same configuration (seeds, repeats) are combined
into mean, spread (sample std) and n. rich and matplotlib are imported inside the functions that draw, so
that importing this module (and the CLI) stays fast.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobgen.collect import LAST_LINE, JobRow, LiveStates, collect
from jobgen.errors import JobgenError
from jobgen.states import State

FORMATS = ("table", "csv", "markdown", "json")
METRICS = (
    "queue_wait_s",
    "train_s",
    "samples_per_s",
    "peak_mem_mb",
    "best_val_acc",
    "test_acc",
    "test_f1",
    "requeues",
    "val_acc_so_far",
)


@dataclass(frozen=True)
class Stat:
    """Mean, sample standard deviation (None below two values) and count of one metric."""

    mean: float | None
    std: float | None
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stat:
        found = [v for v in values if v is not None]
        if len(found) < 2:
            return cls(found[0], None, 1) if found else cls(None, None, 0)
        mean = math.fsum(found) / len(found)
        var = math.fsum((v - mean) ** 2 for v in found) / (len(found) - 1)
        return cls(mean, math.sqrt(var), len(found))


@dataclass
class Line:
    """One row of the summary: a configuration (its runs combined) or a single job."""

    label: str
    experiment: str
    run: str
    config: dict[str, Any]  # engine, strategy, precision, compile, nodes, devices_per_node
    state: str
    n: int
    metrics: dict[str, Stat]
    mem_kind: str  # "gpu" when any job measured GPU memory, else "host"
    problem: str = ""
    hint: str = ""
    speedup: float | None = None
    is_baseline: bool = False
    jobs: list[JobRow] = field(default_factory=list)


def summarize(
    run_dirs: Sequence[Path],
    baseline: str | None = None,
    fmt: str = "table",
    plot: Path | None = None,
    live_states: LiveStates | None = None,
    combine: bool = True,
    color: bool = False,
    width: int | None = None,
) -> str:
    """Collect every job of the runs and render the summary as text in `fmt`; draw `plot` when given."""
    if fmt not in FORMATS:
        raise JobgenError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    lines = build_lines(collect(list(run_dirs), live_states), combine)
    apply_baseline(lines, baseline)
    if plot is not None:
        draw_plot(lines, plot)
    return RENDERERS[fmt](lines, color=color, width=width)


def live_states(run_dirs: Sequence[Path]) -> dict[tuple[str, str], Any]:
    """What Slurm says now about the submitted jobs of these runs, keyed as collect() wants it.

    Jobs Slurm does not know (local backend, accounting purged, no Slurm here) are left out, so their
    state comes from the manifest, the result and the logs instead.
    """
    from jobgen.record import load_manifest
    from jobgen.track import query

    jobs: dict[str, tuple[str, str]] = {}
    for run_dir in run_dirs:
        try:
            manifest = load_manifest(run_dir)
        except JobgenError:
            continue  # collect() reports it on the run's row
        if manifest.get("backend") == "local":
            continue
        for job in manifest.get("jobs", []):
            if job.get("job_id"):
                jobs[str(job["job_id"])] = (str(manifest.get("run_id")), str(job.get("name")))
    found = query(list(jobs)) if jobs else {}
    return {jobs[jid]: info for jid, info in found.items() if jid in jobs}


# --- rows -> lines ----------------------------------------------------------------------------------------


def build_lines(rows: Sequence[JobRow], combine: bool = True) -> list[Line]:
    """One line per configuration (combine) or per job, in first-seen order."""
    groups: dict[tuple[Any, ...], list[JobRow]] = {}
    for row in rows:
        key = config_key(row) if combine else (row.run_dir, row.name)
        groups.setdefault(key, []).append(row)
    many_experiments = len({row.experiment for row in rows}) > 1
    many_runs = not combine and len({row.run_dir for row in rows}) > 1
    return [_line(jobs, many_experiments, many_runs) for jobs in groups.values()]


def config_key(row: JobRow) -> tuple[Any, ...]:
    """Jobs with the same experiment and sweep values, seeds aside, are one configuration."""
    if not row.sweep:
        return (row.experiment, row.name)
    values = tuple(sorted((k, json.dumps(v)) for k, v in row.sweep.items() if not _is_seed(k)))
    return (row.experiment, values)


def _is_seed(key: str) -> bool:
    return key.rsplit(".", 1)[-1] == "seed"


def _line(jobs: list[JobRow], many_experiments: bool, many_runs: bool) -> Line:
    first = jobs[0]
    results = [j.result for j in jobs if j.result is not None]
    metrics = {
        "queue_wait_s": Stat.of(j.queue_wait_s for j in jobs),
        "train_s": Stat.of(r.train_s for r in results),
        "samples_per_s": Stat.of(r.samples_per_s for r in results),
        "peak_mem_mb": Stat.of(_peak_mem(r) for r in results),
        "best_val_acc": Stat.of(r.best_val_acc for r in results),
        "test_acc": Stat.of(r.test_acc for r in results),
        "test_f1": Stat.of(r.test_f1 for r in results),
        "requeues": Stat.of(None if r.requeue_count is None else float(r.requeue_count) for r in results),
        # From metrics.csv of jobs that have no result (yet): how far they got.
        "val_acc_so_far": Stat.of(j.partial_val_acc for j in jobs if j.result is None),
    }
    label = f"{first.run_id}/{_label(jobs)}" if many_runs else _label(jobs)
    problem, hint = _problem(jobs)
    run_ids = sorted({j.run_id for j in jobs})
    return Line(
        label=f"{first.experiment}/{label}" if many_experiments else label,
        experiment=first.experiment,
        run=run_ids[0] if len(run_ids) == 1 else f"{len(run_ids)} runs",
        config=job_config(first),
        state=_state_text([j.state for j in jobs]),
        n=len(jobs),
        metrics=metrics,
        mem_kind="gpu" if any(r.peak_gpu_mb is not None for r in results) else "host",
        problem=problem,
        hint=hint,
        jobs=jobs,
    )


def _peak_mem(result: Any) -> float | None:
    # GPU memory is what limits a fine-tune; host RSS stands in on CPU runs.
    return result.peak_gpu_mb if result.peak_gpu_mb is not None else result.peak_host_mb


def _label(jobs: list[JobRow]) -> str:
    names = {j.name for j in jobs}
    if len(names) == 1:
        return jobs[0].name
    # Different names for one configuration: the seed is in the name; name it by the other sweep values.
    parts = [f"{k.rsplit('.', 1)[-1]}-{v}" for k, v in jobs[0].sweep.items() if not _is_seed(k)]
    return "_".join(parts) or jobs[0].name


def job_config(row: JobRow) -> dict[str, Any]:
    """The configuration a job ran (its result), or was asked to run (spec.json, then sweep values)."""
    r = row.result
    asked = {**{k.split(".", 1)[-1]: v for k, v in row.sweep.items() if k.startswith("train.")}, **row.train}
    precision = r.precision if r and r.precision else asked.get("precision")
    if r and r.precision_requested and r.precision and r.precision_requested != r.precision:
        precision = f"{r.precision_requested}→{r.precision}"  # the engine fell back: say so
    return {
        "engine": (r.engine if r and r.engine else None) or asked.get("engine"),
        "strategy": (r.strategy if r and r.strategy else None) or asked.get("strategy"),
        "precision": precision,
        "compile": r.compile if r and r.compile is not None else asked.get("compile"),
        "nodes": (r.nodes if r and r.nodes else None) or asked.get("num_nodes"),
        "devices_per_node": (r.devices_per_node if r and r.devices_per_node else None) or asked.get("devices"),
    }


def _state_text(states: list[State]) -> str:
    counts: dict[str, int] = {}
    for state in states:
        counts[state.value] = counts.get(state.value, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _problem(jobs: list[JobRow]) -> tuple[str, str]:
    troubled = [j for j in jobs if j.problem or (j.cause and j.result is None)]
    if not troubled:
        return "", ""
    job = troubled[0]
    problem = job.problem or (job.cause.message if job.cause else "")
    if len(troubled) < len(jobs):
        what = "with a problem" if job.result is not None else "without result"
        problem = f"{len(troubled)} of {len(jobs)} {what} ({job.run_id}: {problem})"
    # "Read the log" is advice for a job that ended, not for one still at work.
    advise = job.cause is not None and (job.cause.kind != LAST_LINE or job.state.is_final)
    return problem, job.cause.hint if advise else ""


# --- baseline and speed-up --------------------------------------------------------------------------------


def apply_baseline(lines: list[Line], name: str | None) -> Line | None:
    """Mark the baseline line and set every line's speed-up: its samples/s over the baseline's.

    Throughput, not training time: both are measured over the timed window (docs/contracts.md), and a
    compiled job times fewer batches than its baseline (compiling ones are left out), so only a rate
    compares the same kind of work.
    """
    base = pick_baseline(lines, name)
    if base is None:
        return None
    base.is_baseline = True
    base_rate = base.metrics["samples_per_s"].mean
    for line in lines:
        rate = line.metrics["samples_per_s"].mean
        line.speedup = rate / base_rate if base_rate and rate else None
    return base


def pick_baseline(lines: list[Line], name: str | None) -> Line | None:
    """The line the user named, else the slowest plain-PyTorch one, else the slowest of all."""
    timed = [ln for ln in lines if ln.metrics["samples_per_s"].mean]
    if name is not None:
        return _named_baseline(lines, name)
    torch = [ln for ln in timed if ln.config.get("engine") == "torch"]
    pool = torch or timed
    return min(pool, key=lambda ln: ln.metrics["samples_per_s"].mean or 0.0) if pool else None


SPEEDUP_MEANS = "samples/s ÷ the baseline's samples/s, both over the timed window of docs/contracts.md"


def speedup_caption(lines: list[Line]) -> list[str]:
    base = next((ln.label for ln in lines if ln.is_baseline), None)
    return [f"speed-up: {SPEEDUP_MEANS.replace('the baseline', base)}"] if base else []


def _named_baseline(lines: list[Line], name: str) -> Line:
    exact = [ln for ln in lines if name in (ln.label, *(j.name for j in ln.jobs))]
    found = exact or [ln for ln in lines if name.lower() in ln.label.lower()]
    labels = ", ".join(ln.label for ln in lines[:20]) + (" ..." if len(lines) > 20 else "")
    if not found:
        raise JobgenError(f"baseline {name!r} matches no configuration: choose one of {labels}")
    if len(found) > 1:
        matches = ", ".join(ln.label for ln in found[:10])
        raise JobgenError(f"baseline {name!r} matches {len(found)} configurations ({matches}): be more exact")
    if not found[0].metrics["samples_per_s"].mean:
        raise JobgenError(f"baseline {found[0].label!r} has no throughput ({found[0].state}): choose a finished one")
    return found[0]


# --- records: the machine-readable shape shared by csv and json -------------------------------------------

FIELDS = (
    ["experiment", "run", "config", "engine", "strategy", "precision", "compile", "nodes"]
    + ["devices_per_node", "state", "n"]
    + [name for metric in METRICS for name in (metric, f"{metric}_std")]
    + ["peak_mem_kind", "speedup", "baseline", "problem", "hint"]
)


def record(line: Line) -> dict[str, Any]:
    """A line as flat JSON-able values: raw seconds, fractions and MB; None where unknown."""
    out: dict[str, Any] = {
        "experiment": line.experiment,
        "run": line.run,
        "config": line.label,
        **line.config,
        "state": line.state,
        "n": line.n,
    }
    for metric in METRICS:
        stat = line.metrics[metric]
        out[metric] = _round(stat.mean)
        out[f"{metric}_std"] = _round(stat.std)
    out.update(
        peak_mem_kind=line.mem_kind,
        speedup=_round(line.speedup),
        baseline=line.is_baseline,
        problem=line.problem or None,
        hint=line.hint or None,
    )
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def render_json(lines: list[Line], **_: Any) -> str:
    base = next((ln.label for ln in lines if ln.is_baseline), None)
    doc = {"baseline": base, "speedup": SPEEDUP_MEANS, "rows": [record(ln) for ln in lines]}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def render_csv(lines: list[Line], **_: Any) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(FIELDS)
    writer.writerows(record(line).values() for line in lines)  # csv writes None as ""
    return buf.getvalue()


# --- human cells: shared by the terminal table and markdown -----------------------------------------------

HEADERS = (
    "config", "engine", "strategy", "precision", "compile", "nodes×GPUs", "state", "queue wait",
    "train time", "samples/s", "peak mem (MB)", "best val acc (%)", "test acc (%)", "test F1 (%)",
    "requeues", "speed-up", "note",
)  # fmt: skip
NUMERIC = frozenset(HEADERS[7:16])
# Two-line headers keep the terminal table narrow; words are never folded mid-way.
TERMINAL_HEADERS = {
    "nodes×GPUs": "nodes\n×GPUs", "queue wait": "queue\nwait", "train time": "train\ntime",
    "samples/s": "samples\n/s", "peak mem (MB)": "peak mem\n(MB)", "best val acc (%)": "best val\nacc (%)",
    "test acc (%)": "test acc\n(%)", "test F1 (%)": "test F1\n(%)", "speed-up": "speed-\nup",
    "precision": "preci-\nsion", "requeues": "re-\nqueues",
}  # fmt: skip


def cells(line: Line) -> list[str]:
    """The display text of a line, in HEADERS order."""
    c, m = line.config, line.metrics
    shape = f"{c['nodes'] or '?'}×{c['devices_per_node'] or '?'}" if c["nodes"] or c["devices_per_node"] else ""
    memory = _stat(m["peak_mem_mb"], "{:,.0f}".format)
    return [
        line.label + (f" (n={line.n})" if line.n > 1 else ""),
        c["engine"] or "",
        c["strategy"] or "",
        c["precision"] or "",
        "" if c["compile"] is None else ("yes" if c["compile"] else "no"),
        shape,
        line.state,
        _stat(m["queue_wait_s"], duration),
        _stat(m["train_s"], duration),
        _stat(m["samples_per_s"], "{:,.1f}".format),
        f"{memory} {line.mem_kind}" if memory else "",
        _stat(m["best_val_acc"], _percent) or _so_far(m["val_acc_so_far"]),
        _stat(m["test_acc"], _percent),
        _stat(m["test_f1"], _percent),
        _stat(m["requeues"], "{:g}".format),
        "baseline" if line.is_baseline else ("" if line.speedup is None else f"{line.speedup:.2f}×"),
        line.problem,
    ]


def _stat(stat: Stat, show: Callable[[float], str]) -> str:
    """ "mean" or "mean ± std"."""
    if stat.mean is None:
        return ""
    return show(stat.mean) + ("" if stat.std is None else f" ± {show(stat.std)}")


def _so_far(stat: Stat) -> str:
    return f"({_stat(stat, _percent)} so far)" if stat.mean is not None else ""


def _percent(value: float) -> str:
    return f"{100 * value:.1f}"  # the header carries the unit


def duration(seconds: float) -> str:
    """12.3s, 4m05s, 2h03m: short enough for a table cell."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def notes(lines: list[Line]) -> list[str]:
    """One line per troubled configuration: what happened, then what to do."""
    return [f"{ln.label}: {ln.problem}" + (f" -> {ln.hint}" if ln.hint else "") for ln in lines if ln.problem]


def render_markdown(lines: list[Line], **_: Any) -> str:
    def row(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

    out = [row(HEADERS), row(["---:" if h in NUMERIC else "---" for h in HEADERS])]
    out += [row(cells(ln)) for ln in lines]
    out += ["", *speedup_caption(lines)] if speedup_caption(lines) else []
    hints = [f"- {ln.label}: {ln.hint}" for ln in lines if ln.hint]
    if hints:
        out += ["", "What to do:", "", *hints]
    return "\n".join(out) + "\n"


STATE_STYLES = {"COMPLETED": "green", "RUNNING": "cyan", "PENDING": "yellow", "SUBMITTED": "yellow"}


def render_table(lines: list[Line], color: bool = False, width: int | None = None, **_: Any) -> str:
    """A rich table (two stacked ones on a narrow screen); the full notes follow it."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    if not lines:
        return "No jobs found.\n"
    if len(lines) > RICH_MAX_ROWS:
        return plain_table(lines, color)
    width = width or shutil.get_terminal_size((200, 24)).columns
    rows = [cells(ln) for ln in lines]
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=color, no_color=not color, width=width)
    for n, shown in enumerate(column_groups(_natural_widths(rows), width)):
        if n:
            console.print()
        table = Table(box=box.SIMPLE_HEAD, header_style="bold", show_edge=False, pad_edge=False)
        for i in shown:
            table.add_column(TERMINAL_HEADERS.get(HEADERS[i], HEADERS[i]), **_column_style(HEADERS[i]))
        for line, values in zip(lines, rows, strict=True):
            texts = {i: Text(values[i]) for i in shown}  # Text, not markup: "[rank1]:" is not a tag
            texts[STATE].stylize(STATE_STYLES.get(line.state, "red"))
            table.add_row(*texts.values(), style="bold" if line.is_baseline else None)
        console.print(table)
    for caption in speedup_caption(lines):
        console.print(Text(caption))
    for note in notes(lines):
        console.print(Text(f"• {note}"))
    return buf.getvalue()


STATE = HEADERS.index("state")


def column_groups(natural: list[int], width: int) -> list[list[int]]:
    """Which columns each stacked table shows: one table when it fits, else what the job is, then how it did.

    Notes are repeated in full under the tables, so the note column is the first thing to go.
    """
    every = list(range(len(HEADERS)))

    def fits(columns: list[int]) -> bool:
        return sum(natural[i] + 3 for i in columns) <= width

    for columns in (every, every[:-1]):
        if fits(columns):
            return [columns]
    return [every[: STATE + 1], [0, STATE, *every[STATE + 1 : -1]]]


def _natural_widths(rows: list[list[str]]) -> list[int]:
    headers = [max(len(part) for part in TERMINAL_HEADERS.get(h, h).split("\n")) for h in HEADERS]
    widths = [max(h, *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    widths[-1] = min(widths[-1], NOTE_WIDTH)
    return widths


def _column_style(header: str) -> dict[str, Any]:
    if header == "note":
        return {"no_wrap": True, "overflow": "ellipsis", "max_width": NOTE_WIDTH}
    # Numbers and states fold rather than lose their end (rich crops no_wrap columns on a narrow screen).
    return {"justify": "right" if header in NUMERIC else "left", "overflow": "fold"}


# rich lays a table out at about 2 ms a row (measured): nothing on a screenful, 20 s for 10,000 jobs.
# Past this many rows the same columns are aligned here, which is what `| less` or a file wants anyway.
RICH_MAX_ROWS = 300
NOTE_WIDTH = 40
ANSI = {"green": "\x1b[32m", "cyan": "\x1b[36m", "yellow": "\x1b[33m", "red": "\x1b[31m"}


def plain_table(lines: list[Line], color: bool = False) -> str:
    """The terminal table without rich: same columns, same notes, aligned by hand."""
    rows = [cells(ln) for ln in lines]
    for row in rows:
        row[-1] = row[-1] if len(row[-1]) <= NOTE_WIDTH else row[-1][: NOTE_WIDTH - 1] + "…"
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]

    def join(values: list[str], state: str | None = None) -> str:
        padded = [v.rjust(w) if h in NUMERIC else v.ljust(w) for v, w, h in zip(values, widths, HEADERS, strict=True)]
        if state is not None and color:
            padded[6] = f"{ANSI[STATE_STYLES.get(state, 'red')]}{padded[6]}\x1b[0m"
        return "  ".join(padded).rstrip()

    out = [join(list(HEADERS)), "  ".join("─" * w for w in widths)]
    out += [join(row, line.state) for row, line in zip(rows, lines, strict=True)]
    out += speedup_caption(lines)
    out += [f"• {note}" for note in notes(lines)]
    return "\n".join(out) + "\n"


RENDERERS = {"table": render_table, "csv": render_csv, "markdown": render_markdown, "json": render_json}


# --- plot -------------------------------------------------------------------------------------------------


def draw_plot(lines: list[Line], path: Path) -> Any:
    """Two bar charts, training time and test accuracy per configuration, saved as PNG; returns the figure."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a login node
    from matplotlib import pyplot as plt

    labels = [ln.label for ln in lines]
    fig, (ax_time, ax_acc) = plt.subplots(
        1, 2, figsize=(12, 1.2 + 0.45 * max(len(lines), 1)), sharey=True, layout="constrained"
    )
    _bars(ax_time, labels, [ln.metrics["train_s"] for ln in lines], 1 / 60, "training time (min)", lines)
    _bars(ax_acc, labels, [ln.metrics["test_acc"] for ln in lines], 100, "test accuracy (%)", lines)
    ax_time.set_title("Training time")
    ax_acc.set_title("Test accuracy")
    ax_time.invert_yaxis()  # first configuration on top, as in the table
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig


def _bars(ax: Any, labels: list[str], stats: list[Stat], scale: float, xlabel: str, lines: list[Line]) -> None:
    values = [(s.mean or 0.0) * scale for s in stats]
    errors = [(s.std or 0.0) * scale for s in stats]
    ax.barh(labels, values, xerr=errors, color="#4c72b0", capsize=3)
    for y, (stat, value, line) in enumerate(zip(stats, values, lines, strict=True)):
        text = f"{value:.1f}" if stat.mean is not None else line.state  # no bar: say why
        ax.annotate(text, (value, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_xlabel(xlabel)
    ax.margins(x=0.15)
