"""Preemption: on the warning signal, checkpoint, have the job requeued, exit.

The warning is the job's `requeue.signal` (USR2: Slurm's `--signal` before the time limit, `jobgen
requeue`) and, with requeue on, SIGTERM too: that is what Slurm sends every task when a higher-tier job
preempts this one (`PreemptMode=REQUEUE`, then SIGKILL after `GraceTime`), and what torchrun passes on.
The handler only sets a flag: the engines check it between steps (agreeing across ranks) so a
checkpoint is never taken in the middle of an optimizer step or by one rank alone.

Who asks Slurm to requeue: jobgen's batch script, on the host where `scontrol` is (it exports
JOBGEN_REQUEUE_BY=batch-shell and requeues when it finds the marker rank 0 leaves, see `marker`). Under
any other script (submitit, a user's own template) rank 0 runs `scontrol requeue` itself. Either way an
array task names itself `<array id>_<task>`: its bare SLURM_JOB_ID may be the array's own id, and
requeueing that requeues every task of the array.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from training import console

# Exit status of every rank after a checkpoint on signal: "try again". Never 0: the job has no result.
EXIT_REQUEUE = 75
# The value jobgen's batch script gives JOBGEN_REQUEUE_BY when it does the requeue itself.
BY_BATCH_SHELL = "batch-shell"


class Watcher:
    def __init__(self) -> None:
        self.requested = False
        self.signals: list[int] = []

    def install(self, name: str) -> None:
        signal.signal(signum(name), self._handle)

    def install_all(self, name: str) -> None:
        """The warning signal and SIGTERM (preemption)."""
        for number in {signum(name), signal.SIGTERM}:
            signal.signal(number, self._handle)

    def _handle(self, number: int, frame: object) -> None:
        if not self.requested:
            console.line(f"training: got signal {number}; checkpointing at the next step", err=True)
        self.requested = True
        self.signals.append(number)


def signum(name: str) -> int:
    return int(getattr(signal, name if name.startswith("SIG") else f"SIG{name}"))


def requeue_target(env: Mapping[str, str] | None = None) -> str | None:
    """The id `scontrol requeue` must name for this job: `<array id>_<task>` for an array task (the
    task that carries the array's id would otherwise requeue the whole array), else SLURM_JOB_ID."""
    env = os.environ if env is None else env
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return env.get("SLURM_JOB_ID") or None


def marker(checkpoint_dir: Path, env: Mapping[str, str] | None = None) -> Path:
    """What rank 0 writes once every rank's part of the checkpoint is complete and the job wants to be
    requeued: one per job id and attempt, so a marker from an earlier attempt means nothing now. The
    batch script (jobgen/templates/_requeue.j2) requeues the job when it finds this file."""
    env = os.environ if env is None else env
    return checkpoint_dir / f".requeue-{env.get('SLURM_JOB_ID', 'local')}-{requeue_count(env)}"


def leave_for_requeue(rank: int, checkpoint_dir: Path, warning: str = "USR2", wait_s: float = 120.0) -> None:
    """After every rank's part of the checkpoint is written: rank 0 writes the marker (first asking
    Slurm to requeue the job where no batch script of jobgen's does it), and every rank leaves with
    EXIT_REQUEUE.

    The other ranks wait for rank 0's marker before leaving: under `srun --kill-on-bad-exit` the first
    task to exit non-zero gets every other task killed, rank 0 perhaps before it wrote the marker.
    """
    # The checkpoint is written: a warning that comes now (training.relay passes one on every few
    # seconds while the launcher runs) has nothing left to ask, and once the interpreter's shutdown has
    # put the default handlers back it would kill the rank instead of letting it leave with EXIT_REQUEUE.
    for number in {signum(warning), signal.SIGTERM}:
        signal.signal(number, signal.SIG_IGN)
    job_id = os.environ.get("SLURM_JOB_ID")
    done = marker(checkpoint_dir)
    if not job_id:
        if rank == 0:
            console.line("training: not in a Slurm job; checkpoint written, exiting for a manual restart", err=True)
        raise SystemExit(EXIT_REQUEUE)
    if rank == 0:
        if os.environ.get("JOBGEN_REQUEUE_BY") == BY_BATCH_SHELL:
            asked = "the batch script requeues the job"
            console.line(f"training: checkpoint complete; {asked}", err=True)
        else:
            # Said before Slurm is asked: a requeue ends the job's steps at once, and a line printed after
            # it may never leave srun (the step's output goes through it).
            console.line("training: checkpoint complete; asking Slurm to requeue the job", err=True)
            asked = _ask_slurm()
            console.line(f"training: {asked}", err=True)
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(f"{asked}\n")
    else:
        deadline = time.monotonic() + wait_s
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    raise SystemExit(EXIT_REQUEUE)


def _ask_slurm() -> str:
    """`scontrol requeue` from the rank itself (argument list, no shell), where scontrol exists."""
    target, scontrol = requeue_target(), shutil.which("scontrol")
    if not (target and scontrol):
        return "no scontrol here: nothing requeued"
    shown = subprocess.run([scontrol, "show", "job", "-o", target], check=False, capture_output=True, text=True)
    state = shown.stdout.split("JobState=", 1)[1].split()[0] if "JobState=" in shown.stdout else "unknown"
    if state != "RUNNING":  # cancelled or timed out (SIGTERM too): it stays ended
        return f"job {target} is {state}: not requeued"
    asked = subprocess.run([scontrol, "requeue", target], check=False, capture_output=True, text=True)
    return f"scontrol requeue {target} -> rc {asked.returncode} {asked.stderr.strip()}".strip()


def requeue_count(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    return int(env.get("SLURM_RESTART_COUNT", "0") or 0)


def newest_checkpoint(directory: Path, suffix: str = "") -> Path | None:
    """The most recently written checkpoint (file or directory) that is complete (no .tmp); markers
    and other dot files are not checkpoints."""
    if not directory.is_dir():
        return None
    found = [p for p in directory.iterdir() if p.name[:1] != "." and ".tmp" not in p.name and p.name.endswith(suffix)]
    return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None
