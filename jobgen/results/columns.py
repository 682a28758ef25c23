"""The summary's numbers and columns, one row each.

`METRICS` names the numbers, `metric_values` reads them from a job; over the jobs of one configuration
(seeds, repeats) every one is mean ± sample standard deviation. CSV and JSON carry each as `<name>`
and `<name>_std`. `COLUMNS` says how a line is shown: header, the terminal's two-line
header, right-aligned or not, and the cell's text. The terminal table, Markdown, the HTML report and
the plot read these two tables; a new column is a row in each (a number) or in COLUMNS alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from jobgen.results.collect import JobRow
from jobgen.results.cost import mfu
from jobgen.states import State


class Stat(NamedTuple):
    """Mean, sample standard deviation (None below two values) and count of one metric (a tuple: a
    summary makes one per job and metric)."""

    mean: float | None
    std: float | None
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stat:
        found = [v for v in values if v is not None]
        if len(found) < 2:
            return cls(found[0], None, 1) if found else NO_VALUE
        mean = math.fsum(found) / len(found)
        var = math.fsum((v - mean) ** 2 for v in found) / (len(found) - 1)
        return cls(mean, math.sqrt(var), len(found))


NO_VALUE = Stat(None, None, 0)  # shared: a Stat is frozen, and most lines of a big sweep have many of these


@dataclass(slots=True)
class Line:
    """One row of the summary: a configuration (its runs combined) or a single job."""

    label: str
    experiment: str
    run: str
    config: dict[str, Any]  # engine, strategy, precision, compile, nodes, devices_per_node, accelerator
    state: str
    n: int
    metrics: dict[str, Stat]
    mem_kind: str  # "gpu" when any job measured GPU memory, else "host"
    problem: str = ""
    hint: str = ""
    detail: str = ""  # shown in the note column when there is no problem
    excluded: tuple[str, ...] = ()  # slurm.retries: the nodes its jobs' retries excluded, sorted
    speedup: float | None = None
    scaling_efficiency: float | None = None  # speed-up ÷ (devices ÷ the baseline's devices)
    is_baseline: bool = False
    jobs: list[JobRow] = field(default_factory=list)


# The summary's numbers, in order; metric_values gives a job's value of each.
METRICS = (
    "queue_wait_s",
    "train_s",
    "samples_per_s",
    "peak_mem_mb",
    "best_val_acc",
    "test_acc",
    "test_f1",
    # The job's primary metric (result.json primary_metric: accuracy, mcc, pearson...): what picked its
    # best epoch. The line names it (primary_metric); a line whose jobs name different ones has none.
    "test_primary",
    "val_primary",
    "requeues",
    "retries",  # slurm.retries: requeues after a failure, by the batch shell (part of the requeues)
    "val_acc_so_far",  # from metrics.csv of jobs that have no result (yet): how far they got
    # What it cost (jobgen.results.cost): every attempt, from sacct, else from the request.
    "mfu",
    "gpu_hours",
    "cpu_hours",
    "energy_kwh",
    "time_used_fraction",
)
COUNTS = frozenset({"requeues", "retries"})  # count things: a whole mean is written as an integer
NEVER_RAN = frozenset({State.DRY_RUN, State.NOT_SUBMITTED, State.WAITING})
_NO_RESULT = (None,) * 10


def metric_values(job: JobRow) -> tuple[float | None, ...]:
    """The job's value of each of METRICS, in order; None where it has none (left out, not zero)."""
    r, usage = job.result, job.usage
    retries: float | None = None
    if job.retries is not None:  # the batch shell's record says; a job that ran without one was never retried
        retries = float(job.retries.used)
    elif job.state not in NEVER_RAN:
        retries = 0.0
    if r is None:
        found: tuple[float | None, ...] = _NO_RESULT
    else:
        found = (
            r.train_s,
            r.samples_per_s,
            # GPU memory is what limits a fine-tune; host RSS stands in on CPU runs.
            r.peak_gpu_mb if r.peak_gpu_mb is not None else r.peak_host_mb,
            r.best_val_acc,
            r.test_acc,
            r.test_f1,
            r.test_primary,
            r.val_primary,
            None if r.requeue_count is None else float(r.requeue_count),
            _mfu(r),
        )
    return (
        job.queue_wait_s,
        *found[:9],
        retries,
        job.partial_val_acc if r is None else None,
        found[9],
        *((None,) * 4 if usage is None else (usage.gpu_hours, usage.cpu_hours, usage.energy_kwh, usage.time_used)),
    )


def _mfu(result: Any) -> float | None:
    if result.accelerator != "gpu":
        return None  # a CPU job has no GPU peak to compare with
    devices = result.world_size or (result.nodes or 0) * (result.devices_per_node or 0)
    return mfu(result.gpus, result.precision, result.parameters, result.tokens_per_s, devices)


# Summed over every job (not over the lines' means) into the sweep's totals.
SUMMED = ("gpu_hours", "cpu_hours", "energy_kwh")


def cost_metric(lines: Iterable[Line]) -> tuple[str, str]:
    """What a chart of cost shows: (metric, its name): GPU-hours, or CPU-hours where no job held a GPU."""
    used_gpus = any(job.usage is not None and job.usage.gpu_hours for ln in lines for job in ln.jobs)
    return ("gpu_hours", "GPU-hours") if used_gpus else ("cpu_hours", "CPU-hours")


def duration(seconds: float) -> str:
    """12.3s, 4m05s, 2h03m: short enough for a table cell."""
    if round(seconds, 1) < 60:  # 59.96 s is 1m00s, not "60.0s"
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(round(seconds / 60), 60)  # to the nearest minute: 1h21m31s is 1h22m
    return f"{hours}h{minutes:02d}m"


def whole_seconds(seconds: float) -> str:
    """A duration from times recorded to the second (queue wait): no tenths it cannot know."""
    whole = round(seconds)
    return f"{whole}s" if whole < 60 else duration(whole)


def _percent(value: float) -> str:
    return f"{100 * value:.1f}"  # the header carries the unit


def amount(value: float) -> str:
    """Three significant digits, never in exponent form (0.00123, 1.23, 12.3, 1,234)."""
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{2 - math.floor(math.log10(abs(value)))}f}"


def _stat(stat: Stat, show: Callable[[float], str]) -> str:
    """ "mean" or "mean ± std"."""
    if stat.mean is None:
        return ""
    return show(stat.mean) + ("" if stat.std is None else f" ± {show(stat.std)}")


def _metric(name: str, show: Callable[[float], str]) -> Callable[[Line], str]:
    # Most lines of a big sweep have no value in most columns: those cost no call of _stat.
    return lambda line: "" if (stat := line.metrics[name]).mean is None else _stat(stat, show)


def _shape(line: Line) -> str:
    """nodes × devices per node; devices that are CPU processes say so (a CPU job has no GPUs)."""
    c = line.config
    if not (c["nodes"] or c["devices_per_node"]):
        return ""
    shape = f"{c['nodes'] or '?'}×{c['devices_per_node'] or '?'}"
    return f"{shape} cpu" if c.get("accelerator") == "cpu" else shape


def _memory(line: Line) -> str:
    memory = _stat(line.metrics["peak_mem_mb"], "{:,.0f}".format)
    return f"{memory} {line.mem_kind}" if memory else ""


def _best_val(line: Line) -> str:
    so_far = line.metrics["val_acc_so_far"]
    return _stat(line.metrics["best_val_acc"], _percent) or (
        f"({_stat(so_far, _percent)} so far)" if so_far.mean is not None else ""
    )


def _speedup(line: Line) -> str:
    return "baseline" if line.is_baseline else ("" if line.speedup is None else f"{line.speedup:.2f}×")


def _efficiency(line: Line) -> str:
    return "" if line.scaling_efficiency is None else _percent(line.scaling_efficiency)


def primary_metric(line: Line) -> str | None:
    """The primary metric the line's jobs name, when they all name the same one."""
    names = {job.result.primary_metric for job in line.jobs if job.result is not None}
    names.discard(None)
    return names.pop() if len(names) == 1 else None


def _primary(name: str) -> Callable[[Line], str]:
    def cell(line: Line) -> str:
        stat = line.metrics[name]
        metric = primary_metric(line)
        if stat.mean is None or metric is None:
            return ""
        return f"{metric} {_stat(stat, '{:.4f}'.format)}"

    return cell


def predictions(line: Line) -> list[str]:
    """The line's jobs' predictions.csv files (training.save_predictions), as paths."""
    return [
        f"{job.job_dir}/{job.result.predictions}"
        for job in line.jobs
        if job.result is not None and job.result.predictions and job.job_dir
    ]


def _predictions(line: Line) -> str:
    found = predictions(line)
    return found[0] if len(found) == 1 else f"{len(found)} files" if found else ""


def _config(key: str) -> Callable[[Line], str]:
    return lambda line: line.config[key] or ""


@dataclass(frozen=True)
class Column:
    header: str  # Markdown, the plain table and the report; the unit in brackets
    cell: Callable[[Line], str]
    numeric: bool = False  # right-aligned
    terminal: str = ""  # the rich table's header, folded on two lines ("" = header)


COLUMNS = (
    Column("config", lambda line: line.label + (f" (n={line.n})" if line.n > 1 else "")),
    Column("engine", _config("engine")),
    Column("strategy", _config("strategy")),
    Column("precision", _config("precision"), terminal="preci-\nsion"),
    Column(
        "compile", lambda line: "" if line.config["compile"] is None else ("yes" if line.config["compile"] else "no")
    ),
    Column("nodes×GPUs", _shape, terminal="nodes\n×GPUs"),
    Column("state", lambda line: line.state),
    Column("queue wait", _metric("queue_wait_s", whole_seconds), numeric=True, terminal="queue\nwait"),
    Column("train time", _metric("train_s", duration), numeric=True, terminal="train\ntime"),
    Column("samples/s", _metric("samples_per_s", "{:,.1f}".format), numeric=True, terminal="samples\n/s"),
    Column("peak mem (MB)", _memory, numeric=True, terminal="peak mem\n(MB)"),
    Column("best val acc (%)", _best_val, numeric=True, terminal="best val\nacc (%)"),
    Column("test acc (%)", _metric("test_acc", _percent), numeric=True, terminal="test acc\n(%)"),
    Column("test F1 (%)", _metric("test_f1", _percent), numeric=True, terminal="test F1\n(%)"),
    Column("val metric", _primary("val_primary"), numeric=True, terminal="val\nmetric"),
    Column("test metric", _primary("test_primary"), numeric=True, terminal="test\nmetric"),
    Column("requeues", _metric("requeues", "{:g}".format), numeric=True, terminal="re-\nqueues"),
    Column("retries", _metric("retries", "{:g}".format), numeric=True, terminal="re-\ntries"),
    Column("speed-up", _speedup, numeric=True, terminal="speed-\nup"),
    Column("scaling eff. (%)", _efficiency, numeric=True, terminal="scaling\neff. (%)"),
    Column("MFU (%)", _metric("mfu", _percent), numeric=True, terminal="MFU\n(%)"),
    Column("GPU-h", _metric("gpu_hours", amount), numeric=True),
    Column("CPU-h", _metric("cpu_hours", amount), numeric=True),
    Column("energy (kWh)", _metric("energy_kwh", amount), numeric=True, terminal="energy\n(kWh)"),
    Column("time used (%)", _metric("time_used_fraction", _percent), numeric=True, terminal="time\nused (%)"),
    Column("predictions", _predictions),
    Column("note", lambda line: line.problem or line.detail),
)
