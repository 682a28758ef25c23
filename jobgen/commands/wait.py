"""Waiting for a run's jobs: `jobgen status --watch` and `jobgen.api.Run.wait` read the run the same way."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from jobgen.errors import WaitTimeout
from jobgen.record.model import Run
from jobgen.results.state_rule import read_runs
from jobgen.results.status_view import StatusView, read_status

Reading = TypeVar("Reading")


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

    def read() -> Run:
        (loaded,) = read_runs([run_dir], refresh=refresh)
        return loaded

    return _poll(read, lambda run: all(job.state.is_final for job in run.jobs), run_dir, interval, timeout, sleep)


def watch_status(
    run_dir: Path,
    *,
    interval: float = 10.0,
    timeout: float | None = None,
    refresh: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[StatusView]:
    """Like watch, as `jobgen status` shows it (jobgen.results.status_view.read_status)."""
    return _poll(lambda: read_status(run_dir, refresh), lambda view: view.all_final, run_dir, interval, timeout, sleep)


def _poll(
    read: Callable[[], Reading],
    ended: Callable[[Reading], bool],
    run_dir: Path,
    interval: float,
    timeout: float | None,
    sleep: Callable[[float], None],
) -> Iterator[Reading]:
    started = time.monotonic()
    while True:
        reading = read()
        yield reading
        if ended(reading):
            return
        if timeout is not None and time.monotonic() - started > timeout:
            raise WaitTimeout(f"jobs still running after {timeout:.0f} s; check again with: jobgen status {run_dir}")
        gc.collect()  # once a round: the CLI runs its commands without the automatic collector
        sleep(interval)
