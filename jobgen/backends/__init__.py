"""Backends start jobs. They share one small interface; the run directory is written before them.

Where jobs stand is not a backend's business: jobgen.track asks Slurm (or reads the run's files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from jobgen.errors import BackendError


class Backend(Protocol):
    name: str

    def submit_command(self, script: Path) -> list[str]:
        """The exact command that submits (or runs) one job's script."""

    def submit(self, run_dir: Path, job: dict[str, Any]) -> dict[str, Any]:
        """Start one manifest job; returns the fields to record (job_id, state, ...)."""

    def cancel(self, job_ids: list[str]) -> None:
        """Cancel the jobs."""

    def find(self, run_dir: Path, entries: list[dict[str, Any]], since: str) -> dict[str, list[str]]:
        """Ids the scheduler already holds for these manifest entries (by name), submitted since `since`:
        what an earlier submit whose reply was lost may have queued."""


def get_backend(name: str) -> Backend:
    if name == "sbatch":
        from jobgen.backends.sbatch import SbatchBackend

        return SbatchBackend()
    if name == "local":
        from jobgen.backends.local import LocalBackend

        return LocalBackend()
    if name == "submitit":
        try:
            from jobgen.backends.submitit_backend import SubmititBackend
        except ImportError as exc:
            raise BackendError(f"the submitit backend needs submitit: pip install 'jobgen[submitit]' ({exc})") from None
        return SubmititBackend()
    raise BackendError(f"unknown backend {name!r}; use sbatch, submitit or local")
