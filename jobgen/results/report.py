"""`jobgen report`: one self-contained HTML page to share a sweep's results.

The numbers come from the same rows as `jobgen summary` (collect -> build_lines -> cells, one row per
job); the curves from each job's metrics.csv. Charts are inline SVG drawn by jobgen.results.charts: the page
loads nothing (no network, no CDN, no script), so it opens from a mail attachment or a shared disk.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from urllib.parse import quote_from_bytes

from jobgen import __version__
from jobgen.errors import JobgenError
from jobgen.record.model import Run
from jobgen.record.store import redactor
from jobgen.results import logs
from jobgen.results.charts import Series, color, line_chart, scatter_chart, time_unit, zoomed_range
from jobgen.results.collect import JobRow, LiveStates, collect, read_metrics
from jobgen.results.columns import Line, cost_metric
from jobgen.results.labels import text_width
from jobgen.results.summary import (
    HEADERS,
    NUMERIC,
    apply_baseline,
    build_lines,
    cells,
    speedup_caption,
    state_tone,
    totals_text,
)

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.meta { color: #666; margin: 0 0 16px; }
table.summary { border-collapse: collapse; font-size: 12.5px; margin: 0 0 14px; }
table.summary th, table.summary td { border-bottom: 1px solid #ddd; padding: 4px 6px; text-align: left;
  vertical-align: top; white-space: nowrap; }
table.summary th { background: #f4f4f4; white-space: normal; }
table.summary td.config { white-space: normal; max-width: 220px; overflow-wrap: anywhere; }
table.summary td.note { white-space: normal; max-width: 240px; overflow-wrap: anywhere; }
table.summary td.logs { white-space: normal; max-width: 130px; overflow-wrap: anywhere; }
table.summary td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.summary .sd { color: #666; font-size: 11.5px; }
tr.baseline td { font-weight: 600; }
.state-done { color: #1a7f37; } .state-running { color: #0969da; } .state-waiting { color: #9a6700; }
.state-planned { color: #57606a; } .state-bad { color: #cf222e; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
svg.chart { background: #fff; border: 1px solid #e3e3e3; }
svg .title { font-size: 14px; font-weight: 600; text-anchor: middle; }
svg .label { font-size: 12px; text-anchor: middle; fill: #444; }
svg .tick, svg .point { font-size: 11px; fill: #555; }
svg .grid { stroke: #eee; } svg .frame { fill: none; stroke: #999; } svg .leader { stroke: #aaa; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; margin: 4px 0 8px; font-size: 12.5px; }
.legend span::before { content: ""; display: inline-block; width: 14px; height: 4px; margin-right: 5px;
  vertical-align: middle; background: var(--c); }
ul.problems li { margin-bottom: 6px; } .hint { color: #555; }
details summary { cursor: pointer; color: #555; }
pre.log { font-size: 11.5px; background: #f6f6f6; padding: 6px 8px; max-height: 420px; overflow: auto;
  white-space: pre-wrap; overflow-wrap: anywhere; }
code { font-size: 12px; }
"""


def build_report(
    runs: Sequence[Run | Path],
    baseline: str | None = None,
    live_states: LiveStates | None = None,
    created: str | None = None,
) -> str:
    """The report's HTML for these runs: one page that needs nothing beside it but the runs' log files.
    `created`: what the page says of when it was made (default: now)."""
    lines = build_lines(collect(runs, live_states), combine=False)
    apply_baseline(lines, baseline)
    colors = {id(line): color(i) for i, line in enumerate(lines)}
    experiments = ", ".join(dict.fromkeys(line.experiment for line in lines)) or "no jobs"
    names = ", ".join(escape(str(r.run_dir if isinstance(r, Run) else r)) for r in runs)
    created = created or made_at()
    body = [
        f"<h1>{escape(experiments)}</h1>",
        f'<p class="meta">{len(lines)} job(s) from {names} &middot; jobgen {__version__} &middot; {created}</p>',
        "<h2>Summary</h2>",
        _table(lines, colors),
        *(f'<p class="meta">{escape(caption)}</p>' for caption in speedup_caption(lines)),
        *(f'<p class="meta">{escape(total)}</p>' for total in totals_text(lines)),
        "<h2>Time, cost and accuracy</h2>",
        _tradeoff(lines, colors),
        "<h2>Curves</h2>",
        _legend(lines, colors),
        _curves(lines, colors),
        *_rungs(lines, colors),
        *_problems(lines),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>jobgen report: {escape(experiments)}</title><style>{CSS}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _rungs(lines: list[Line], colors: dict[int, str]) -> list[str]:
    """A halving run's rungs: the metric by rung, one line per job (jobgen.results.halving)."""
    from jobgen.results.halving import rung_chart

    chart = rung_chart(lines, colors)
    return ["<h2>Rungs</h2>", f'<div class="charts">{chart}</div>'] if chart else []


def made_at() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def report_page(run_dirs: Sequence[Path], out: Path, *, refresh: bool = False, baseline: str | None = None) -> Path:
    """Write `jobgen report`'s page of these runs to `out`: the runs read (states settled, Slurm and the
    accounting asked once), what was read of their records saved in each run's index."""
    from jobgen.results.collect import look_and_keep
    from jobgen.results.state_rule import read_some

    check_folder(out)
    loaded = read_some(run_dirs, refresh=refresh)
    look_and_keep([run for run in loaded if isinstance(run, Run)])
    html = build_report(loaded, baseline)
    for run in loaded:
        if isinstance(run, Run):
            run.save_index()
    return write_page(out, html)


def check_folder(out: Path) -> None:
    if not out.parent.is_dir():  # no folder is made for the page: a typo in it would hide the report
        raise JobgenError(
            f"{out}: the folder {out.parent} does not exist; create it first or write the report elsewhere"
        )


def write_page(out: Path, html: str) -> Path:
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, out)
    return out


def _table(lines: list[Line], colors: dict[int, str]) -> str:
    """The summary as one table, or as several stacked ones (each led by the config) where one would be
    wider than TABLE_PX: the page never scrolls sideways on a 1000-px screen. Columns that no job has a
    value in are left out, and a line says which."""
    rows = [cells(line) for line in lines]
    # The predictions files are linked in the logs column, by name, rather than spelled out as paths.
    shown = [i for i, h in enumerate(HEADERS) if h in ALWAYS or (h not in LINKED and any(row[i] for row in rows))]
    empty = [h for i, h in enumerate(HEADERS) if i not in shown and h not in LINKED]
    log_cells = [_log_links(line.jobs) for line in lines]
    widths = {i: _column_px(HEADERS[i], [row[i] for row in rows]) for i in shown}
    widths[LOGS] = LOGS_PX
    groups = _fold([*(i for i in shown if HEADERS[i] != "config"), LOGS], widths, TABLE_PX - widths[0])
    # Each cell's HTML once: the config cell leads every stacked table.
    configs = [_cell(line, HEADERS[0], values[0], colors) for line, values in zip(lines, rows, strict=True)]
    tables = []
    for group in groups:
        # The config keeps its width: where the browser must narrow a table, headers wrap first.
        head = f'<th style="min-width:{widths[0] - 12:.0f}px">config</th>'
        head += "".join("<th>logs</th>" if i == LOGS else f"<th>{escape(HEADERS[i])}</th>" for i in group)
        body = []
        for line, values, links, config in zip(lines, rows, log_cells, configs, strict=True):
            tds = [
                f'<td class="logs">{links}</td>' if i == LOGS else _cell(line, HEADERS[i], values[i], colors)
                for i in group
            ]
            attrs = ' class="baseline"' if line.is_baseline else ""
            body.append(f"<tr{attrs}>{config}{''.join(tds)}</tr>")
        tables.append(f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')
    note = f'<p class="meta">no job has a value in: {escape(", ".join(empty))}</p>' if empty else ""
    return "\n".join(tables) + note


# Widths the summary tables are packed to: a 1000-px screen less the page's margins, with room to spare.
TABLE_PX = 900
LOGS, LOGS_PX = -1, 130  # the logs column, last, after the summary's columns
CONFIG_MAX_PX, NOTE_MAX_PX = 220, 240  # these two wrap (CSS max-width), every other cell stays whole
ALWAYS = ("config", "state")
LINKED = ("predictions",)  # columns the logs column links instead
CLASSES = {"config": "config", "note": "note"}
NOTE_CHARS = 60


def _cell(line: Line, header: str, value: str, colors: dict[int, str]) -> str:
    css = "num" if header in NUMERIC else CLASSES.get(header, "")
    if header == "state":
        css = "state-" + state_tone(line.state)
    text = escape(value)
    if header == "note" and len(value) > NOTE_CHARS:  # the whole cause is under "Jobs without a result"
        text = f'<span title="{escape(value)}">{escape(value[: NOTE_CHARS - 1])}&hellip;</span>'
    if header == "config":
        # Long sweep labels may wrap after their separators, never inside a value (a replace per kind).
        for separator in _BREAKS:
            if separator in text:
                text = text.replace(separator, separator + "<wbr>")
        text = f'<span style="color:{colors[id(line)]}">&#9632;</span> {text}'
    if " ± " in value:  # the spread goes under the mean: the column stays narrow and no number is split
        mean, spread = value.split(" ± ", 1)
        text = f'{escape(mean)}<br><span class="sd">± {escape(spread)}</span>'
    return f'<td class="{css}">{text}</td>' if css else f"<td>{text}</td>"


_BREAKS = "_/,="  # where a config label may wrap; "<wbr>" holds none of them


def _column_px(header: str, values: list[str]) -> float:
    """How wide a column is drawn (estimated from the text; headers wrap between words)."""
    widest_word = max(text_width(word, 12.5) * 1.1 for word in header.split())  # bold
    # Measured on the longest few texts only: width follows length, and a big report stays quick.
    # Of texts as long, the first the table shows: the same page in every process (a set's order
    # follows the strings' hashes, which differ from one process to the next).
    texts = dict.fromkeys(values)
    if " ± " in "\n".join(texts):  # a mean with its spread (a combined line): each measured apart
        texts = dict.fromkeys(part for v in texts for part in v.split(" ± "))
    widest = max((text_width(part, 12.5) for part in heapq.nlargest(8, texts, key=len)), default=0.0)
    if header == "config":
        widest += 16  # the colour swatch before the label
    cap = CONFIG_MAX_PX if header == "config" else NOTE_MAX_PX if header == "note" else widest
    return max(widest_word, min(widest, cap)) + 12  # + padding


def _fold(columns: list[int], widths: dict[int, float], budget: float) -> list[list[int]]:
    """The columns in order, cut into groups that each fit `budget` pixels."""
    groups: list[list[int]] = [[]]
    used = 0.0
    for i in columns:
        if groups[-1] and used + widths[i] > budget:
            groups.append([])
            used = 0.0
        groups[-1].append(i)
        used += widths[i]
    return groups


def _log_links(jobs: list[JobRow]) -> str:
    links: list[str] = []
    for job in jobs:
        links.extend(f'<a href="{_href(path)}">{escape(path.name)}</a>' for path in _logs(job))
        if job.result is not None and job.result.predictions and job.job_dir:  # train.save_predictions
            path = os.path.join(job.job_dir, job.result.predictions)
            links.append(f'<a href="{_href(path)}">{escape(job.result.predictions)}</a>')
    return " ".join(links) or "&mdash;"


def _logs(job: JobRow) -> list[Path]:
    """The job's logs, oldest first: listed once per command for a job read from its run."""
    if job.source is not None:
        return logs.of(job.source, job.backend)
    return logs.files(job.backend, Path(job.job_dir)) if job.job_dir else []


def _href(path: Path | str) -> str:
    """An absolute file:// link: it keeps working when the page is copied, mailed or opened from
    anywhere on a machine that sees the run's folder (a link relative to the page breaks once the page
    moves without the runs)."""
    # Path.as_uri() of the absolute path, without resolve() (a syscall per folder).
    return escape("file://" + quote_from_bytes(os.fsencode(os.path.abspath(path))))


def _tradeoff(lines: list[Line], colors: dict[int, str]) -> str:
    timed = [ln for ln in lines if ln.metrics["train_s"].mean is not None and ln.metrics["test_acc"].mean is not None]
    divisor, unit = time_unit(max((ln.metrics["train_s"].mean or 0.0) for ln in timed) if timed else 0.0)
    points = [
        (
            ln.label,
            (ln.metrics["train_s"].mean or 0.0) / divisor,
            100 * (ln.metrics["test_acc"].mean or 0.0),
            colors[id(ln)],
        )
        for ln in timed
    ]
    y_range = zoomed_range([p[2] for p in points], 0.0, 100.0) if points else None
    chart = scatter_chart(
        "Training time vs test accuracy",
        f"training time ({unit})",
        "test accuracy (%)",
        points,
        y_range=y_range,
        height=380,  # two side by side on a laptop's screen: the default width
    )
    return f'<div class="charts">{chart}{_cost_chart(lines, colors)}</div>'


def _cost_chart(lines: list[Line], colors: dict[int, str]) -> str:
    """What each job cost (GPU-hours, or CPU-hours where no job held a GPU) against its test accuracy."""
    metric, what = cost_metric(lines)
    priced = [ln for ln in lines if ln.metrics[metric].mean is not None and ln.metrics["test_acc"].mean is not None]
    points = [
        (ln.label, ln.metrics[metric].mean or 0.0, 100 * (ln.metrics["test_acc"].mean or 0.0), colors[id(ln)])
        for ln in priced
    ]
    return scatter_chart(
        f"{what} vs test accuracy",
        f"{what} (all attempts)",
        "test accuracy (%)",
        points,
        y_range=zoomed_range([p[2] for p in points], 0.0, 100.0) if points else None,
        height=380,  # two side by side on a laptop's screen: the default width
        missing="no finished job has both a cost and an accuracy (the Summary's GPU-h and CPU-h columns say why)",
    )


def _legend(lines: list[Line], colors: dict[int, str]) -> str:
    items = "".join(f'<span style="--c:{colors[id(ln)]}">{escape(ln.label)}</span>' for ln in lines)
    return f'<div class="legend">{items}</div>'


def _curves(lines: list[Line], colors: dict[int, str]) -> str:
    """Loss and validation accuracy, over optimizer steps and over wall time, one line per job."""
    loss_step, loss_time, acc_step, acc_time = [], [], [], []
    for line in lines:
        job = line.jobs[0]
        folder = job.job_dir
        # A job the command read says whether it has a metrics.csv without a failed open (most of a
        # sweep that ended without training has none).
        there = job.source.has("metrics.csv") if job.source is not None else bool(folder)
        points = read_metrics(os.path.join(folder, "metrics.csv")) if folder and there else []
        if not points:
            continue  # no curve to draw (line_chart leaves a series without points out)
        train = [p for p in points if p.split == "train" and _ok(p.loss)]
        val = [p for p in points if p.split in ("validation", "val") and _ok(p.acc)]
        c, name = colors[id(line)], line.label
        loss_step.append(Series(name, _pairs([(p.step, p.loss) for p in train]), c))
        loss_time.append(Series(name, _pairs([(p.time_s, p.loss) for p in train]), c))
        acc_step.append(Series(name, _pairs([(p.step, p.acc) for p in val], 100), c))
        acc_time.append(Series(name, _pairs([(p.time_s, p.acc) for p in val], 100), c))
    longest = max((x for s in loss_time + acc_time for x, _ in s.points), default=0.0)
    divisor, unit = time_unit(longest)
    loss_time = [Series(s.name, [(x / divisor, y) for x, y in s.points], s.color) for s in loss_time]
    acc_time = [Series(s.name, [(x / divisor, y) for x, y in s.points], s.color) for s in acc_time]
    accs = [y for s in acc_step + acc_time for _, y in s.points]
    acc_range = zoomed_range(accs, 0.0, 100.0) if accs else None
    charts = [
        line_chart("Training loss", "optimizer step", "loss", loss_step),
        line_chart("Training loss over time", f"time since start ({unit})", "loss", loss_time),
        line_chart("Validation accuracy", "optimizer step", "accuracy (%)", acc_step, y_range=acc_range),
        line_chart(
            "Validation accuracy over time", f"time since start ({unit})", "accuracy (%)", acc_time, y_range=acc_range
        ),
    ]
    return f'<div class="charts">{"".join(charts)}</div>'


def _pairs(points: list[tuple[float | None, float | None]], scale: float = 1) -> list[tuple[float, float]]:
    """The (x, y * scale) points where both are finite numbers."""
    return [(x, scale * y) for x, y in points if x is not None and y is not None and _ok(x) and _ok(y)]


def _ok(value: float | None) -> bool:
    return value is not None and value == value and abs(value) != float("inf")


# Of a group of jobs that stopped the same way, the names listed (the rest are counted): a sweep that
# all failed on one bad line is one entry, not one copy of the same log tail per job.
GROUP_NAMES = 12


def _problems(lines: list[Line]) -> list[str]:
    """One entry per way jobs stopped without a usable result (state, what was wrong, the cause's
    kind): its jobs, named or counted, and of the first of them the log link, the hint and the log's
    last lines."""
    groups: dict[tuple[str, str, str], list[Line]] = {}
    for line in lines:
        job = line.jobs[0]
        if not line.problem and job.cause is None:
            continue
        cause = job.cause
        said = line.problem or (cause.message if cause else "")
        groups.setdefault((line.state, said, cause.kind if cause else ""), []).append(line)
    redact = redactor()  # this environment's secrets looked up once, not once per log
    items = []
    for (state, said, _), members in groups.items():
        line = members[0]
        job = line.jobs[0]
        cause = job.cause
        log = ""
        if cause is not None and cause.log:
            path = job.run_dir / cause.log
            log = f' &middot; <a href="{_href(path)}">{escape(cause.log)}</a>'
        hint = f'<div class="hint">&rarr; {escape(line.hint)}</div>' if line.hint else ""
        tails = "".join(_tail(path, redact) for path in _tail_logs(job)) if job.result is None else ""
        items.append(f"<li>{_who(members)} ({escape(state)}): {escape(said)}{log}{hint}{tails}</li>")
    if not items:
        return []
    return ["<h2>Jobs without a result</h2>", f'<ul class="problems">{"".join(items)}</ul>']


def _who(members: list[Line]) -> str:
    """The job, or the jobs of a group: how many, the first GROUP_NAMES of them by name."""
    if len(members) == 1:
        return f"<b>{escape(members[0].label)}</b>"
    names = ", ".join(escape(m.label) for m in members[:GROUP_NAMES])
    more = f" and {len(members) - GROUP_NAMES:,} more" if len(members) > GROUP_NAMES else ""
    return f"<b>{len(members):,} jobs</b> ({names}{more}; the log below is the first one's)"


TAIL_LINES = 40


def _tail_logs(job: JobRow) -> list[Path]:
    """The logs whose end says why a job has no result: the one the diagnosis read, else the newest
    attempt's (out and err)."""
    if job.cause is not None and job.cause.log:
        return [job.run_dir / job.cause.log]
    return [p for p in _logs(job) if p.is_file() and p.stat().st_size][-2:]


def _tail(path: Path, redact: Callable[[str], str]) -> str:
    """The log's last lines inside the page, so that a mailed copy still shows them; secrets taken out."""
    lines = logs.tail(path, TAIL_LINES)
    if not lines:
        return ""
    text = escape(redact("\n".join(lines)))
    return (
        f"<details><summary>last {len(lines)} lines of {escape(path.name)}</summary>"
        f'<pre class="log">{text}</pre></details>'
    )
