"""The one rule for a job's state: what `status`, `summary`, `report`, `runs` and `requeue` all show.

A job's state comes from four pieces of evidence, in this order of trust:

1. a dry run or a job never submitted stays what it was recorded as;
2. the scheduler's answer, while it says the job is queued or running: that is current;
3. its final answer, when it is other than COMPLETED: jobgen's batch script already ends a step that
   died after writing this attempt's result (a crash at exit, a rank killed by `srun
   --kill-on-bad-exit`) with 0 (jobgen/templates/_result_guard.j2), so a FAILED job with a result.json
   holds an older attempt's result. That answer, once recorded, stands after Slurm forgets the job
   (and so does the local backend's, whose run does the same);
4. a result: a job that wrote its result.json (and that Slurm calls COMPLETED, or no longer knows)
   finished its work;
5. without a result, how it ended: the scheduler's final answer, else the last state recorded,
   else what its log says (a time limit, an out-of-memory kill, an exception), else UNKNOWN.

A job that ended without its result is never COMPLETED: when Slurm (or the local backend's exit
status) says COMPLETED and there is no result.json, the job is FAILED.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jobgen import backends
from jobgen.errors import JobgenError
from jobgen.record.model import Run, RunJob
from jobgen.record.store import redactor
from jobgen.results import halving as halving_view
from jobgen.results import logs
from jobgen.results.diagnose import CAUSE_STATES, LAST_LINE, Cause, find_cause
from jobgen.states import FINAL_STATES, Answer, JobInfo, State
from training.progress import where as progress_where

NEVER_RAN = frozenset({State.DRY_RUN, State.NOT_SUBMITTED, State.WAITING})
# A job recorded in one of these states is not asked about again (unless --refresh): it has ended for
# good. Slurm requeues preempted and node-failed jobs by itself, so those are asked again.
SETTLED = FINAL_STATES - {State.PREEMPTED, State.NODE_FAIL}


def read_runs(
    run_dirs: Sequence[Path],
    *,
    live: bool = True,
    refresh: bool = False,
    record: bool = True,
) -> list[Run]:
    """Load runs, ask each scheduler once about their live jobs, and decide every job's state.

    `record` writes the states that changed back to each manifest (the next command asks Slurm less)."""
    runs = [Run.load(run_dir) for run_dir in run_dirs]
    settle(runs, live=live, refresh=refresh, record=record)
    return runs


def read_some(run_dirs: Sequence[Path], *, refresh: bool = False) -> list[Run | Path]:
    """Like read_runs, for commands that report on several runs: a run whose manifest cannot be read stays
    a folder (its rows say why) instead of stopping the command."""
    loaded: list[Run | Path] = []
    for run_dir in run_dirs:
        try:
            loaded.append(Run.load(run_dir))
        except JobgenError:
            loaded.append(run_dir)
    runs = [r for r in loaded if isinstance(r, Run)]
    settle(runs, refresh=refresh)
    return loaded


def look_at_records(runs: Sequence[Run], also: Callable[[RunJob], object] | None = None) -> None:
    """Read and check every job's records (RunJob.problems, then `also`): the reading a status, summary
    or report does once Slurm has answered (no record read predates the answer)."""
    for run in runs:
        for job in run.jobs:
            job.problems()
            if also is not None:
                also(job)


def settle(
    runs: Sequence[Run],
    *,
    live: bool = True,
    refresh: bool = False,
    record: bool = True,
) -> None:
    """Decide the state of every job of these (loaded) runs; see read_runs."""
    for run in runs:
        run.refresh = refresh
    if live:
        ask_schedulers(runs, refresh)
    asked = [(run, job) for run in runs for job in run.jobs if not job.unanswered]
    # The logs of each job whose state they may change.
    _read_causes([(run, job) for run, job in asked if needs_cause(job.recorded, _said(job), job.finished)])
    for run in runs:
        for job in run.jobs:
            if job.unanswered:
                job.state = job.recorded  # no news: its files may be an earlier attempt's
                continue
            job.state = job_state(
                job.recorded,
                _said(job),
                job.finished,
                job.cause,
                asked=live or job.live is not None,
                kept=_kept_end(job),
            )
    if record:
        # Once, when the end is recorded, for why: a summary reads the record after.
        _read_causes([(run, job) for run, job in asked if not job.cause_read and not job.finished and newly_ended(job)])
        for run in runs:
            record_states(run)


def _kept_end(job: RunJob) -> bool:
    """Whether the job's recorded end is the scheduler's own word on how it ended, which a result.json
    found later cannot overturn: an end other than COMPLETED recorded with a non-zero exit code. (A job
    Slurm called COMPLETED before its result.json could be seen is recorded FAILED with exit code 0:0:
    its result, seen later, makes it COMPLETED.)"""
    code = job.entry.get("exit_code")
    return job.recorded in SETTLED and job.recorded is not State.COMPLETED and code not in (None, "", 0, "0:0")


def _said(job: RunJob) -> State | None:
    return job.live.state if job.live else None


def _read_causes(jobs: list[tuple[Run, RunJob]]) -> None:
    """What the logs of these jobs say of why each stopped (find_cause)."""
    for run, job in jobs:
        job.cause, job.cause_read = find_cause(logs.of(job, run.backend), run.run_dir), True


def ask_schedulers(runs: Sequence[Run], refresh: bool = False) -> None:
    """One question per backend for every job of these runs that may still change (all with `refresh`)."""
    asking: dict[str, list[RunJob]] = {}
    for run in runs:
        # A job a promotion requeued may have been requeued by the job that promoted it, after a
        # command recorded its pause as its end: asked again until its COMPLETED is recorded.
        resumed = halving_view.requeued_jobs(run)
        for job in run.jobs:
            if is_asked(job, refresh) or (job.name in resumed and job.recorded is not State.COMPLETED):
                asking.setdefault(run.backend, []).append(job)
    answers = {
        backend: backends.get(backend).states([i for job in jobs for i in job.ids]) for backend, jobs in asking.items()
    }
    for backend, jobs in asking.items():
        found = answers[backend]
        silent = found.silent if isinstance(found, Answer) else ""
        for job in jobs:
            job.live = (
                chain_info(list(job.segments), found, job.finished) if job.segments else found.get(job.job_id or "")
            )
            job.unanswered = bool(silent) and job.live is None
        if silent:
            for run in runs:
                if run.backend == backend and (n := sum(job.unanswered for job in run.jobs)):
                    jobs_show = f"{n} jobs show" if n > 1 else "1 job shows"
                    run.notes.append(
                        f"{run.run_dir}: Slurm did not answer ({silent}): {jobs_show} the last state recorded,"
                        " and none was changed; run the command again once Slurm answers"
                    )


def progress(job: RunJob) -> str:
    """'epoch 2/3 45%' from the job's progress.json (written by the training as it goes), as its progress
    lines in the log say it (training/progress.py); '-' if none. The status's and summary's column."""
    if job.state is State.COMPLETED:
        return "done"
    where = job.progress()
    if where is None:
        return "-"
    return progress_where(*where)


def is_asked(job: RunJob, refresh: bool = False) -> bool:
    """Whether the scheduler is asked about the job: it was submitted, and it may still change (a chain
    is always asked: its segments are what status shows of it), or `refresh` asks about every job."""
    return bool(job.ids) and (refresh or bool(job.segments) or job.recorded not in SETTLED)


def _ran_and_ended(state: State) -> bool:
    """A state a job that ran keeps for good (what a recorded cause is kept with)."""
    return state in SETTLED and state not in NEVER_RAN


def newly_ended(job: RunJob) -> bool:
    """Whether the job has ended for good with a state not recorded yet: what a command records of it
    then includes what its logs say of why (a job recorded as ended by an older jobgen has its logs read
    by each summary, as then)."""
    return job.state is not job.recorded and _ran_and_ended(job.state)


CAUSE = "cause"  # the manifest entry's field: [job id] + (kind, message, hint, log) when the logs said why


def kept_cause(job: RunJob, refresh: bool = False) -> tuple[bool, Cause | None]:
    """(True, what the logs said when the job's end was recorded: None for nothing) while the job is still
    recorded as ended that way under the same id; (False, None) when its logs must be read."""
    value = job.entry.get(CAUSE)
    if refresh or job.state is not job.recorded or job.recorded not in SETTLED or type(value) is not list:
        return False, None
    if not value or value[0] != job.job_id:
        return False, None
    if len(value) == 1:
        return True, None
    if len(value) == 5 and all(type(v) is str for v in value[1:]):
        return True, Cause(value[1], value[2], value[3], value[4])
    return False, None  # damaged: the logs say it again


def _cause_field(job: RunJob, redact: Callable[[str], str]) -> list[str] | None:
    """What record_states keeps of the cause this command read for a job that ended for good without its
    result (secrets taken out: the manifest is a record); None when there is none to keep."""
    if not job.cause_read or not _ran_and_ended(job.state) or not job.job_id or job.finished:
        return None
    cause = job.cause
    if cause is None:
        return [job.job_id]
    return [job.job_id, cause.kind, redact(cause.message), redact(cause.hint), cause.log]


def record_states(run: Run) -> None:
    """Write the states (and Slurm's start and end times, and for a job that ended without its result
    what its logs say of why) that changed back to the run's manifest."""
    updates = {}
    redact = redactor()
    for job in run.jobs:
        fields: dict[str, Any] = {"state": job.state.value}
        kept = _cause_field(job, redact)
        if kept is not None:
            fields[CAUSE] = kept
        elif job.state is not job.recorded and job.entry.get(CAUSE) is not None:
            fields[CAUSE] = None  # another state: what the logs said of the end recorded before is not of this one
        if job.live:
            # What Slurm said, kept: a job recorded as ended is not asked again, and status still shows it.
            said = {
                "started_at": job.live.start,
                "ended_at": job.live.end,
                "elapsed": job.live.elapsed,
                "nodelist": job.live.nodelist,
                "exit_code": job.live.exit_code,
            }
            fields |= {k: v for k, v in said.items() if v}
        if any(job.entry.get(k) != v for k, v in fields.items()):
            updates[job.name] = fields
    if updates:
        run.record(updates)  # manifest.json is whole when the command ends


def needs_cause(recorded: State, live: State | None, finished: bool) -> bool:
    """Whether the logs can change the state: no result, and neither Slurm nor the record says how it ended."""
    if finished or recorded in NEVER_RAN or (live is not None and not live.is_final and live is not State.UNKNOWN):
        return False
    said = live if live not in (None, State.UNKNOWN) else recorded
    return said is State.COMPLETED or not said.is_final


def job_state(
    recorded: State,
    live: State | None,
    finished: bool,
    cause: Cause | None = None,
    asked: bool = True,
    kept: bool = False,
) -> State:
    """The state to show. `live`: the scheduler's answer (None: it has none); `finished`: a result exists;
    `cause`: what the logs say, asked only where needs_cause() says they matter; `asked`: whether the
    scheduler was asked at all (a summary of copied runs, without Slurm, shows the last state known);
    `kept`: the recorded state is the scheduler's final word, recorded when it was given (_kept_end)."""
    if recorded in NEVER_RAN:
        return recorded
    if live is State.UNKNOWN:
        live = None  # an answer that says nothing must not hide what the files say
    if live is None and kept:
        return recorded  # what the scheduler said while it knew the job, as rule 3 showed it then
    if live is not None and not live.is_final:
        return live
    if live is not None and live is not State.COMPLETED:
        # Slurm's final word: jobgen's batch script already turned a step that died after writing this
        # attempt's result into exit 0 (jobgen/templates/_result_guard.j2), and a result.json older than
        # this attempt says nothing of how it ended.
        return live
    if finished:
        return State.COMPLETED
    said = live if live is not None else recorded
    diagnosed = CAUSE_STATES.get(cause.kind, State.FAILED) if cause is not None and cause.kind != LAST_LINE else None
    if said is State.COMPLETED:
        return diagnosed or State.FAILED  # ended without its result
    if said.is_final:
        return said
    if diagnosed or not asked:
        return diagnosed or recorded
    return State.UNKNOWN  # last seen queued or running, and the scheduler no longer knows it


def chain_info(segments: list[str], found: dict[str, JobInfo], finished: bool) -> JobInfo | None:
    """One job from its segments (slurm.chain): running while one runs, pending while one waits, completed
    once the training wrote its result (later segments then stop at once); else how the last one ended."""
    infos = [found.get(jid) for jid in segments]
    if not any(infos):
        return None
    states = [i.state.value if i else "?" for i in infos]
    ran = [n for n, i in enumerate(infos) if i and i.start and i.state is not State.PENDING]
    current = next((n for n, i in enumerate(infos) if i and i.state is State.RUNNING), ran[-1] if ran else 0)
    base = infos[current] or next(i for i in infos if i)
    if finished:
        state = State.COMPLETED
    elif any(i and i.state is State.RUNNING for i in infos):
        state = State.RUNNING
    elif any(i and not i.state.is_final for i in infos):
        state = State.PENDING
    else:
        state = base.state
    extra = {"segments": states, "segment": current + 1}
    return JobInfo(
        state,
        _total_elapsed([i.elapsed for i in infos if i]),
        base.nodes,
        base.nodelist,
        base.exit_code,
        infos[0].start if infos[0] else "",
        base.end if state.is_final else "",
        base.source,
        extra,
    )


def _total_elapsed(values: list[str]) -> str:
    """Slurm's elapsed times ([D-]HH:MM:SS, MM:SS) added up, in the same form."""
    total = 0
    for value in values:
        days, _, clock = value.rpartition("-")
        parts = [int(p) for p in clock.split(":") if p.isdigit()]
        if not parts:
            continue
        seconds = sum(p * 60**i for i, p in enumerate(reversed(parts)))
        total += seconds + int(days or 0) * 86400
    whole_days, rest = divmod(total, 86400)
    shown = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{whole_days}-{shown}" if whole_days else shown
