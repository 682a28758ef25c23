"""Preemption: on the warning signal, checkpoint, ask Slurm to requeue the job, exit.

The handler only sets a flag: the engines check it between steps (agreeing across ranks) so a
checkpoint is never taken in the middle of an optimizer step or by one rank alone.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

# Exit status after a checkpoint on signal outside Slurm (or when requeue failed): "try again".
EXIT_REQUEUE = 75


class Watcher:
    def __init__(self) -> None:
        self.requested = False

    def install(self, name: str) -> None:
        signum = getattr(signal, name if name.startswith("SIG") else f"SIG{name}")
        signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        print(f"training: got signal {signum}; checkpointing at the next step", file=sys.stderr, flush=True)
        self.requested = True


def leave_for_requeue(rank: int, checkpoint_dir: Path, wait_s: float = 120.0) -> None:
    """After every rank's part of the checkpoint is written: rank 0 asks Slurm to requeue the job
    (argument list, no shell), and every rank leaves with EXIT_REQUEUE.

    The other ranks wait for rank 0's "asked" marker before leaving: under `srun --kill-on-bad-exit`
    the first task to exit non-zero gets every other task killed, rank 0 perhaps before it asked.
    """
    job_id = os.environ.get("SLURM_JOB_ID")
    scontrol = shutil.which("scontrol")
    marker = checkpoint_dir / f".requeue-asked-{job_id}-{requeue_count()}"
    if rank == 0:
        if job_id and scontrol:
            done = subprocess.run([scontrol, "requeue", job_id], check=False, capture_output=True, text=True)
            print(
                f"training: scontrol requeue {job_id} -> rc {done.returncode} {done.stderr.strip()}",
                file=sys.stderr,
                flush=True,
            )
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(f"{done.returncode}\n")
        else:
            print(
                "training: not in a Slurm job; checkpoint written, exiting for a manual restart",
                file=sys.stderr,
                flush=True,
            )
    elif job_id and scontrol:
        deadline = time.monotonic() + wait_s
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    raise SystemExit(EXIT_REQUEUE)


def requeue_count() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def newest_checkpoint(directory: Path, suffix: str = "") -> Path | None:
    """The most recently written checkpoint (file or directory) that is complete (no .tmp)."""
    if not directory.is_dir():
        return None
    found = [p for p in directory.iterdir() if ".tmp" not in p.name and p.name.endswith(suffix)]
    return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None
