"""`jobgen sync`: upload the W&B runs that jobs wrote offline (train.loggers = [..., "wandb"]).

Compute nodes often have no internet, so jobs log to W&B offline into their own folder
(JOB_DIR/wandb/offline-run-*). From the login node, `wandb sync` uploads them. The API key stays
where W&B looks for it (WANDB_API_KEY in your shell, or `wandb login`'s ~/.netrc): jobgen never reads,
writes or passes it on a command line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from jobgen.errors import JobgenError
from jobgen.record.model import Run


def offline_runs(run: Run) -> list[Path]:
    """Every offline W&B run folder of the run's jobs, in manifest order."""
    found = []
    for job in run.jobs:
        wandb_dir = job.job_dir / "wandb"
        if wandb_dir.is_dir():
            found += sorted(p for p in wandb_dir.glob("offline-run-*") if p.is_dir())
    return found


def sync(runs: Sequence[Run], extra: Sequence[str] = ()) -> list[Path]:
    """Run `wandb sync` on every offline run folder of these runs; returns the folders synced."""
    folders = [folder for run in runs for folder in offline_runs(run)]
    if not folders:
        names = ", ".join(str(r.run_dir) for r in runs)
        raise JobgenError(f'no offline W&B runs in {names}: were its jobs run with train.loggers = [..., "wandb"]?')
    wandb = shutil.which("wandb")
    if wandb is None:
        raise JobgenError("the wandb command is not installed here: pip install 'jobgen[trackers]' (or wandb)")
    # The environment passes through unchanged: W&B reads its key and host from it, we never touch them.
    done = subprocess.run([wandb, "sync", *extra, *map(str, folders)], env=dict(os.environ), check=False)
    if done.returncode != 0:
        raise JobgenError(f"wandb sync exited with {done.returncode}; its output is above (logged in? `wandb login`)")
    return folders
