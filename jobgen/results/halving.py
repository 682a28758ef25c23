"""A halving run as `status`, `summary` and the report show it, and the promotions a login node makes.

The rule and the files are training/halving.py's; this module reads them per job (rung reached, the
metric at each rung, the outcome) and settles what the jobs left undecided: `jobgen status` applies
the rule at every rung and requeues a paused job that a decision promoted (the same decision twice is
harmless: the decision files are created once, a pending job is not requeued again).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobgen.states import State
from training import halving

STATES = {state.value for state in State}

FINISHED, PAUSED, STOPPED, RUNNING = "finished", "paused", "stopped", "running"
# Paused, then promoted, and not requeued yet: in a run that waves, it waits for a slot in the queue.
WAITING = "waiting"


@dataclass(frozen=True)
class JobRungs:
    """One job of a halving run: the metric at each rung it reached (in rung order) and its outcome."""

    rung: int | None  # the last rung reached, in epochs
    reached: tuple[int, ...]  # the rungs it reported at
    rung_metrics: tuple[float, ...]
    outcome: str  # finished, paused, stopped, running
    promoted: tuple[int, ...]  # the rungs it was promoted past
    metric: str = ""  # the validation metric of rung_metrics (val_metrics' name), as the job reported it

    def label(self) -> str:
        """How the state column shows a job that halving ended or that waits to resume: 'PAUSED@3',
        'STOPPED@1', 'WAITING@1' (promoted past rung 1, not in the queue yet); '' otherwise."""
        return f"{self.outcome.upper()}@{self.rung}" if self.outcome in (PAUSED, STOPPED, WAITING) else ""


def settings(run_dir: Path) -> halving.Settings | None:
    """settings_of the run's manifest file."""
    try:
        return settings_of(json.loads((Path(run_dir) / "manifest.json").read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def settings_of(manifest: Any) -> halving.Settings | None:
    """The run's halving settings (its manifest's "halving"), None for a run without halving."""
    raw = manifest.get("halving") if isinstance(manifest, dict) else None
    try:
        return halving.Settings.from_record(raw) if raw else None
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Board:
    """Every rung's reports and decisions of one run, read once."""

    settings: halving.Settings
    reports: dict[int, dict[str, dict[str, Any]]]
    promoted: dict[int, set[str]]
    requeued: dict[int, set[str]]  # the jobs someone requeued (or is requeueing) for their promotion

    @classmethod
    def read(cls, run_dir: Path, found: halving.Settings) -> Board:
        base = halving.root(run_dir)
        return cls(
            found,
            {r: halving.read_reports(base, r) for r in found.rungs},
            {r: halving.promoted(base, r) for r in found.rungs},
            _requeued(base, found),
        )

    def job(self, name: str, finished: bool, ended: bool, sweep_ended: bool) -> JobRungs:
        """`finished`: it wrote its result; `ended`: it is neither queued nor running; `sweep_ended`:
        no job of the run is (no report can come that would promote it)."""
        reached = [r for r in self.settings.rungs if name in self.reports[r]]
        metrics = tuple(float(self.reports[r][name]["metric"]) for r in reached)
        passed = tuple(r for r in reached if name in self.promoted[r])
        last = reached[-1] if reached else None
        if finished:
            outcome = FINISHED
        elif ended and last is not None and last not in passed:
            outcome = STOPPED if sweep_ended else PAUSED
        elif ended and last is not None and name not in self.requeued[last]:
            outcome = WAITING
        else:
            outcome = RUNNING
        return JobRungs(last, tuple(reached), metrics, outcome, passed, self.metric(name))

    def metric(self, name: str = "") -> str:
        """The validation metric the rungs compare: as `name`'s reports (or any job's) name it, else as
        the settings do; '' while that is the jobs' primary metric and no job has reported."""
        for rung in self.settings.rungs:
            for job, found in self.reports[rung].items():
                if (not name or job == name) and isinstance(found.get("name"), str) and found["name"]:
                    return halving.canonical(found["name"])
        named = self.settings.metric
        return "" if named == halving.PRIMARY else named

    def resuming(self, name: str) -> bool:
        """The job was promoted past the last rung it reached and nobody requeued it yet: should it have
        ended, it runs again, and its reports may promote others."""
        reached = [r for r in self.settings.rungs if name in self.reports[r]]
        return bool(reached) and name in self.promoted[reached[-1]] and name not in self.requeued[reached[-1]]

    def waiting(self, names: Iterable[str]) -> list[tuple[str, int]]:
        """(job, rung) for each job promoted past its last rung reached: it must run again to go on."""
        out = []
        for name in names:
            reached = [r for r in self.settings.rungs if name in self.reports[r]]
            if reached and name in self.promoted[reached[-1]]:
                out.append((name, reached[-1]))
        return out


def _names(folder: Path) -> set[str]:
    try:
        return {p.name for p in folder.iterdir() if not p.name.startswith(".")}
    except OSError:
        return set()


def ended(job: Any, board: Board) -> bool:
    """Whether a read job (states settled) is neither queued to run nor running: its state is final, or
    it is a chain (slurm.chain) whose segment paused at the last rung it reached, not promoted past it:
    its later segments are held (pending, none running), a promotion requeues the paused segment."""
    if job.state.is_final:
        return True
    if not getattr(job, "segments", ()) or job.state not in (State.PENDING, State.SUBMITTED):
        return False
    reached = [r for r in board.settings.rungs if job.name in board.reports[r]]
    return bool(reached) and job.name not in board.promoted[reached[-1]]


def _segment_states(job: Any) -> dict[str, str]:
    """A chain's segment id -> its state as last read; {} for any other job or an unread chain."""
    info = job.live
    states = info.extra.get("segments") if info is not None else None
    if not job.segments or not isinstance(states, list) or len(states) != len(job.segments):
        return {}
    return dict(zip(job.segments, states, strict=True))


def held_segments(job: Any) -> list[str]:
    """The segments of a chain that have not ended (held behind a paused one); [] for any other job."""
    return [sid for sid, state in _segment_states(job).items() if state in ("PENDING", "SUBMITTED")]


def settle(run_dir: Path, found: halving.Settings) -> list[tuple[int, str]]:
    """Apply the rule at every rung to the reports on disk; the (rung, job) promotions this call made."""
    base = halving.root(run_dir)
    return [(rung, job) for rung in found.rungs for job in halving.settle(base, rung, found)]


def requeue_id(run_dir: Path, found: halving.Settings, name: str, rung: int) -> str | None:
    """The id `scontrol requeue` takes for a job, as it reported it at `rung` (`<array>_<task>`)."""
    report = halving.read_reports(halving.root(run_dir), rung).get(name) or {}
    value = report.get("requeue_id")
    return str(value) if value else None


def _requeued(base: Path, found: halving.Settings) -> dict[int, set[str]]:
    return {r: _names(base / "requeued" / str(r)) for r in found.rungs}


def requeued_jobs(run: Any) -> set[str]:
    """The jobs of a read run that someone requeued for a promotion (a job may have done it, unrecorded);
    none for a run without halving."""
    found = settings_of(run.manifest)
    return set().union(*_requeued(halving.root(run.run_dir), found).values()) if found else set()


def ended_as_planned(run: Any) -> dict[str, JobRungs]:
    """The jobs of a read run (states settled) that halving paused or stopped at a rung, or that wait to
    resume past one, as it sees them ('PAUSED@1', ...): no failures, whatever their state under it.
    {} for a run without halving."""
    found = settings_of(run.manifest)
    return {name: view for name, view in labels(run, found).items() if view.label()} if found else {}


def labels(run: Any, found: halving.Settings) -> dict[str, JobRungs]:
    """Each job of a read run (jobgen.record.model.Run, states settled) as halving sees it."""
    board = Board.read(run.run_dir, found)
    over = {job.name: ended(job, board) for job in run.jobs}
    # A promoted job that has not resumed yet may still promote others: the sweep has not ended.
    sweep_ended = all(over[job.name] and (job.finished or not board.resuming(job.name)) for job in run.jobs)
    return {job.name: board.job(job.name, job.finished, over[job.name], sweep_ended) for job in run.jobs}


def promote(run: Any, found: halving.Settings) -> list[str]:
    """What a `jobgen status` does for a halving run: apply the rule at every rung, then requeue each
    ended job that a decision promoted past its last rung (a local run's runner resumes its own). Lines
    saying what it did; a requeue Slurm refuses is said, not raised (the next status tries again)."""
    from jobgen import backends
    from jobgen.errors import JobgenError

    if halving.cancelled(halving.root(run.run_dir)):
        return []  # cancelled (jobgen cancel): nothing is promoted or requeued until a jobgen requeue
    said = [f"halving: promoted {job} past rung {rung}" for rung, job in settle(run.run_dir, found)]
    backend = backends.get(run.manifest.get("backend", ""))
    if backend.runs_here or (Path(run.run_dir) / halving.WAVES).exists():
        return said  # a local run's runner resumes its own; a run in waves, its top-ups (a slot each)
    jobs = {job.name: job for job in run.jobs}
    board = Board.read(run.run_dir, found)
    for name, rung in board.waiting(jobs):
        job = jobs[name]
        if job.finished or not (job.state.is_final or _paused_in_chain(job, board, rung)):
            continue  # finished, or already queued or running again
        target = requeue_id(run.run_dir, found, name, rung) or job.job_id
        base = halving.root(run.run_dir)
        if not target or not halving.first_requeue(base, rung, name):
            continue  # requeued once for this promotion already (by a job or an earlier status)
        try:
            backend.requeue(target, what=f"requeueing {name}, promoted past rung {rung}")
            said.append(f"halving: requeued {name} ({target}): promoted past rung {rung}")
        except JobgenError as exc:
            halving.forget_requeue(base, rung, name)
            said.append(f"halving: could not requeue {name} ({target}): {exc}")
    return said + cancel_stopped(run, found, backend)


def _paused_in_chain(job: Any, board: Board, rung: int) -> bool:
    """A chain whose segment that reported at `rung` ended (paused there), its later segments held: it
    waits for its requeue, though the chain's state is pending."""
    if job.state not in (State.PENDING, State.SUBMITTED):
        return False
    target = str(board.reports[rung].get(job.name, {}).get("requeue_id") or "")
    state = _segment_states(job).get(target)
    return state in STATES and State(state).is_final


def cancel_stopped(run: Any, found: halving.Settings, backend: Any) -> list[str]:
    """Cancel the held segments of each chain halving stopped (the sweep has ended: no report can promote
    it): held, they would stay in the queue, counted against its limits, for ever. Lines saying so."""
    from jobgen.errors import JobgenError

    said = []
    for name, view in labels(run, found).items():
        job = next(j for j in run.jobs if j.name == name)
        held = held_segments(job) if view.outcome == STOPPED else []
        if not held:
            continue
        try:
            backend.cancel(held)
            said.append(f"halving: cancelled {name}'s held segments {' '.join(held)}: stopped at rung {view.rung}")
        except JobgenError as exc:
            said.append(f"halving: could not cancel {name}'s held segments {' '.join(held)}: {exc}")
    return said


def rung_text(job: JobRungs) -> str:
    """'accuracy 1:0.6120> 3:0.7010' (the metric, then epochs:metric at each rung reached, promotions
    marked with '>')."""
    pairs = zip(job.reached, job.rung_metrics, strict=True)
    text = " ".join(f"{r}:{m:.4f}" + (">" if r in job.promoted else "") for r, m in pairs)
    return f"{job.metric} {text}" if job.metric else text


def resume_local(run_dir: Path, found: halving.Settings, jobs: list[dict[str, Any]], run_one: Any) -> list[str]:
    """The local backend's halving: after every job has run once, in order, each job a decision promoted
    past the rung it paused at runs again (`run_one(entry)`: it resumes from its checkpoint), until no
    promoted job waits; the names, in the order they resumed. A job resumes at most once per rung."""
    done: set[tuple[str, int]] = set()
    order: list[str] = []
    by_name = {entry["name"]: entry for entry in jobs}
    while True:
        settle(run_dir, found)
        board = Board.read(run_dir, found)
        waiting = [
            (name, rung)
            for name, rung in board.waiting(by_name)
            if (name, rung) not in done and not (run_dir / by_name[name]["dir"] / "result.json").exists()
        ]
        if not waiting:
            return order
        name, rung = waiting[0]
        done.add((name, rung))
        order.append(name)
        halving.first_requeue(halving.root(run_dir), rung, name)  # what a requeue marks on Slurm
        run_one(by_name[name])


# --- summary ---------------------------------------------------------------------------------------------


def rungs_of(run: Any) -> Callable[[Any, bool], JobRungs | None]:
    """A function of a job of this read run (states settled) and whether it wrote a usable result: the
    job as a summary sees it, the run's board read once. None for every job of a run without halving."""
    found = settings_of(run.manifest)
    if found is None:
        return lambda job, finished: None
    board = Board.read(run.run_dir, found)
    over = {job.name: ended(job, board) for job in run.jobs}
    # A promoted job that has not resumed yet may still promote others: the sweep has not ended.
    sweep_ended = all(over[job.name] and (job.finished or not board.resuming(job.name)) for job in run.jobs)
    return lambda job, finished: board.job(job.name, finished, over.get(job.name, job.state.is_final), sweep_ended)


FIELDS = ("outcome", "rung", "rung_metrics", "rung_metric")


def fields(jobs: list[Any]) -> dict[str, Any]:
    """`summary --format json` row fields: outcome, rung (last reached, epochs), rung_metrics (in rung
    order) and rung_metric (the validation metric they are, val_metrics' name; None before any report of
    a run that compares the jobs' primary metric); None for a line of several jobs (seeds) or a run
    without halving."""
    view = jobs[0].rungs if len(jobs) == 1 else None
    if view is None:
        return dict.fromkeys(FIELDS)
    return {
        "outcome": view.outcome,
        "rung": view.rung,
        "rung_metrics": [round(m, 6) for m in view.rung_metrics],
        "rung_metric": view.metric or None,
    }


def totals(jobs: list[Any], kind: str) -> dict[str, Any]:
    """For a summary with halving runs: the hours used (`kind`: gpu_hours or cpu_hours, as the jobs held)
    and full_sweep_hours, each job's hours scaled to train.epochs by the epochs it trained (its last
    rung, or all of them once finished); None when a job that ran has no hours or no epoch count. A
    local run's jobs hold no allocation: their hours are the wall-clock hours they ran, every run of a
    job together (hours_kind "wall"; with jobs of other backends, unknown). {} without halving."""
    views = [(job, job.rungs) for job in jobs]
    if not any(view is not None for _, view in views):
        return {}
    used, full, known = 0.0, 0.0, True
    kinds: set[str] = set()
    for job, view in views:
        if _runs_here(job):
            ran, hours = _local_hours(job)
            kinds.add("wall")
        else:
            hours = None if job.usage is None else getattr(job.usage, kind)
            ran = job.usage.ran if job.usage is not None else job.started_at is not None
            kinds.add(kind.split("_")[0])
        if not ran:
            continue
        if hours is None:
            known = False
            continue
        used += hours
        if view is None or view.outcome == FINISHED:
            full += hours  # it trained every epoch
            continue
        epochs, trained = job.train.get("epochs"), view.rung
        if not isinstance(epochs, int) or not trained:
            known = False
            continue
        full += hours * epochs / trained
    known = known and len(kinds) <= 1
    return {
        "hours_kind": kinds.pop() if len(kinds) == 1 else kind.split("_")[0],
        "hours_used": round(used, 6) if known else None,
        "full_sweep_hours": round(full, 6) if known else None,
    }


def totals_text(found: dict[str, Any]) -> list[str]:
    """What halving saved, under the summary's totals (from `totals`); [] without halving."""
    if "full_sweep_hours" not in found:
        return []
    unit = {"gpu": "GPU-h", "cpu": "CPU-h", "wall": "h (wall clock)"}.get(found["hours_kind"], "h")
    used, full = found["hours_used"], found["full_sweep_hours"]
    if used is None or full is None:
        return ["halving: the hours of the sweep without it are unknown (a job that ran has no hours)"]
    share = f" ({used / full:.0%} of it)" if full else ""
    return [f"halving: {used:.3g} {unit} used; about {full:.3g} {unit} for every job to train every epoch{share}"]


def _runs_here(job: Any) -> bool:
    from jobgen import backends
    from jobgen.errors import JobgenError

    try:
        return bool(job.backend) and backends.get(job.backend).runs_here
    except JobgenError:
        return False


def _local_hours(job: Any) -> tuple[bool, float | None]:
    """(whether it ran, its wall-clock hours over every run) of a local job; None while it runs, and for
    a record from before RAN_S (its start and end are its last run's: too short for a promoted job)."""
    from jobgen.backends.local import RAN_S

    entry = job.source.entry if job.source is not None else {}
    seconds = entry.get(RAN_S)
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds >= 0:
        return True, seconds / 3600
    return entry.get("submitted_at") is not None, None


def state_label(job: Any) -> str:
    """The state a summary shows for a job halving ended ('PAUSED@1'); '' for any other job."""
    return job.rungs.label() if job.rungs is not None else ""


# Metrics that are fractions (0 to 1): the rung chart shows them in percent, as the report's other charts.
_FRACTIONS = ("accuracy", "f1", "macro_f1", "micro_f1")


def rung_chart(lines: list[Any], colors: dict[int, str]) -> str:
    """The report's rung chart: the metric at each rung reached (x: epochs), one line per job of a
    halving run; '' when no job of the report has rungs. Its axis names the metric (the runs' one, or
    "metric" when the report's runs compare different ones); fractions in percent, others as they are."""
    from jobgen.results.charts import Series, line_chart

    views = []
    for line in lines:
        view = line.jobs[0].rungs if len(line.jobs) == 1 else None
        if view is not None and view.reached:
            views.append((line, view))
    if not views:
        return ""
    names = {view.metric for _, view in views}
    name = names.pop() if len(names) == 1 else ""
    scale = 100.0 if name in _FRACTIONS else 1.0
    series = [
        Series(
            f"{line.label} ({view.outcome})",
            [(float(r), scale * m) for r, m in zip(view.reached, view.rung_metrics, strict=True)],
            colors[id(line)],
        )
        for line, view in views
    ]
    axis = f"{name or 'metric'}{' (%)' if scale == 100 else ''}"
    return line_chart(f"Halving: {name or 'metric'} at each rung", "rung (epochs)", axis, series)
