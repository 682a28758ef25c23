"""Sweeps larger than the queue: see the room before submitting, submit what fits, the rest in waves.

`launch.max_queued = N` keeps at most N of a sweep's jobs queued at once (pending or running; array
tasks and chain segments one each); 0 = what the cluster's limits leave now (jobgen.backends._queue),
less `launch.queue_reserve`. The jobs that do not fit are recorded as WAITING, and `waves.json` in the
run folder says the run waves. Nothing stays alive on the login node: each job of the sweep, on its
way out (its batch script's EXIT trap), runs `jobgen top-up --leaving ITS_ID RUN`, which submits the
waiting jobs that fit now; so do `jobgen status`, `jobgen submit --resume` and `jobgen top-up RUN`.
Every top-up holds the run's submit lock and submits through submit.py's at-most-once path (tags in
--comment, the manifest's journal), so two top-ups at once never queue a job twice.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobgen import backends
from jobgen.backends import Scheduler
from jobgen.backends._queue import max_queued
from jobgen.errors import JobgenError
from jobgen.facts import now_iso
from jobgen.record import store as record
from jobgen.results import halving as halving_view
from jobgen.states import Answer, JobInfo, State
from training import halving

WAVES = halving.WAVES  # in a run folder while jobs of it wait for room in the queue
SCHEMA = 1
# The last job of a sweep that leaves jobs waiting and finds no room (the controller still holds the
# records of ended jobs: MaxJobCount counts them until MinJobAge passes) waits for room this long at most.
LAST_WAIT_S = 600.0
_POLL_S = 5.0


def weight(entry: dict[str, Any]) -> int:
    """How many queued jobs one manifest entry makes: its tasks (an array), segments (a chain), or 1."""
    if entry.get("tasks"):
        return len(entry["tasks"])
    return max(1, int(entry.get("chain") or 1))


def read(run_dir: Path) -> dict[str, Any] | None:
    """The run's waves settings, or None when it does not wave (or no job waits any more)."""
    try:
        doc = json.loads((run_dir / WAVES).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA else None


def first_wave(run_dir: Path, settings: Mapping[str, str] | None) -> str | None:
    """Before a run's first submission: read the queue's room, say in one line how many of its jobs fit
    now, and make the run wave (waves.json, every job WAITING) when launch.max_queued or the limits ask
    for it. None where the run's scheduler has no queue limits to read (or the run says nothing of them)."""
    manifest = record.load_manifest(run_dir)
    queue = manifest.get("queue")
    if not isinstance(queue, dict) or manifest.get("dry_run") or read(run_dir) is not None:
        return None
    key = "arrays" if manifest.get("arrays") else "jobs"
    entries = [e for e in manifest[key] if not e.get("job_id") and e["state"] == State.NOT_SUBMITTED.value]
    if len(entries) != len(manifest[key]):
        return None  # submitted before: `--resume` goes on as it began
    total = sum(weight(e) for e in entries)
    line, most = _room(manifest, queue, settings, total)
    if most is None or total <= most:
        return line
    if manifest.get("halving") and any(int(e.get("chain") or 1) > 1 for e in entries):
        # Waves would stall: a paused chain keeps its held segments queued, so paused jobs fill the slots.
        raise JobgenError(
            f"{total} segments do not fit in the queue ({most} may be queued) and a halving sweep of "
            "chains cannot wave: a paused job's later segments stay queued, held, until a promotion resumes "
            "it; sweep fewer points, raise launch.max_queued, or use slurm.requeue = true instead of "
            f"slurm.chain; nothing was submitted (once there is room: jobgen submit --resume {run_dir})"
        )
    start(run_dir, most, str(queue.get("qos") or ""), str(queue.get("account") or ""))
    mark_waiting(run_dir, key, entries)
    return line


def _room(
    manifest: dict[str, Any], queue: dict[str, Any], settings: Mapping[str, str] | None, total: int
) -> tuple[str | None, int | None]:
    """(how many of `total` jobs fit now, in one line; the most queued at once), each None where
    nothing says (no limits to read, no launch.max_queued)."""
    scheduler = backends.get(manifest["backend"])
    room = scheduler.queue_room(settings, str(queue.get("qos") or ""), str(queue.get("account") or ""))
    line = room.fit_line(total) if room is not None else None
    return line, max_queued(int(queue.get("max_queued") or 0), int(queue.get("reserve") or 0), room)


def preview(manifest: dict[str, Any]) -> list[str]:
    """What submitting a dry run's jobs would queue, as first_wave would decide it now: how many fit
    and, when the sweep would wave, how many go in at once."""
    queue = manifest.get("queue")
    if not isinstance(queue, dict):
        return []
    key = "arrays" if manifest.get("arrays") else "jobs"
    total = sum(weight(e) for e in manifest[key])
    scheduler = backends.get(manifest["backend"])
    line, most = _room(manifest, queue, scheduler.settings(), total)
    out = [line] if line else []
    if most is not None and total > most:
        asked = queue.get("max_queued")
        why = f"launch.max_queued = {asked}" if asked else "what the limits leave, less launch.queue_reserve"
        out.append(
            f"waves: {most} of the {total} job(s) would be queued at once ({why}); the rest would wait as "
            "WAITING, each job that ends submitting the next"
        )
    return out


def submit_run(run_dir: Path, on_submit: Any = None, say: Any = None) -> dict[str, Any]:
    """Submit a written run as `jobgen submit` and jobgen.api.submit do; its manifest after. Its first
    submission reads the queue's room (first_wave; `say` gets the line on how many jobs fit) and waves
    when the sweep does not fit; a scheduler that cannot wave refuses a sweep larger than the room
    before it submits anything."""
    from jobgen.commands import submit

    # One question for the first wave, its top-up and the refusal of what does not fit.
    settings = backends.get(record.load_manifest(run_dir)["backend"]).settings()
    line = first_wave(run_dir, settings)
    if line and say is not None:
        say(line)
    if read(run_dir) is not None:
        top_up(run_dir, on_submit=on_submit, settings=settings)
        return record.load_manifest(run_dir)
    refuse_what_does_not_fit(run_dir, settings)
    return submit.submit_pending(run_dir, on_submit)


def refuse_what_does_not_fit(run_dir: Path, settings: Mapping[str, str] | None) -> None:
    """For a scheduler with queue limits that cannot wave (submitit: it writes the batch script, so no
    job of the sweep can submit the next on its way out): an error, before anything is submitted, when
    the run's jobs not yet queued are more than the limits leave room for now."""
    manifest = record.load_manifest(run_dir)
    scheduler = backends.get(manifest["backend"])
    key = "arrays" if manifest.get("arrays") else "jobs"
    pending = [e for e in manifest[key] if not e.get("job_id") and e["state"] == State.NOT_SUBMITTED.value]
    if scheduler.can_wave or manifest.get("dry_run") or not pending:
        return
    qos, account = _spec_queue(run_dir, pending[0])
    room = scheduler.queue_room(settings, qos, account)
    total = sum(weight(e) for e in pending)
    tight = room.binding if room is not None else None
    if room is None or tight is None or total <= tight.room:
        return
    raise JobgenError(
        f"{tight.room} of the {total} job(s) fit in the queue now ({tight.describe()}; you have {room.queued} "
        f"queued) and the {scheduler.name} backend cannot submit in waves: use launch.backend = 'sbatch' "
        f"(launch.max_queued), or sweep fewer points; nothing was submitted (once there is room: "
        f"jobgen submit --resume {run_dir})"
    )


def _spec_queue(run_dir: Path, entry: dict[str, Any]) -> tuple[str, str]:
    """The QOS and account a job asks for (its spec.json's [slurm]); "" where it names none."""
    try:
        spec = json.loads((run_dir / entry["spec"]).read_text(encoding="utf-8"))
        said = spec.get("slurm") or {}
        return str(said.get("qos") or ""), str(said.get("account") or "")
    except (OSError, ValueError, KeyError, AttributeError):
        return "", ""


def start(run_dir: Path, max_queued: int, qos: str, account: str) -> None:
    """Make the run wave: waves.json written, every job that waits recorded as WAITING."""
    record.atomic_write(
        run_dir / WAVES,
        json.dumps({"schema": SCHEMA, "max_queued": max_queued, "qos": qos, "account": account}) + "\n",
    )


def stop_sweep(run_dir: Path, names: Sequence[str] = ()) -> list[str]:
    """For `jobgen cancel`, before the jobs are cancelled: the waiting jobs (or arrays) are recorded
    CANCELLED (never submitted), the named ones of a sweep of jobs, or all. For the whole run, once this
    returns nothing of it is submitted or requeued by a top-up, a job on its way out or a status: its
    waves stop, a halving run promotes no more (`jobgen requeue` lifts that). The names cancelled."""
    with record.run_lock(run_dir):  # a top-up submits under it: none is half-way when this goes on
        manifest = record.load_manifest(run_dir)
        key = "arrays" if manifest.get("arrays") else "jobs"
        if names and key == "arrays":
            return []  # a waiting array goes in whole: a task of it is cancelled once it is queued
        if not names:
            if manifest.get("halving"):
                halving.cancel(halving.root(run_dir))
            _stop(run_dir)
        waiting = [
            e
            for e in manifest[key]
            if not e.get("job_id") and e["state"] == State.WAITING.value and (not names or e["name"] in names)
        ]
        _record(run_dir, key, waiting, {"state": State.CANCELLED.value, "cancel_requested_at": now_iso()})
        return [e["name"] for e in waiting]


def mark_waiting(run_dir: Path, key: str, waiting: list[dict[str, Any]]) -> None:
    """Record the entries left for a later wave as WAITING (the jobs of an array too)."""
    _record(run_dir, key, waiting, {"state": State.WAITING.value})


def _record(run_dir: Path, key: str, entries: list[dict[str, Any]], fields: dict[str, Any]) -> None:
    """The same fields for these entries of manifest[key]: jobs, or arrays and the jobs of each."""
    if not entries:
        return
    record.update_jobs(run_dir, {e["name"]: fields for e in entries}, key=key)
    if key == "arrays":
        record.update_jobs(run_dir, {name: fields for e in entries for name in e["tasks"]})


@dataclass(frozen=True)
class Queued:
    """The run's jobs in the queue now, as a top-up counts them. A job the scheduler no longer knows has ended."""

    count: int  # queued (pending, running, suspended), the leaving job not counted
    going: bool  # the leaving job is one of them and running: on its way out
    pending: int
    last: bool  # the leaving job has the greatest id of those queued
    infos: dict[str, JobInfo]


def queued_of(scheduler: Scheduler, manifest: dict[str, Any], leaving: str | None) -> Queued:
    """The run's jobs queued now (Queued); `leaving`: the job running the top-up on its way out."""
    ids = [i for job in manifest["jobs"] if job.get("job_id") for i in (job.get("segments") or [job["job_id"]])]
    if not ids:
        return Queued(0, False, 0, False, {})
    infos = scheduler.states(ids)
    if isinstance(infos, Answer) and infos.silent:
        # No answer is no news: counting its jobs as ended would queue more than max_queued.
        raise JobgenError(f"the run's queued jobs are unknown ({infos.silent}); the waiting ones stay WAITING")
    active = {i for i in ids if i in infos and not infos[i].state.is_final}
    going = leaving is not None and leaving in active and infos[leaving].state is State.RUNNING
    pending = sum(1 for i in active if infos[i].state in (State.PENDING, State.REQUEUED, State.SUBMITTED))
    last = going and max(active, key=_id_order) == leaving
    return Queued(len(active) - (1 if going else 0), going, pending, last, dict(infos))


def _id_order(job_id: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", job_id))


def resumable(run_dir: Path, manifest: dict[str, Any], queued: Queued, leaving: str | None) -> list[tuple[str, int]]:
    """(job, rung) for each job of a halving run that a decision promoted past the rung it paused at and
    that nobody requeued yet: each needs a queue slot to resume (decisions applied first, as `jobgen
    status` applies them). [] for a run without halving."""
    found = halving_view.settings(run_dir)
    if found is None:
        return []
    halving_view.settle(run_dir, found)
    jobs = {job["name"]: job for job in manifest["jobs"]}
    out = []
    for name, rung in halving_view.Board.read(run_dir, found).waiting(jobs):
        job = jobs[name]
        job_id = job.get("job_id")
        # A chain: the segment that paused (it reported at the rung), the ones after it held behind it.
        target = halving_view.requeue_id(run_dir, found, name, rung) if job.get("segments") else None
        info = queued.infos.get(target or job_id or "")
        ended = info is None or info.state.is_final or (target or job_id) == leaving
        if not job_id or not ended or (run_dir / job["dir"] / "result.json").exists():
            continue  # never submitted, still queued or running (it goes on by itself), or finished
        if not halving.requeued(halving.root(run_dir), rung, name):
            out.append((name, rung))
    return out


@dataclass(frozen=True)
class TopUp:
    """What a top-up did: entries submitted, promoted jobs requeued (halving), entries still waiting, and
    the run's jobs queued when it looked (the leaving job not counted)."""

    submitted: int = 0
    requeued: int = 0
    waiting: int = 0
    queued: int = 0
    full: str = ""  # the limit that left no room for the first in line (Limit.describe), if one did

    def stalled(self, run_dir: Path) -> str:
        """One line when jobs wait and no job of the sweep is queued to top up as it ends; else ""."""
        if not self.waiting or self.queued:
            return ""
        why = f" ({self.full})" if self.full else ""
        return (
            f"{self.waiting} job(s) WAITING and no job of the sweep is queued to submit them as it ends{why}: "
            f"run `jobgen top-up {run_dir}` (or `jobgen status`) once jobs have ended"
        )


def top_up(
    run_dir: Path,
    leaving: str | None = None,
    on_submit: Any = None,
    wait_if_last: bool = False,
    settings: Mapping[str, str] | None = None,
) -> TopUp:
    """Submit the run's waiting jobs that fit now (TopUp says what it did). Cheap for a run that does
    not wave: no Slurm call. In a halving run, the paused jobs a decision promoted are
    requeued first, each in a slot of its own. `leaving`: the job (id as recorded) running this on its
    way out. `wait_if_last`: when nothing fits, no job of the sweep is pending (a pending one tops up
    when it ends) and the leaving job has the greatest id of the sweep's queued jobs, wait for room
    (LAST_WAIT_S at most): the others queued may be on their way out too (the tasks of an array end
    together, and a waiting array needs all their slots), or the controller may still hold the records
    of ended jobs (MaxJobCount, until MinJobAge passes); else nothing might submit the rest. The jobs
    with smaller ids leave at once: one waits for all. `settings`: the scheduler's, when the caller has
    them (else asked when the limits are)."""
    waves = read(run_dir)
    if waves is None:
        return TopUp()
    from jobgen.commands import submit

    deadline = time.monotonic() + LAST_WAIT_S
    while True:
        with record.run_lock(run_dir):
            if read(run_dir) is None:
                return TopUp()  # stopped while this waited for the lock (jobgen cancel)
            manifest = record.load_manifest(run_dir)
            key = "arrays" if manifest.get("arrays") else "jobs"
            waiting = [e for e in manifest[key] if not e.get("job_id") and e["state"] == State.WAITING.value]
            halved = bool(manifest.get("halving"))
            if not waiting and not halved:
                _stop(run_dir)
                return TopUp()
            scheduler = backends.get(manifest["backend"])
            queued = queued_of(scheduler, manifest, leaving)
            promoted = resumable(run_dir, manifest, queued, leaving) if halved else []
            if not waiting and not promoted and queued.count == 0:
                _stop(run_dir)  # nothing waits, and no job is left that could promote one
                return TopUp()
            free = int(waves["max_queued"]) - queued.count
            # The limits are asked only when the run's own bound leaves room for the first in line.
            first, full = 1 if promoted else weight(waiting[0]) if waiting else 0, ""
            if first and free >= first:
                # The job on its way out still counts for the submit limits (its slot is the next job's);
                # its record stays for MaxJobCount until MinJobAge passes.
                going = 1 if queued.going else 0
                qos, account = str(waves.get("qos") or ""), str(waves.get("account") or "")
                settings = settings or scheduler.settings()
                room = scheduler.queue_room(settings, qos, account, enough=first - going)
                for limit in room.limits if room is not None else ():
                    free = min(free, limit.room + (going if limit.name != "MaxJobCount" else 0))
                    full = limit.describe() if free < first and not full else full
            requeued = _requeue(run_dir, manifest, scheduler, promoted[: max(0, free)])
            chosen = _fitting(waiting, free - requeued)
            if chosen:
                submit.submit_entries(run_dir, manifest, key, chosen, on_submit)
                if len(chosen) == len(waiting) and not halved:
                    _stop(run_dir)
            now = queued.count + requeued + sum(weight(e) for e in chosen)
            done = TopUp(len(chosen), requeued, len(waiting) - len(chosen), now, full)
            # A job queued now (submitted or requeued) tops up in its turn when it ends.
            if chosen or requeued or not (wait_if_last and queued.last and queued.pending == 0):
                return done
        if time.monotonic() > deadline:
            return done
        time.sleep(_POLL_S)


def _stop(run_dir: Path) -> None:
    """The run waves no more: its jobs' exit paths and the commands leave it alone."""
    with contextlib.suppress(OSError):
        (run_dir / WAVES).unlink()


def _requeue(run_dir: Path, manifest: dict[str, Any], scheduler: Scheduler, promoted: list[tuple[str, int]]) -> int:
    """Requeue these promoted jobs of a halving run (each once per promotion, whoever tries); how many
    went back in the queue."""
    found = halving_view.settings(run_dir)
    if found is None:
        return 0
    base, done = halving.root(run_dir), 0
    ids = {job["name"]: job.get("job_id") for job in manifest["jobs"]}
    for name, rung in promoted:
        target = halving_view.requeue_id(run_dir, found, name, rung) or ids.get(name)
        if not target or not halving.first_requeue(base, rung, name):
            continue
        try:
            scheduler.requeue(str(target), what=f"requeueing {name}, promoted past rung {rung}")
        except JobgenError:
            halving.forget_requeue(base, rung, name)  # the next top-up or status tries again
            continue
        # Recorded as queued again: a state recorded as ended is not asked about again.
        record.update_jobs(run_dir, {name: {"state": State.REQUEUED.value}})
        done += 1
    return done


def _fitting(waiting: list[dict[str, Any]], free: int) -> list[dict[str, Any]]:
    """The first waiting entries, in order, whose jobs fit in `free` slots."""
    chosen, used = [], 0
    for entry in waiting:
        if used + weight(entry) > free:
            break
        chosen.append(entry)
        used += weight(entry)
    return chosen


def count_waiting(run_dir: Path) -> int:
    """How many jobs of a run wait for room in the queue."""
    try:
        manifest = record.load_manifest(run_dir)
    except JobgenError:
        return 0
    return sum(1 for job in manifest["jobs"] if job.get("state") == State.WAITING.value)
