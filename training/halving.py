"""Successive halving across jobs (ASHA) with the run folder as the only shared state.

Layout under RUN/halving/ (every file created once, never appended to or rewritten):
    rungs/<rung>/<job>.json     a job's metric at that rung (written to a temporary name, then hard-linked
                                into place: a reader sees the whole report or none, a second writer is a no-op)
    slots/<rung>/<i>            promotion slot i of that rung, i < floor(n / eta) (O_CREAT|O_EXCL)
    decisions/<rung>/<job>      the job goes on past that rung (O_CREAT|O_EXCL, only by a slot's holder);
                                it names its slot and the reports its maker read
    requeued/<rung>/<job>       who requeues a paused job for that promotion (O_CREAT|O_EXCL: once)

A promotion claims a free slot, then the job's decision file; a participant that loses the race for
the decision gives its slot back. So the decisions at a rung never outnumber the slots, and the slots
never outnumber floor(n / eta) for the n reports seen: two participants racing on NFS cannot promote
past the rule. Standard library only: jobgen reads and settles the same files on a login node.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training import console
from training.contract import LOWER_IS_BETTER, TASKS, metric_problem

# Exit status of every rank of a job that paused at a rung: neither success (no result) nor failure.
EXIT_PAUSED = 76
DIR = "halving"
# In the run folder while the run submits in waves (jobgen.commands.waves, launch.max_queued): a promoted
# job is then requeued by a top-up, when the queue has a slot for it, not by the job that promoted it.
WAVES = "waves.json"
CANCELLED = "cancelled"  # in the halving folder: the run was cancelled (cancel)
# The metric a rung compares is one of the validation metrics a job scores (result.json's val_metrics
# names: training.contract.METRICS). PRIMARY: the job's primary metric, named only once its data is
# read (data.problem_type = "auto"); every job of a sweep trains alike, so every job names the same.
PRIMARY = "primary"
# The name halving took first, for the validation accuracy: still read in experiments and manifests.
ALIASES = {"val_acc": "accuracy"}


# Set by a backend whose jobs end where no batch script of jobgen's reads the pause marker (submitit):
# the exit status of a paused job's ranks, "0" for a job that ended as planned.
PAUSED_EXIT_ENV = "JOBGEN_PAUSED_EXIT"


def paused_status(env: Mapping[str, str] | None = None) -> int:
    """The exit status of a paused job's ranks: EXIT_PAUSED, for the batch script to read (with the
    marker), or what PAUSED_EXIT_ENV says."""
    said = (os.environ if env is None else env).get(PAUSED_EXIT_ENV, "")
    return int(said) if said.isdigit() and int(said) < 256 else EXIT_PAUSED


def canonical(metric: str) -> str:
    """A metric name as val_metrics names it (an older alias mapped)."""
    return ALIASES.get(metric, metric)


def mode_of(metric: str) -> str:
    """The direction that is better for a metric: min for the errors (mse), max for every other (and for
    PRIMARY: a primary metric left to the problem type is never an error)."""
    return "min" if canonical(metric) in LOWER_IS_BETTER else "max"


@dataclass(frozen=True)
class Settings:
    """A sweep's [sweep.halving], resolved: rungs in epochs (increasing, each below train.epochs)."""

    rungs: tuple[int, ...]
    eta: int
    metric: str
    mode: str

    def record(self) -> dict[str, Any]:
        return {"rungs": list(self.rungs), "eta": self.eta, "metric": self.metric, "mode": self.mode}

    @classmethod
    def from_record(cls, raw: Mapping[str, Any]) -> Settings:
        metric = canonical(str(raw["metric"]))
        return cls(tuple(int(r) for r in raw["rungs"]), int(raw["eta"]), metric, str(raw["mode"]))

    def metric_of_job(self, primary: str) -> str:
        """The validation metric this job's rungs compare, `primary` being the job's primary metric."""
        return primary if self.metric == PRIMARY else self.metric


def job_metric_problem(metric: str, problem_type: str, num_labels: int) -> str | None:
    """Why a job of this problem type cannot compare `metric` at its rungs (it does not score it); None
    when it can. For the start of a job whose problem type validation could not know (auto)."""
    if metric == PRIMARY:
        return None
    scored = [m for m in TASKS[problem_type].metrics if m != "f1" or num_labels == 2]
    if metric in scored:
        return None
    why = metric_problem(problem_type, metric) or f"{metric!r} is the F1 of class 1 of two classes"
    return f"{why.split(';')[0]}; this job's validation scores {', '.join(scored)}"


def epoch_metric(name: str, val_metrics_per_epoch: list[dict[str, Any]], rung: int) -> float:
    """The validation metric `name` (val_metrics' names) after `rung` epochs: the one place that says
    where a rung's metric comes from. NaN where the epoch has no value (Pearson of a constant): it then
    ranks last."""
    value = val_metrics_per_epoch[rung - 1].get(name)
    return math.nan if value is None else float(value)


def keep(n: int, eta: int) -> int:
    """How many of n reports at a rung may go on: floor(n / eta)."""
    return n // eta


def ranked(reports: Mapping[str, float], mode: str) -> list[str]:
    """Job names best first: by metric (mode max or min), NaN last, ties by name."""

    def key(job: str) -> tuple[bool, float, str]:
        value = reports[job]
        bad = math.isnan(value)
        return bad, 0.0 if bad else (-value if mode == "max" else value), job

    return sorted(reports, key=key)


def promotable(reports: Mapping[str, float], promoted: Collection[str], eta: int, mode: str) -> list[str]:
    """ASHA's rule at one rung, as a pure function: the jobs to promote now, best first.

    `reports` maps each job that reached the rung to its metric there; `promoted` holds the jobs
    already past it. A job may go on when its rank among the reports is < floor(n / eta) (ASHA:
    the top 1/eta of the jobs that have reached the rung so far), and the promotions at the rung,
    earlier ones included, never exceed floor(n / eta): a job promoted early that a later report
    pushes out of the top still counts, so the candidates are the top jobs not yet promoted, cut to
    the slots left.
    """
    k = keep(len(reports), eta)
    done = [j for j in promoted if j in reports]
    free = k - len(done)
    if free <= 0:
        return []
    return [j for j in ranked(reports, mode)[:k] if j not in promoted][:free]


def root(run_dir: str | Path) -> Path:
    return Path(run_dir) / DIR


def _dir(base: Path, kind: str, rung: int) -> Path:
    return base / kind / str(rung)


def report(base: Path, rung: int, job: str, metric: float, **extra: Any) -> bool:
    """Record `job`'s metric at `rung` once; False when it was recorded already (the first report stays)."""
    folder = _dir(base, "rungs", rung)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{job}.json"
    if final.exists():
        return False
    body = json.dumps({"schema": 1, "job": job, "rung": rung, "metric": metric, "time": time.time(), **extra})
    tmp = folder / f".tmp-{job}-{uuid.uuid4().hex}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(body + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(tmp, final)  # never replaces: the first report wins
        return True
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links: exclusive create, then the whole text at once
        return _create(final, body + "\n")
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _create(path: Path, text: str) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    return True


def read_reports(base: Path, rung: int) -> dict[str, dict[str, Any]]:
    """Every complete report at `rung`, by job (temporary and unreadable files are skipped)."""
    found: dict[str, dict[str, Any]] = {}
    folder = _dir(base, "rungs", rung)
    if not folder.is_dir():
        return found
    for path in folder.iterdir():
        if path.name.startswith(".") or path.suffix != ".json":
            continue
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            found[path.stem] = {**raw, "metric": float(raw["metric"])}
        except (OSError, ValueError, KeyError, TypeError):
            continue  # an exclusive create still being written (no hard links): seen next time
    return found


def promoted(base: Path, rung: int) -> set[str]:
    folder = _dir(base, "decisions", rung)
    if not folder.is_dir():
        return set()
    return {p.name for p in folder.iterdir() if not p.name.startswith(".")}


def decision(base: Path, rung: int, job: str) -> dict[str, Any] | None:
    """What a decision file says: {"slot": i, "seen": [jobs whose reports its maker read]}."""
    try:
        found: dict[str, Any] = json.loads((_dir(base, "decisions", rung) / job).read_text(encoding="utf-8"))
        return found
    except (OSError, ValueError):
        return None


def is_promoted(base: Path, rung: int, job: str) -> bool:
    return (_dir(base, "decisions", rung) / job).exists()


def claim(base: Path, rung: int, job: str, k: int, seen: Collection[str] = ()) -> bool:
    """Promote `job` past `rung` if one of slots 0..k-1 is free and nobody promoted it yet; True when this
    call made the decision. Exclusive creates only: safe against any number of racing participants. The
    decision file records its slot and the reports its maker `seen`, so the rule can be checked later."""
    decisions, slots = _dir(base, "decisions", rung), _dir(base, "slots", rung)
    if (decisions / job).exists():
        return False
    slots.mkdir(parents=True, exist_ok=True)
    decisions.mkdir(parents=True, exist_ok=True)
    for i in range(k):
        if not _create(slots / str(i), job + "\n"):
            continue
        if _create(decisions / job, json.dumps({"slot": i, "seen": sorted(seen)}) + "\n"):
            return True
        (slots / str(i)).unlink()  # another participant promoted the same job: the slot goes back
        return False
    return False


def settle(base: Path, rung: int, settings: Settings) -> list[str]:
    """Apply the rule at `rung` to the reports on disk now; the jobs this call promoted."""
    reports = {job: r["metric"] for job, r in read_reports(base, rung).items()}
    done = promoted(base, rung)
    k = keep(len(reports), settings.eta)
    chosen = promotable(reports, done, settings.eta, settings.mode)
    return [job for job in chosen if claim(base, rung, job, k, reports)]


def cancel(base: Path) -> None:
    """The run was cancelled (`jobgen cancel`): no participant promotes or requeues a job any more."""
    base.mkdir(parents=True, exist_ok=True)
    _create(base / CANCELLED, f"{time.time()}\n")


def cancelled(base: Path) -> bool:
    return (base / CANCELLED).exists()


def resume(base: Path) -> None:
    """`jobgen requeue` starts jobs of a cancelled run again: the rule applies again."""
    with contextlib.suppress(OSError):
        (base / CANCELLED).unlink()


def first_requeue(base: Path, rung: int, job: str) -> bool:
    """True for the one participant that gets to requeue `job` for its promotion past `rung`
    (`requeued/<rung>/<job>`, created once): a promoted job that later fails is not requeued again and
    again by every `jobgen status`; its retries are slurm.retries' business."""
    folder = _dir(base, "requeued", rung)
    folder.mkdir(parents=True, exist_ok=True)
    return _create(folder / job, f"{time.time()}\n")


def requeued(base: Path, rung: int, job: str) -> bool:
    """Whether someone took on requeueing `job` for its promotion past `rung` (first_requeue)."""
    return (_dir(base, "requeued", rung) / job).exists()


def forget_requeue(base: Path, rung: int, job: str) -> None:
    """A requeue that Slurm refused: the next participant tries again."""
    with contextlib.suppress(OSError):
        (_dir(base, "requeued", rung) / job).unlink()


def requeue_paused(report_: Mapping[str, Any]) -> tuple[bool, str]:
    """Ask Slurm to start a promoted job again (it resumes from its rung's checkpoint): (whether it is
    queued again now, what happened). A job still pending needs nothing; one still running is requeued
    too (it may be on its way out). Where there is no scontrol (a container's image), nothing is asked."""
    target, scontrol = report_.get("requeue_id"), shutil.which("scontrol")
    if not target:
        return False, "not a Slurm job: its runner resumes it"
    if not scontrol:
        return False, f"no scontrol here: `jobgen status` requeues {target}"
    shown = subprocess.run([scontrol, "show", "job", "-o", str(target)], check=False, capture_output=True, text=True)
    state = shown.stdout.split("JobState=", 1)[1].split()[0] if "JobState=" in shown.stdout else "unknown"
    if state in ("PENDING", "REQUEUED"):
        return True, f"{target} is {state} already"
    asked = subprocess.run([scontrol, "requeue", str(target)], check=False, capture_output=True, text=True)
    return asked.returncode == 0, f"scontrol requeue {target} -> rc {asked.returncode} {asked.stderr.strip()}".strip()


def requeue_promoted(base: Path, rung: int, job: str, report_: Mapping[str, Any]) -> str | None:
    """A job at its rung requeues `job`, which it promoted, unless someone did already (first_requeue);
    what happened, None when it was not its turn. A requeue not made (no scontrol where the job runs,
    Slurm refused) is given back: the next participant, a `jobgen status`, makes it."""
    if not report_.get("requeue_id") or not first_requeue(base, rung, job):
        return None
    done, said = requeue_paused(report_)
    if not done:
        forget_requeue(base, rung, job)
    return said


def pause_marker(checkpoint_dir: Path, env: Mapping[str, str] | None = None) -> Path:
    """What rank 0 writes before a paused job leaves: the batch script then ends it with status 0
    (its allocation freed; neither a failure to retry nor a requeue). One per job id and attempt."""
    env = os.environ if env is None else env
    return checkpoint_dir / f".paused-{env.get('SLURM_JOB_ID', 'local')}-{env.get('SLURM_RESTART_COUNT', '0') or 0}"


def paused_since(checkpoint_dir: Path, since: float, env: Mapping[str, str] | None = None) -> bool:
    """Whether the job's rank 0 wrote its pause marker since `since` (time.time()): a launcher that
    reports its ranks' pause as a failure of its own (torchrun) then ran a paused job."""
    try:
        return pause_marker(checkpoint_dir, env).stat().st_mtime >= since - 1  # some file systems keep seconds
    except OSError:
        return False


def at_rung(
    base: Path, settings: Settings, job: str, rung: int, metric: float, checkpoint_dir: Path, name: str = ""
) -> bool:
    """Rank 0 of `job` after `rung` epochs, its checkpoint written: report (`name`: the metric's), apply
    the rule (promoting others too), and say whether this job goes on. A job that stops writes its pause
    marker first, then looks once more: a promotion made in between is not lost."""
    from training.requeue import requeue_target

    report(base, rung, job, metric, requeue_id=requeue_target(), name=name or settings.metric)
    if is_promoted(base, rung, job):
        return True  # decided before a requeue or retry: the decision stands
    waves = (base.parent / WAVES).exists()
    for other in [] if cancelled(base) else settle(base, rung, settings):
        if other == job:
            continue
        if waves:
            console.line(f"training: halving: promoted {other} at rung {rung}: requeued when the queue has room")
            continue
        # Read after the settling: it may promote a job whose report came in just before it.
        said = requeue_promoted(base, rung, other, read_reports(base, rung).get(other, {}))
        if said is not None:
            console.line(f"training: halving: promoted {other} at rung {rung}: {said}")
    if is_promoted(base, rung, job):
        return True
    marker = pause_marker(checkpoint_dir)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{rung}\n")
    if is_promoted(base, rung, job):
        marker.unlink()
        return True
    return False


def goes_on(spec: Any, stats: Any, done: int, rank: int, agree: Callable[[list[float]], list[float]]) -> bool:
    """Every engine, at the start of an epoch with `done` epochs validated and checkpointed (a resumed job
    passes here again and keeps the decision it had): True when the job trains on. At a halving rung,
    rank 0 reports the job's metric and applies the rule, and every rank follows its answer (`agree`
    sums values over the ranks, a collective every rank calls). A job that stops has
    stats.paused_at = done and stats.interrupted set: it ends with EXIT_PAUSED, its checkpoint kept."""
    if not spec.halving or spec.probe or done not in spec.halving["rungs"]:
        return True
    go = 0.0  # only rank 0's answer counts: the others add nothing to the sum
    if rank == 0:
        settings = Settings.from_record(spec.halving)
        name = settings.metric_of_job(stats.primary_metric)
        metric = epoch_metric(name, stats.val_metrics_per_epoch, done)
        go = float(at_rung(root(spec.run_dir), settings, spec.job, done, metric, spec.checkpoint_dir, name))
        if not go:
            say_pause(spec.job, done, name, metric)
    if agree([go])[0] > 0:
        return True
    stats.paused_at, stats.interrupted = done, True
    return False


def say_pause(job: str, rung: int, name: str, metric: float) -> None:
    console.line(
        f"training: halving: {job} pauses at rung {rung} ({name} {metric:.4f} is not in the top of its rung); "
        "it resumes here if a later report promotes it",
        err=True,
    )
