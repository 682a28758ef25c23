"""`jobgen requeue`: start jobs of a run again; the training resumes from the job's newest checkpoint.

- A job that ended without success (failed, cancelled, timed out, out of memory, node failure,
  preempted, or gone with no result) is requeued by Slurm (`scontrol requeue`: same job id, same log,
  appended). When Slurm refuses (it forgets ended jobs after MinJobAge, or the cluster disables
  requeue), its script is submitted again; the manifest keeps the earlier ids in `previous_job_ids`.
- A running job is only requeued when named. With `slurm.requeue` on it is sent its warning signal, so
  it checkpoints first and requeues itself; otherwise Slurm stops it and queues it again.
- Pending, completed and never-submitted jobs are left alone, with the reason; so are the jobs of a
  halving run that its rule paused or stopped at a rung (they ended as planned: a requeue would only
  find their decision again) or promoted (the next status or top-up requeues those).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobgen import backends
from jobgen.backends import Scheduler
from jobgen.backends import _tools as slurm
from jobgen.errors import JobgenError, SubmitError
from jobgen.facts import now_iso
from jobgen.record import store as record
from jobgen.record.model import Run
from jobgen.results import halving as halving_view
from jobgen.results.state_rule import read_runs
from jobgen.states import State
from training import halving

UNSUCCESSFUL = frozenset(
    {State.FAILED, State.CANCELLED, State.TIMEOUT, State.OUT_OF_MEMORY, State.NODE_FAIL, State.PREEMPTED, State.UNKNOWN}
)


@dataclass
class Outcome:
    name: str
    job_id: str | None
    state: State
    action: str  # "signalled", "requeued", "resubmitted" or "skipped"
    detail: str
    shown: str = ""  # the state as status shows it, where that is not `state` (halving's STOPPED@1)


def requeue(run_dir: Path, names: list[str]) -> list[Outcome]:
    """Requeue the named jobs of a run, or (none named) every job that ended without success.

    Two requeues of one run at once take turns (a lock in the run folder); the second then sees the jobs
    the first queued again, and leaves them alone.
    """
    with record.run_lock(run_dir):
        try:
            return _requeue(run_dir, names)
        finally:
            record.compact(run_dir)


def _requeue(run_dir: Path, names: list[str]) -> list[Outcome]:
    # Slurm is asked about every job, also those recorded as ended: requeue acts on what it says now.
    (run,) = read_runs([run_dir], refresh=True)
    if run.dry_run:
        raise JobgenError(f"{run_dir} is a dry run: nothing was submitted, so nothing can be requeued")
    scheduler = backends.get(run.backend)
    refusal = scheduler.requeue_refusal(run_dir)
    if refusal:
        raise JobgenError(refusal)
    chosen = run.pick(names)
    planned = halving_view.ended_as_planned(run)
    base = halving.root(run_dir)
    stopped = bool(run.manifest.get("halving")) and halving.cancelled(base)
    if stopped:
        halving.resume(base)  # before a job starts again: at its rung the rule applies as before the cancel
    outcomes = [
        _one(run, scheduler, job.entry, job.state, planned.get(job.name))
        for job in chosen
        if names or (job.state in UNSUCCESSFUL and job.name not in planned)
    ]
    if stopped and all(o.action == "skipped" for o in outcomes):
        halving.cancel(base)  # nothing started again: the run stays cancelled
    return outcomes


def _one(
    run: Run, scheduler: Scheduler, job: dict[str, Any], state: State, rungs: halving_view.JobRungs | None = None
) -> Outcome:
    run_dir, manifest = run.run_dir, run.manifest
    name, job_id = job["name"], job.get("job_id")

    def skip(why: str) -> Outcome:
        return Outcome(name, job_id, state, "skipped", why)

    if rungs is not None:
        why = (
            f"promoted past rung {rungs.rung}: the next jobgen status or top-up requeues it"
            if rungs.outcome == halving_view.WAITING
            else f"halving ended it at rung {rungs.rung} as planned: only a promotion resumes it"
        )
        return Outcome(name, job_id, state, "skipped", why, shown=rungs.label())
    if not job_id and state is State.CANCELLED:
        # A halving run is rerun whole: fewer jobs than eta would all stop at their first rung.
        again = (
            f"jobgen rerun {run_dir} runs the sweep"
            if manifest.get("halving")
            else f"jobgen rerun {run_dir} {name} runs it"
        )
        return skip(f"cancelled before it was submitted; {again} again in a new run")
    if not job_id:
        return skip(f"never submitted; run: jobgen submit --resume {run_dir}")
    if state is State.COMPLETED:
        return skip("completed; submit the experiment again for a new run")
    if state in (State.PENDING, State.SUBMITTED, State.REQUEUED, State.SUSPENDED):
        return skip(f"{state.value.lower()}: it is still queued")
    if state is State.RUNNING:
        return _running(run, scheduler, job, state)
    try:
        scheduler.requeue(job_id, what=f"requeueing {name}")
    except SubmitError as exc:
        if slurm.unreachable(exc.message):
            # No answer is not a refusal: the job may be alive, and a second copy must not be queued.
            raise SubmitError(f"{exc.message}; run jobgen requeue again once Slurm answers") from None
        return _resubmit(run_dir, scheduler, manifest, job, state, refused=exc.message)
    _record(run_dir, job, job_id)
    return Outcome(name, job_id, state, "requeued", "queued again under the same job id")


def _running(run: Run, scheduler: Scheduler, job: dict[str, Any], state: State) -> Outcome:
    run_dir, name, job_id = run.run_dir, job["name"], job["job_id"]
    settings = run.requeue_settings(run.find(name))
    if settings.get("enabled"):
        signal = settings.get("signal") or "USR2"
        # To the job's steps, as Slurm sends it before the time limit: the training checkpoints and
        # calls `scontrol requeue` itself.
        scheduler.signal(job_id, signal, what=f"signalling {name}")
        _record(run_dir, job, job_id)
        return Outcome(name, job_id, state, "signalled", f"sent SIG{signal}: it checkpoints, then requeues itself")
    scheduler.requeue(job_id, what=f"requeueing {name}")
    _record(run_dir, job, job_id)
    why = "stopped and queued again (slurm.requeue is off: no checkpoint was asked for first)"
    return Outcome(name, job_id, state, "requeued", why)


def _resubmit(
    run_dir: Path, scheduler: Scheduler, manifest: dict[str, Any], job: dict[str, Any], state: State, refused: str
) -> Outcome:
    name, old = job["name"], job["job_id"]
    why = refused.split("failed: ", 1)[-1]
    earlier = _earlier_resubmission(run_dir, scheduler, manifest, job)
    if earlier:
        _record(run_dir, job, earlier, {"found_on_cluster": True})
        found = (
            f"Slurm would not requeue job {old} ({why}); found job {earlier}, which an earlier requeue "
            "submitted (its reply was lost): nothing submitted again"
        )
        return Outcome(name, earlier, state, "resubmitted", found)
    try:
        if job.get("array"):
            (array,) = [a for a in manifest["arrays"] if a["name"] == job["array"]]
            index = job["array_index"]
            new, extra = scheduler.submit_array_task(run_dir, array, index, f"submitting {name} again"), {}
        else:
            extra = scheduler.submit(run_dir, job)
            new = extra.pop("job_id")
            extra.pop("state", None)
    except SubmitError as exc:
        raise SubmitError(
            f"{exc.message}; run jobgen requeue again: a job Slurm took without saying so is found "
            "then, not submitted twice",
            maybe_queued=exc.maybe_queued,
        ) from None
    _record(run_dir, job, new, extra)
    return Outcome(name, new, state, "resubmitted", f"Slurm would not requeue job {old} ({why}); submitted again")


def _earlier_resubmission(
    run_dir: Path, scheduler: Scheduler, manifest: dict[str, Any], job: dict[str, Any]
) -> str | None:
    """The id of a copy of this job that an earlier requeue submitted but could not record, if Slurm has one."""
    known = {job["job_id"], *job.get("previous_job_ids", [])}
    if job.get("array"):
        (entry,) = [a for a in manifest["arrays"] if a["name"] == job["array"]]
        suffix = f"_{job['array_index']}"
    else:
        entry, suffix = job, ""
    since = job.get("submitted_at") or manifest.get("created") or now_iso()
    ids = scheduler.find(run_dir, [entry], since).get(entry["name"], [])
    fresh = [i for i in ids if i not in known and (i.endswith(suffix) if suffix else "_" not in i)]
    return fresh[-1] if fresh else None


def _record(run_dir: Path, job: dict[str, Any], job_id: str, extra: dict[str, Any] | None = None) -> None:
    fields: dict[str, Any] = {
        "state": State.REQUEUED.value,
        "requeued_at": now_iso(),
        "requeues": int(job.get("requeues") or 0) + 1,
        "error": None,
    }
    if job_id != job["job_id"]:
        fields |= {
            "job_id": job_id,
            "previous_job_ids": [*job.get("previous_job_ids", []), job["job_id"]],
            "submitted_at": now_iso(),
            **(extra or {}),
        }
    record.update_jobs(run_dir, {job["name"]: fields})
