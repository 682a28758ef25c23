"""Collected job rows -> one table: time and accuracy side by side, speed-up against a baseline.

`summarize()` is what `jobgen summary` calls. Runs of the same configuration (seeds, repeats) are combined
into mean, spread (sample std) and n. matplotlib is imported inside the function that draws a plot, so
that importing this module (and the CLI) stays fast.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jobgen.errors import JobgenError
from jobgen.record.model import Run
from jobgen.results import halving as halving_view
from jobgen.results.collect import JobRow, LiveStates, collect, is_seed
from jobgen.results.columns import (
    COLUMNS,
    COUNTS,
    METRICS,
    SUMMED,
    Line,
    Stat,
    amount,
    cost_metric,
    metric_values,
    predictions,
    primary_metric,
)
from jobgen.results.diagnose import LAST_LINE
from jobgen.states import State

FORMATS = ("table", "csv", "markdown", "json")


def summarize(
    runs: Sequence[Run | Path],
    baseline: str | None = None,
    fmt: str = "table",
    plot: Path | None = None,
    live_states: LiveStates | None = None,
    combine: bool = True,
    color: bool = False,
    width: int | None = None,
) -> str:
    """Collect every job of the runs and render the summary as text in `fmt`; draw `plot` when given.

    Runs read by jobgen.results.state_rule.read_runs keep the states Slurm gave them; run folders are read
    from their files alone (and `live_states`)."""
    if fmt not in FORMATS:
        raise JobgenError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    lines = summary_lines(runs, baseline, live_states, combine)
    if plot is not None:
        from jobgen.results.plot import draw_plot

        draw_plot(lines, plot)
    return RENDERERS[fmt](lines, color=color, width=width)


def summary_text(
    run_dirs: Sequence[Path],
    *,
    refresh: bool = False,
    baseline: str | None = None,
    fmt: str = "table",
    plot: Path | None = None,
    combine: bool = True,
    color: bool = False,
) -> tuple[str, list[str]]:
    """(the summary of these runs as `jobgen summary` prints it, one warning per damaged record): the runs
    read (states settled, Slurm and the accounting asked once), what was read saved in each run's index."""
    from jobgen.results.collect import look_and_keep
    from jobgen.results.state_rule import read_some

    width = shutil.get_terminal_size((200, 24)).columns
    loaded = read_some(run_dirs, refresh=refresh)
    look_and_keep([run for run in loaded if isinstance(run, Run)])
    text = summarize(loaded, baseline=baseline, fmt=fmt, plot=plot, combine=combine, color=color, width=width)
    warnings = []
    for run in loaded:
        if isinstance(run, Path):
            continue  # its manifest is damaged: the summary's own rows say so
        problems = [line for job in run.jobs for line in job.problems()]
        run.save_index()
        warnings += [f"{run.run_dir}/{line}" for line in problems] + run.notes
    return text, warnings


def summary_lines(
    runs: Sequence[Run | Path], baseline: str | None = None, live_states: LiveStates | None = None, combine: bool = True
) -> list[Line]:
    """The summary's lines of these runs, speed-ups measured against `baseline`: what every format shows."""
    lines = build_lines(collect(runs, live_states), combine)
    apply_baseline(lines, baseline)
    return lines


def records(runs: Sequence[Run | Path], baseline: str | None = None, combine: bool = True) -> list[dict[str, Any]]:
    """The rows of `summary --format csv` (and json) as dicts, FIELDS their keys in order."""
    return [record(line) for line in summary_lines(runs, baseline, combine=combine)]


# --- rows -> lines ----------------------------------------------------------------------------------------


def build_lines(rows: Sequence[JobRow], combine: bool = True) -> list[Line]:
    """One line per configuration (combine) or per job, in first-seen order."""
    groups: dict[tuple[Any, ...], list[JobRow]] = {}
    for row in rows:
        key = config_key(row) if combine else (row.run_dir, row.name)
        groups.setdefault(key, []).append(row)
    many_experiments = len({row.experiment for row in rows}) > 1
    many_runs = not combine and len({row.run_dir for row in rows}) > 1
    lines = [_line(jobs, many_experiments, many_runs) for jobs in groups.values()]
    _tell_apart(lines)
    return lines


def config_key(row: JobRow) -> tuple[Any, ...]:
    """Jobs of one experiment planned from the same settings (JobRow.setup: runs that differ by a --set
    item, a site value or an edit do not) with the same sweep values, seeds aside, are one configuration."""
    if not row.sweep:
        return (row.experiment, row.setup, row.name)
    # Each value by its JSON: "1" is not 1, and 1.0 is not 1.
    values = tuple(sorted((k, json.dumps(v)) for k, v in row.sweep.items() if not is_seed(k)))
    return (row.experiment, row.setup, values)


def _tell_apart(lines: list[Line]) -> None:
    """Lines that would share a label (one job of runs planned from different settings) each name the
    settings they differ by: `engine-torch [train.lr=0.003]`, `engine-torch [train.lr=0.001]`."""
    by_label: dict[str, list[Line]] = {}
    for line in lines:
        by_label.setdefault(line.label, []).append(line)
    for same in (group for group in by_label.values() if len(group) > 1):
        setups = [dict(line.jobs[0].setup) for line in same]
        keys = sorted({key for setup in setups for key in setup if len({s.get(key) for s in setups}) > 1})
        for line, setup in zip(same, setups, strict=True):
            shown = [f"{key}={_setting(setup.get(key))}" for key in keys[:LABEL_SETTINGS]]
            line.label += f" [{', '.join(shown)}{', …' if len(keys) > LABEL_SETTINGS else ''}]" if keys else ""


LABEL_SETTINGS = 3  # the most settings a label names (`jobgen diff` lists them all)


def _setting(value: str | None) -> str:
    """A setting's value as a label shows it: text without its quotes; `default` where the run left it."""
    if value is None:
        return "default"
    shown = json.loads(value)
    return shown if isinstance(shown, str) else value


def _line(jobs: list[JobRow], many_experiments: bool, many_runs: bool) -> Line:
    first = jobs[0]
    columns = zip(*map(metric_values, jobs), strict=True)  # each metric's values over the jobs
    metrics = {name: Stat.of(values) for name, values in zip(METRICS, columns, strict=True)}
    label, run_ids = _label(jobs), sorted({j.run_id for j in jobs})
    state = (halving_view.state_label(first) if len(jobs) == 1 else "") or _state_text([j.state for j in jobs])
    excluded = tuple(sorted({node for j in jobs if j.retries for node in j.retries.excluded}))
    gpu = any(j.result is not None and j.result.peak_gpu_mb is not None for j in jobs)
    label = f"{first.run_id}/{label}" if many_runs else label
    problem, hint = _problem(jobs)
    detail = [f"{len(first.segments)} segments: {' → '.join(first.segments)}"] if first.segments else []
    detail += [f"retried away from {', '.join(excluded)}"] if excluded else []
    return Line(
        label=f"{first.experiment}/{label}" if many_experiments else label,
        experiment=first.experiment,
        run=run_ids[0] if len(run_ids) == 1 else f"{len(run_ids)} runs",
        config=job_config(first),
        state=state,
        n=len(jobs),
        metrics=metrics,
        mem_kind="gpu" if gpu else "host",
        problem=problem,
        hint=hint,
        detail="; ".join(detail),
        excluded=excluded,
        jobs=jobs,
    )


def _label(jobs: list[JobRow]) -> str:
    names = {j.name for j in jobs}
    if len(names) == 1:
        return jobs[0].name
    # Different names for one configuration: the seed is in the name; name it by the other sweep values.
    parts = [f"{k.rsplit('.', 1)[-1]}-{v}" for k, v in jobs[0].sweep.items() if not is_seed(k)]
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
        "accelerator": (r.accelerator if r and r.accelerator else None) or asked.get("accelerator"),
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
    if job.cause is None or (job.cause.kind == LAST_LINE and not job.state.is_final):
        return problem, ""
    return problem, job.cause.hint


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
    base_devices = devices(base)
    for line in lines:
        rate = line.metrics["samples_per_s"].mean
        line.speedup = rate / base_rate if base_rate and rate else None
        ratio = devices(line) / base_devices if base_devices and devices(line) else None
        line.scaling_efficiency = line.speedup / ratio if line.speedup is not None and ratio else None
    return base


def devices(line: Line) -> int:
    """GPUs, or CPU processes, of a line's configuration (0: unknown)."""
    return int(line.config["nodes"] or 0) * int(line.config["devices_per_node"] or 0)


def pick_baseline(lines: list[Line], name: str | None) -> Line | None:
    """The line the user named, else the slowest plain-PyTorch one, else the slowest of all."""
    timed = [ln for ln in lines if ln.metrics["samples_per_s"].mean]
    if name is not None:
        return _named_baseline(lines, name)
    torch = [ln for ln in timed if ln.config.get("engine") == "torch"]
    pool = torch or timed
    return min(pool, key=lambda ln: ln.metrics["samples_per_s"].mean or 0.0) if pool else None


SPEEDUP_MEANS = "samples/s ÷ the baseline's samples/s, both over the timed window of docs/contracts.md"
EFFICIENCY_MEANS = "speed-up ÷ (nodes×devices ÷ the baseline's nodes×devices)"


def speedup_caption(lines: list[Line]) -> list[str]:
    """What the speed-up column divides, by which job and number: 'speed-up: samples/s ÷ the baseline's
    samples/s (engine-torch, 422.9 samples/s), both over the timed window of docs/contracts.md'."""
    base = next((ln for ln in lines if ln.is_baseline), None)
    if base is None or base.metrics["samples_per_s"].mean is None:
        return []
    stat = base.metrics["samples_per_s"]
    rate = f"{stat.mean:,.1f} samples/s" + (f", the mean of {stat.n}" if stat.n > 1 else "")
    return [
        f"speed-up: samples/s ÷ the baseline's samples/s ({base.label}, {rate}), both over the timed window "
        "of docs/contracts.md"
    ]


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
    + ["devices_per_node", "accelerator", "state", "n"]
    + [field for name in METRICS for field in (name, f"{name}_std")]
    + ["peak_mem_kind", "speedup", "scaling_efficiency", "usage_from", "baseline", "excluded_nodes", "problem", "hint"]
    + ["primary_metric", "test_metrics", "test_metrics_std", "val_metrics", "val_metrics_std", "predictions"]
    + ["parameters"]
    + list(halving_view.FIELDS)
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
    for name in METRICS:
        stat = line.metrics[name]
        whole = name in COUNTS and stat.mean is not None and float(stat.mean).is_integer()
        out[name] = int(stat.mean) if whole and stat.mean is not None else _round(stat.mean)
        out[f"{name}_std"] = _round(stat.std)
    out.update(
        peak_mem_kind=line.mem_kind,
        speedup=_round(line.speedup),
        scaling_efficiency=_round(line.scaling_efficiency),
        # Where the hours came from: "sacct", "request" (no accounting), or both across seeds.
        usage_from="+".join(sorted({j.usage.source for j in line.jobs if j.usage is not None})) or None,
        baseline=line.is_baseline,
        excluded_nodes=",".join(line.excluded) or None,
        problem=line.problem or None,
        hint=line.hint or None,
        primary_metric=primary_metric(line),
    )
    for split in ("test", "val"):
        means, stds = _metric_stats(line, f"{split}_metrics")
        out[f"{split}_metrics"], out[f"{split}_metrics_std"] = means, stds
    out["predictions"] = predictions(line) or None
    out["parameters"] = _parameters(line)
    out.update(halving_view.fields(line.jobs))
    return out


def _parameters(line: Line) -> dict[str, int | None] | None:
    """result.json's parameter counts ({"total", "trainable"}), when every job of the line has the same."""
    found = {
        (job.result.parameters, job.result.trainable_parameters)
        for job in line.jobs
        if job.result is not None and job.result.parameters is not None
    }
    if len(found) != 1:
        return None
    total, trainable = found.pop()
    return {"total": total, "trainable": trainable}


def _metric_stats(line: Line, key: str) -> tuple[dict[str, float | None] | None, dict[str, float | None] | None]:
    """Mean and standard deviation of each of result.json's `key` metrics over the line's jobs."""
    found = [getattr(job.result, key) for job in line.jobs if job.result is not None]
    found = [m for m in found if m]
    if not found:
        return None, None
    names = sorted({name for m in found for name in m})
    stats = {name: Stat.of(m.get(name) for m in found) for name in names}
    return {k: _round(s.mean) for k, s in stats.items()}, {k: _round(s.std) for k, s in stats.items()}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


TOTALS_MEAN = (
    "gpu_hours, cpu_hours and energy_kwh summed over every job that started (each job's attempts "
    "included); null when one of those jobs has no value"
)


def totals(lines: list[Line]) -> dict[str, Any]:
    """The sweep's GPU-hours, CPU-hours and energy: the sum over every job of every line, not over the
    lines' means. A job that never started adds nothing; one that started without a value (no
    accounting, no energy plugin) makes the total unknown (None): a total that leaves a job out would
    look right and be too small."""
    jobs = [job for line in lines for job in line.jobs]
    out: dict[str, Any] = {"jobs": len(jobs)}
    # A job ran when the accounting says so, else when it has a start time.
    ran = [job.usage.ran if job.usage is not None else job.started_at is not None for job in jobs]
    for name in SUMMED:
        values = [None if job.usage is None else getattr(job.usage, name) for job in jobs]
        missing = any(v is None and did for v, did in zip(values, ran, strict=True))
        out[name] = None if missing else _round(math.fsum(v for v in values if v is not None))
    out.update(halving_view.totals(jobs, cost_metric(lines)[0]))
    return out


def totals_text(lines: list[Line]) -> list[str]:
    """The totals as one line under a human table: 'total of 12 jobs: 3.45 GPU-h, 6.78 CPU-h, energy unknown'."""
    if not lines:
        return []
    found = totals(lines)
    units = [("gpu_hours", "GPU-h", "GPU-h"), ("cpu_hours", "CPU-h", "CPU-h"), ("energy_kwh", "kWh", "energy")]
    parts = [
        f"{amount(found[name])} {unit}" if found[name] is not None else f"{unknown} unknown"
        for name, unit, unknown in units
    ]
    if all(found[name] is None for name, _, _ in units):
        parts = ["GPU-h, CPU-h and energy unknown"]  # a local run, or no accounting: one phrase, not three
    out = [f"total of {found['jobs']} job{'s' if found['jobs'] != 1 else ''}: {', '.join(parts)}"]
    return out + halving_view.totals_text(found)


def render_json(lines: list[Line], **_: Any) -> str:
    base = next((ln.label for ln in lines if ln.is_baseline), None)
    doc = {
        "baseline": base,
        "speedup": SPEEDUP_MEANS,
        "scaling_efficiency": EFFICIENCY_MEANS,
        "totals": totals(lines),
        "totals_mean": TOTALS_MEAN,
        "rows": [record(ln) for ln in lines],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def render_csv(lines: list[Line], **_: Any) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(FIELDS)
    # csv writes None as ""; true/false as JSON writes them (Python's csv would write True/False)
    writer.writerows([_csv_value(v) for v in record(line).values()] for line in lines)
    return buf.getvalue()


def _csv_value(value: Any) -> Any:
    if isinstance(value, (dict, list)):  # the metrics by name, the predictions files, rung_metrics: one JSON cell
        return json.dumps(value, ensure_ascii=False)
    return ("true" if value else "false") if isinstance(value, bool) else value


# --- human cells: shared by the terminal table, markdown and the report --------------------------------

HEADERS = tuple(column.header for column in COLUMNS)
NUMERIC = frozenset(column.header for column in COLUMNS if column.numeric)
# Two-line headers keep the terminal table narrow; words are never folded mid-way.
TERMINAL_HEADERS = {column.header: column.terminal for column in COLUMNS if column.terminal}


def cells(line: Line) -> list[str]:
    """The display text of a line, in HEADERS order."""
    return [column.cell(line) for column in COLUMNS]


def notes(lines: list[Line]) -> list[str]:
    """The note column in full, one line per configuration that has one: what happened, then what to do."""
    return [
        f"{ln.label}: {ln.problem}" + (f" -> {ln.hint}" if ln.hint else "")
        if ln.problem
        else f"{ln.label}: {ln.detail}"
        for ln in lines
        if ln.problem or ln.detail
    ]


def render_markdown(lines: list[Line], **_: Any) -> str:
    def row(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

    caption = speedup_caption(lines)
    out = [*caption, ""] if caption else []
    out += [row(HEADERS), row(["---:" if h in NUMERIC else "---" for h in HEADERS])]
    out += [row(cells(ln)) for ln in lines]
    out += ["", *totals_text(lines)]
    hints = [f"- {ln.label}: {ln.hint}" for ln in lines if ln.hint]
    if hints:
        out += ["", "What to do:", "", *hints]
    return "\n".join(out) + "\n"


def state_tone(state: str) -> str:
    """How a line's state is colored, in the terminal and the report: done, running, waiting (queued,
    paused at a halving rung, waiting for room or a slot), planned (an end chosen, not suffered: halving
    stopped it, a dry run), else bad."""
    name = state.split("@", 1)[0]
    if name in ("COMPLETED", "RUNNING"):
        return "done" if name == "COMPLETED" else "running"
    if name in ("PENDING", "SUBMITTED", "REQUEUED", "WAITING", "PAUSED"):
        return "waiting"
    return "planned" if name in ("STOPPED", "DRY_RUN") else "bad"


# The terminal's color of each tone; a planned end is left plain.
TONE_ANSI = {"done": "\x1b[32m", "running": "\x1b[36m", "waiting": "\x1b[33m", "bad": "\x1b[31m"}


def render_table(lines: list[Line], color: bool = False, width: int | None = None, **_: Any) -> str:
    """The terminal table: the columns some job has a value in, stacked in tables that each fit the
    screen (column_groups), aligned by hand; the full notes follow it."""
    if not lines:
        return "No jobs found.\n"
    width = width or shutil.get_terminal_size((200, 24)).columns
    every = [cells(ln) for ln in lines]
    kept = kept_columns(every)
    rows = [[row[i] for i in kept] for row in every]
    for row in rows:
        row[-1] = row[-1] if len(row[-1]) <= NOTE_WIDTH else row[-1][: NOTE_WIDTH - 1] + "…"
    heads = [TERMINAL_HEADERS.get(HEADERS[i], HEADERS[i]).split("\n") for i in kept]
    # Column by column: one C-level pass each.
    widths = [
        max(max(map(len, head)), max(map(len, column)))
        for head, column in zip(heads, zip(*rows, strict=True), strict=True)
    ]
    numeric = [HEADERS[i] in NUMERIC for i in kept]
    state_at = kept.index(STATE)
    out = _prose(speedup_caption(lines), width)
    for n, group in enumerate(column_groups(widths, width)):
        # One format for every row of this table: each cell padded as ljust/rjust would, in one call per row.
        fields = [f"{{:{'>' if numeric[i] else '<'}{widths[i]}}}" for i in group]
        row_format = GAP.join(fields)
        depth = max(len(heads[i]) for i in group)
        # A one-line header sits on the last line, beside the second halves of the folded ones.
        stacked = [[""] * (depth - len(heads[i])) + heads[i] for i in group]
        out += [""] if n else []
        for texts in zip(*stacked, strict=True):
            out.append(_styled(row_format.format(*texts).rstrip(), BOLD, color))
        out.append("─" * (sum(widths[i] for i in group) + len(GAP) * (len(group) - 1)))
        at = group.index(state_at) if state_at in group else None
        for row, line in zip(rows, lines, strict=True):
            values = [row[i] for i in group]
            if color and at is not None:
                padded = [field.format(v) for field, v in zip(fields, values, strict=True)]
                code = TONE_ANSI.get(state_tone(line.state))
                padded[at] = _styled(padded[at], code or "", code is not None)
                text = GAP.join(padded).rstrip()
            else:
                text = row_format.format(*values).rstrip()
            out.append(_styled(text, BOLD, color and line.is_baseline))
    out += _prose([*empty_columns_text(kept), *totals_text(lines), *(f"• {note}" for note in notes(lines))], width)
    return "\n".join(out) + "\n"


def _prose(texts: list[str], width: int) -> list[str]:
    """Lines of prose folded to the screen at spaces (a path or a number is never split)."""
    return [
        line
        for text in texts
        for line in textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]
    ]


def _styled(text: str, code: str, on: bool) -> str:
    return f"{code}{text}{RESET}" if on else text


STATE = HEADERS.index("state")
# Shown even when every cell is blank: what a row is, where it stands, and the notes' column (it is
# last, where column_groups drops it first).
ALWAYS = ("config", "state", "note")


def kept_columns(rows: list[list[str]]) -> list[int]:
    """The terminal's columns: those some row has a value in (and ALWAYS), as indices into HEADERS.
    A column no job has a value in (GPU-h where nothing was accounted) would be a blank table."""
    return [i for i, h in enumerate(HEADERS) if h in ALWAYS or any(row[i] for row in rows)]


def empty_columns_text(kept: list[int]) -> list[str]:
    """One line naming the columns left out for having no value, as the report names them."""
    empty = [h for i, h in enumerate(HEADERS) if i not in kept]
    return [f"no job has a value in: {', '.join(empty)}"] if empty else []


def column_groups(natural: list[int], width: int) -> list[list[int]]:
    """Which columns each stacked table shows: one table when it fits, else tables that each fit the
    screen, packed in order, each led by the config column so a row can be read across tables.

    Notes are repeated in full under the tables, so the note column is the first thing to go. A cell is
    never folded or cut to make a table fit (a number split over two lines reads as two numbers).
    """
    every = list(range(len(natural)))

    def fits(columns: list[int]) -> bool:
        return sum(natural[i] for i in columns) + len(GAP) * (len(columns) - 1) <= width

    for columns in (every, every[:-1]):
        if fits(columns):
            return [columns]
    groups: list[list[int]] = []
    group = [0]
    for i in every[1:-1]:
        if len(group) > 1 and not fits([*group, i]):
            groups.append(group)
            group = [0]
        group.append(i)
    return [*groups, group]


GAP = "   "  # between two columns
NOTE_WIDTH = 40
BOLD, RESET = "\x1b[1m", "\x1b[0m"


RENDERERS = {"table": render_table, "csv": render_csv, "markdown": render_markdown, "json": render_json}
