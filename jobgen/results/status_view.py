"""`jobgen status` and `jobgen runs`: where each job of a run stands, as a table.

The states come from the one rule (jobgen.results.state_rule); the runs are read through the read model
(jobgen.record.model), with Slurm asked once for all their live jobs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from jobgen.errors import JobgenError
from jobgen.record.model import Run
from jobgen.results import halving as halving_view
from jobgen.results.state_rule import progress, read_runs, settle

HEADER = ["job", "sweep", "job id", "state", "elapsed", "nodes", "exit", "retries", "progress", "source"]


@dataclass(frozen=True)
class StatusView:
    """What `jobgen status` shows of a run: its table, whether every job has ended, and one warning per
    damaged record (RunJob.problems, named under the run folder)."""

    run_dir: Path
    header: list[str]
    rows: list[list[str]]
    all_final: bool
    warnings: list[str]
    notes: tuple[str, ...] = ()  # of the run as a whole (Run.notes: Slurm did not answer)


def read_status(run_dir: Path, refresh: bool = False) -> StatusView:
    """The status of the run at `run_dir`: the run read (its records through its index), Slurm asked once
    about the jobs that may still change, and the states that changed recorded. `refresh` asks Slurm
    about every job."""
    run = status_of(run_dir, refresh)
    halved = halving_view.settings_of(run.manifest)
    said: list[str] = []
    if halved is not None:
        said = halving_view.promote(run, halved)
        if any(" requeued " in line or " cancelled " in line for line in said):
            run = status_of(run_dir, True)
    header, table, all_final = status_table(run, halving_view.labels(run, halved) if halved else None)
    problems = [job.problems() for job in run.jobs]
    run.save_index()
    warnings = [line for lines in problems for line in lines]
    return StatusView(Path(run_dir), header, table, all_final, warnings, notes=(*run.notes, *said))


def status_table(
    run: Run, rungs: dict[str, halving_view.JobRungs] | None = None
) -> tuple[list[str], list[list[str]], bool]:
    """(header, rows, all_final) for `jobgen status` of a run whose states are settled; `rungs`: a
    halving run's jobs (their state shows PAUSED@r or STOPPED@r, their progress the metric per rung)."""
    header = list(HEADER)
    table = []
    for job in run.jobs:
        info = job.live
        sweep = " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in job.sweep.items())
        where = progress(job)
        if info and "segments" in info.extra:  # a chain: which segment, and how each one went
            where = (
                f"segment {info.extra['segment']}/{len(info.extra['segments'])} "
                f"({' '.join(info.extra['segments'])}): {where}"
            )
        source = info.source if info else ("result.json" if job.finished else "manifest")
        halved = rungs.get(job.name) if rungs else None
        if halved is not None and halved.rung_metrics:
            where = "; ".join(part for part in (f"rungs {halving_view.rung_text(halved)}", where) if part)
        table.append(
            [
                job.name,
                sweep,
                ",".join(job.ids) or "-",
                (halved.label() if halved else "") or job.state.value,
                (info.elapsed if info else "") or _recorded_elapsed(job.entry),
                (info.nodelist or info.nodes if info else "") or str(job.entry.get("nodelist") or "-"),
                (info.exit_code if info else "") or _recorded_exit(job.entry.get("exit_code")),
                str(job.retries() or "-"),
                where,
                source,
            ]
        )
    # A promoted job waiting for a slot to resume (WAITING@r) has not ended, whatever its last state.
    resuming = {name for name, view in (rungs or {}).items() if view.outcome == halving_view.WAITING}
    return header, table, all(job.state.is_final and job.name not in resuming for job in run.jobs)


def runs_table(run_dirs: Sequence[Path], root: Path, refresh: bool) -> tuple[list[str], list[list[str]]]:
    """(header, rows) for `jobgen runs`: one row per run with its jobs' states counted; `refresh` asks
    Slurm (once, for every run listed) about the jobs not known to have ended."""
    rows: list[list[str] | Run] = []
    for run_dir in run_dirs:
        try:
            rows.append(Run.load(run_dir))
        except JobgenError as exc:  # one damaged run must not hide the others
            reason = exc.message.split(": damaged: ")[-1]
            rows.append([_name(run_dir, root), "-", "-", "-", f"damaged manifest.json: {reason}"])
    runs = [r for r in rows if isinstance(r, Run)]
    if refresh:
        settle(runs)
    out = []
    for row in rows:
        if not isinstance(row, Run):
            out.append(row)
            continue
        planned = halving_view.ended_as_planned(row)
        # A job halving ended at a rung counts as status shows it (STOPPED@1), not as the FAILED under it.
        counts = Counter(
            planned[job.name].label() if job.name in planned else (job.state if refresh else job.recorded).value
            for job in row.jobs
        )
        states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        backend = f"{row.backend} ({row.kind})" if row.kind else row.backend  # a probe: not the latest run
        out.append([_name(row.run_dir, root), _created(row), backend, str(len(row.jobs)), states])
    return ["run", "created", "backend", "jobs", "states" if refresh else "states (last known)"], out


def _recorded_elapsed(entry: dict[str, Any]) -> str:
    """What Slurm last said, else (local backend) the time from start to end, as Slurm writes it."""
    if entry.get("elapsed"):
        return str(entry["elapsed"])
    try:
        start = datetime.fromisoformat(str(entry.get("started_at") or entry["submitted_at"]))
        seconds = int((datetime.fromisoformat(str(entry["ended_at"])) - start).total_seconds())
    except (KeyError, TypeError, ValueError):
        return "-"
    if seconds < 0:
        return "-"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}" if hours or days else f"{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def _recorded_exit(code: object) -> str:
    """The exit code last recorded: Slurm's "3:0", or the local backend's integer (0 included)."""
    return "-" if code is None or code == "" else str(code)


def _name(run_dir: Path, root: Path) -> str:
    return str(run_dir.relative_to(root)) if run_dir.is_relative_to(root) else str(run_dir)


def _created(run: Run) -> str:
    try:
        return datetime.fromisoformat(run.manifest.get("created") or "").astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except (ValueError, TypeError):
        return "-"


def status_of(run_dir: Path, refresh: bool = False) -> Run:
    """The run at `run_dir` with every job's state settled (Slurm asked once) and recorded; its records
    are read and checked once Slurm has answered."""
    from jobgen.results.collect import look_and_keep

    (run,) = read_runs([run_dir], refresh=refresh)
    look_and_keep([run])
    return run


def format_table(header: list[str], rows: list[list[str]]) -> str:
    # One format string for every row: a big sweep's table has a cell per job and column.
    table = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(map(len, col)) for col in zip(*table, strict=False)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(line.format(*row[: len(widths)]).rstrip() for row in table)
