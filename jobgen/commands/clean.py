"""`jobgen clean`: free the disk that finished jobs no longer need (their checkpoints).

Only jobs that completed (Slurm says so and their result.json is there) lose their `checkpoints/`;
a job that failed, was cancelled or is still queued keeps them, since `jobgen requeue` resumes from
them. Results, metrics, logs, scripts and specs always stay.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from jobgen.record.damage import json_problem
from jobgen.record.model import Run
from jobgen.states import State


@dataclass
class Freed:
    job: str
    path: Path
    size: int


def reclaimable(run: Run) -> list[Freed]:
    """Checkpoint folders of the run's completed jobs (states settled), with their sizes."""
    found = []
    for job in run.jobs:
        folder = job.job_dir / "checkpoints"
        # A damaged result may mean the job must run again: its checkpoints stay.
        doc, problem = job.json("result.json")
        usable = doc is not None and json_problem("result.json", doc, problem) is None
        if job.state is State.COMPLETED and usable and folder.is_dir():
            found.append(Freed(job.name, folder, _size(folder)))
    return found


def remove(items: list[Freed]) -> int:
    for item in items:
        shutil.rmtree(item.path)
    return sum(item.size for item in items)


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
