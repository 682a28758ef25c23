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
from pathlib import Path
from typing import Any

from jobgen import backends
from jobgen.backends import Scheduler
from jobgen.backends._queue import QueueRoom, max_queued
from jobgen.errors import JobgenError
from jobgen.record import store as record
from jobgen.states import Answer, State

WAVES = "waves.json"  # in a run folder while jobs of it wait for room in the queue
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


def first_wave(run_dir: Path) -> str | None:
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
    scheduler = backends.get(manifest["backend"])
    total = sum(weight(e) for e in entries)
    room = scheduler.queue_room(str(queue.get("qos") or ""), str(queue.get("account") or ""))
    line = room.fit_line(total) if room is not None else None
    max_queued = max_queued_for(int(queue.get("max_queued") or 0), int(queue.get("reserve") or 0), room)
    if max_queued is None or total <= max_queued:
        return line
    start(run_dir, max_queued, str(queue.get("qos") or ""), str(queue.get("account") or ""))
    mark_waiting(run_dir, key, entries)
    return line


def submit_run(run_dir: Path, on_submit: Any = None, say: Any = None) -> dict[str, Any]:
    """Submit a written run as `jobgen submit` and jobgen.api.submit do; its manifest after. Its first
    submission reads the queue's room (first_wave; `say` gets the line on how many jobs fit) and waves
    when the sweep does not fit; a scheduler that cannot wave refuses a sweep larger than the room
    before it submits anything."""
    from jobgen.commands import submit

    line = first_wave(run_dir)
    if line and say is not None:
        say(line)
    if read(run_dir) is not None:
        top_up(run_dir, on_submit=on_submit)
        return record.load_manifest(run_dir)
    refuse_what_does_not_fit(run_dir)
    return submit.submit_pending(run_dir, on_submit)


def refuse_what_does_not_fit(run_dir: Path) -> None:
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
    room = scheduler.queue_room(qos, account)
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


def max_queued_for(asked: int, reserve: int, room: QueueRoom | None) -> int | None:
    """The sweep's most queued jobs (jobgen.backends._queue.max_queued)."""
    return max_queued(asked, reserve, room)


def start(run_dir: Path, max_queued: int, qos: str, account: str) -> None:
    """Make the run wave: waves.json written, every job that waits recorded as WAITING."""
    record.atomic_write(
        run_dir / WAVES,
        json.dumps({"schema": SCHEMA, "max_queued": max_queued, "qos": qos, "account": account}) + "\n",
    )


def mark_waiting(run_dir: Path, key: str, waiting: list[dict[str, Any]]) -> None:
    """Record the entries left for a later wave as WAITING (the jobs of an array too)."""
    if not waiting:
        return
    record.update_jobs(run_dir, {e["name"]: {"state": State.WAITING.value} for e in waiting}, key=key)
    if key == "arrays":
        tasks = {name: {"state": State.WAITING.value} for e in waiting for name in e["tasks"]}
        record.update_jobs(run_dir, tasks)


def queued_of(scheduler: Scheduler, manifest: dict[str, Any], leaving: str | None) -> tuple[int, bool, int, bool]:
    """(how many of the run's jobs are queued now, whether `leaving` is one of them and running: a job
    on its way out, which is not counted; how many are pending; whether `leaving` has the greatest id
    of those queued). A job the scheduler no longer knows has ended."""
    ids = [i for job in manifest["jobs"] if job.get("job_id") for i in (job.get("segments") or [job["job_id"]])]
    if not ids:
        return 0, False, 0, False
    infos = scheduler.states(ids)
    if isinstance(infos, Answer) and infos.silent:
        # No answer is no news: counting its jobs as ended would queue more than max_queued.
        raise JobgenError(f"the run's queued jobs are unknown ({infos.silent}); the waiting ones stay WAITING")
    active = {i for i in ids if i in infos and not infos[i].state.is_final}
    going = leaving is not None and leaving in active and infos[leaving].state is State.RUNNING
    pending = sum(1 for i in active if infos[i].state in (State.PENDING, State.REQUEUED, State.SUBMITTED))
    last = going and max(active, key=_id_order) == leaving
    return len(active) - (1 if going else 0), going, pending, last


def _id_order(job_id: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", job_id))


def top_up(
    run_dir: Path, leaving: str | None = None, on_submit: Any = None, wait_if_last: bool = False
) -> tuple[int, int]:
    """Submit the run's waiting jobs that fit now; (entries submitted, entries still waiting). Cheap for
    a run that does not wave: no Slurm call. `leaving`: the job (id as recorded) running this on its way
    out. `wait_if_last`: when nothing fits, no job of the sweep is pending (a pending one tops up when it
    ends) and the leaving job has the greatest id of the sweep's queued jobs, wait for room (LAST_WAIT_S
    at most): the others queued may be on their way out too (the tasks of an array end together, and a
    waiting array needs all their slots), or the controller may still hold the records of ended jobs
    (MaxJobCount, until MinJobAge passes); else nothing might submit the rest. The jobs with smaller ids
    leave at once: one waits for all."""
    waves = read(run_dir)
    if waves is None:
        return 0, 0
    from jobgen.commands import submit

    deadline = time.monotonic() + LAST_WAIT_S
    while True:
        with record.run_lock(run_dir):
            manifest = record.load_manifest(run_dir)
            key = "arrays" if manifest.get("arrays") else "jobs"
            waiting = [e for e in manifest[key] if not e.get("job_id") and e["state"] == State.WAITING.value]
            if not waiting:
                with contextlib.suppress(OSError):
                    (run_dir / WAVES).unlink()
                return 0, 0
            scheduler = backends.get(manifest["backend"])
            queued, going, pending, last = queued_of(scheduler, manifest, leaving)
            free = int(waves["max_queued"]) - queued
            # The limits are asked only when the run's own bound leaves room for the first in line.
            first = weight(waiting[0])
            if free >= first:
                # The job on its way out still counts for the submit limits (its slot is the next job's);
                # its record stays for MaxJobCount until MinJobAge passes.
                bonus = 1 if going else 0
                qos, account = str(waves.get("qos") or ""), str(waves.get("account") or "")
                room = scheduler.queue_room(qos, account, enough=first - bonus)
                for limit in room.limits if room is not None else ():
                    free = min(free, limit.room + (bonus if limit.name != "MaxJobCount" else 0))
            chosen = _fitting(waiting, free)
            if chosen:
                submit.submit_entries(run_dir, manifest, key, chosen, on_submit)
                left = len(waiting) - len(chosen)
                if not left:
                    with contextlib.suppress(OSError):
                        (run_dir / WAVES).unlink()
                return len(chosen), left
        if not (wait_if_last and last and pending == 0) or time.monotonic() > deadline:
            return 0, len(waiting)
        time.sleep(_POLL_S)


def _fitting(waiting: list[dict[str, Any]], free: int) -> list[dict[str, Any]]:
    """The first waiting entries, in order, whose jobs fit in `free` slots."""
    chosen, used = [], 0
    for entry in waiting:
        if used + weight(entry) > free:
            break
        chosen.append(entry)
        used += weight(entry)
    return chosen


def load_manifest(run_dir: Path) -> dict[str, Any]:
    return record.load_manifest(run_dir)


def count_waiting(run_dir: Path) -> int:
    """How many jobs of a run wait for room in the queue."""
    try:
        manifest = record.load_manifest(run_dir)
    except JobgenError:
        return 0
    return sum(1 for job in manifest["jobs"] if job.get("state") == State.WAITING.value)
