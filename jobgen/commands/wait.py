"""Waiting for a run's jobs: `jobgen status --watch` and `jobgen.api.Run.wait` read the run the same way."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from jobgen.errors import WaitTimeout
from jobgen.results.state import read_runs
from jobgen.run.model import Run


def watch(
    run_dir: Path,
    *,
    interval: float = 10.0,
    timeout: float | None = None,
    refresh: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[Run]:
    """The run, read (states settled by the one state rule) every `interval` seconds until all its jobs
    have ended; WaitTimeout once `timeout` seconds have passed with some still queued or running."""
    started = time.monotonic()
    while True:
        (loaded,) = read_runs([run_dir], refresh=refresh)
        yield loaded
        if all(job.state.is_final for job in loaded.jobs):
            return
        if timeout is not None and time.monotonic() - started > timeout:
            raise WaitTimeout(f"jobs still running after {timeout:.0f} s; check again with: jobgen status {run_dir}")
        sleep(interval)
