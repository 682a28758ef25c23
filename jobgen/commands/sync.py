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
from jobgen.run.store import load_manifest


def offline_runs(run_dir: Path) -> list[Path]:
    """Every offline W&B run folder of the run's jobs, in manifest order."""
    found = []
    for job in load_manifest(run_dir)["jobs"]:
        wandb_dir = run_dir / str(job.get("dir") or f"jobs/{job['name']}") / "wandb"
        if wandb_dir.is_dir():
            found += sorted(p for p in wandb_dir.glob("offline-run-*") if p.is_dir())
    return found


def sync(run_dirs: Sequence[Path], extra: Sequence[str] = ()) -> list[Path]:
    """Run `wandb sync` on every offline run folder of these runs; returns the folders synced."""
    folders = [folder for run_dir in run_dirs for folder in offline_runs(run_dir)]
    if not folders:
        names = ", ".join(str(r) for r in run_dirs)
        raise JobgenError(f'no offline W&B runs in {names}: were its jobs run with train.loggers = [..., "wandb"]?')
    wandb = shutil.which("wandb")
    if wandb is None:
        raise JobgenError("the wandb command is not installed here: pip install 'jobgen[trackers]' (or wandb)")
    # The environment passes through unchanged: W&B reads its key and host from it, we never touch them.
    done = subprocess.run([wandb, "sync", *extra, *map(str, folders)], env=dict(os.environ), check=False)
    if done.returncode != 0:
        raise JobgenError(f"wandb sync exited with {done.returncode}; its output is above (logged in? `wandb login`)")
    return folders
