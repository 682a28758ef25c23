"""What a scheduler is: everything about starting and following jobs that differs from one to another.

Each backend is one module in jobgen/backends/ (its file name is its `launch.backend` name) that
defines `SCHEDULER`, an instance of a Scheduler subclass. Nothing outside this package compares
backend names: it asks the run's scheduler (docs/backends.md).
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from jobgen.errors import JobgenError
from jobgen.facts import JobShape
from jobgen.states import JobInfo

if TYPE_CHECKING:
    from jobgen.backends._queue import QueueRoom


@dataclass(frozen=True, slots=True)
class Attempt:
    """One time a job ran, as the scheduler's accounting recorded it (a requeue runs a job again)."""

    started: bool  # False: it never started (pending, or cancelled in the queue); the rest is then zero
    elapsed_s: int  # wall seconds it held its allocation (so far, while it runs)
    limit_s: int | None  # its time limit (None: unlimited or unknown)
    cpus: int | None  # what it was allocated (None: the accounting does not say)
    gpus: int | None  # None also where the accounting does not track GPUs
    energy_j: int | None  # None where the cluster records no energy (no plugin: sacct says 0 or nothing)
    # The accounting calls this attempt over for good (a final state; REQUEUED is not): its numbers no
    # longer change, so jobgen may keep them (jobgen.results.cost.keep_usage).
    final: bool = False


class Scheduler:
    """The defaults are a scheduler that can do the least; subclasses say what they can do."""

    name: ClassVar[str]
    doc: ClassVar[str]  # one line for `jobgen schema` and --help
    template: ClassVar[str]  # the Jinja template (jobgen/templates) a job's script is rendered from
    script_name: ClassVar[str]  # the rendered script's file name in the job folder
    # Log files by stream ('out', 'err'), as glob patterns relative to the job folder.
    logs: ClassVar[dict[str, tuple[str, ...]]]
    # Jobs run on this machine while `submit` waits: its interpreter, its output, a summary at the end.
    runs_here: ClassVar[bool] = False
    can_chain: ClassVar[bool] = False  # slurm.chain: segments that start when the one before ends
    can_array: ClassVar[bool] = False  # launch.array: a sweep as one job array
    can_test_only: ClassVar[bool] = False  # submit --test-only: ask the scheduler without queueing
    can_retry: ClassVar[bool] = False  # slurm.retries: its batch script requeues a failed job elsewhere
    # launch.max_queued: a job that ends submits the sweep's waiting jobs (its batch script's exit path)
    can_wave: ClassVar[bool] = False

    # ---- rendering and submitting
    def python(self) -> str:
        """The interpreter the jobs run when env.python is empty."""
        return "python"

    def submit_command(self, script: Path) -> list[str]:
        """The exact command that submits (or runs) one job's script, for the record."""
        raise NotImplementedError

    def submit(self, run_dir: Path, job: dict[str, Any]) -> dict[str, Any]:
        """Start one manifest job; returns the fields to record (job_id, state, ...)."""
        raise NotImplementedError

    def submit_chain(self, run_dir: Path, job: dict[str, Any], segments: int) -> dict[str, Any]:
        raise JobgenError(f"the {self.name} backend cannot chain jobs")

    def submit_array_task(self, run_dir: Path, array: dict[str, Any], index: int, what: str) -> str:
        """Submit one task of an array again (requeue of a task Slurm forgot); its new id."""
        raise JobgenError(f"the {self.name} backend has no job arrays")

    def settings(self) -> Mapping[str, str] | None:
        """The scheduler's settings that its queue limits and array size are read from (Slurm's `scontrol
        show config`), asked once by a command and passed to queue_room and max_array_size; None where
        there are none or they cannot be read."""
        return None

    def max_array_size(self, settings: Mapping[str, str] | None) -> int:
        """How many tasks one job array may have (jobs of a bigger sweep go in several arrays)."""
        raise JobgenError(f"the {self.name} backend has no job arrays")

    def max_time(self, partition: str) -> int | None:
        """The longest time limit, in seconds, a job of this partition ("" = the default one) may ask
        for; None when there is none (or the scheduler keeps no time limits)."""
        return None

    def queue_room(
        self, settings: Mapping[str, str] | None, qos: str = "", account: str = "", enough: int = 0
    ) -> QueueRoom | None:
        """The limits on queued jobs that apply to this user's jobs of this QOS and account ("" = the
        defaults), with the jobs each counts now; None where the scheduler has no queue to fill.
        `enough`: the caller only asks whether that many more fit (jobgen.backends._queue.read)."""
        return None

    def test_only(self, script: Path) -> tuple[bool, str]:
        """Whether the scheduler would accept a script, and its words; queues nothing."""
        raise JobgenError(f"the {self.name} backend cannot check scripts without submitting them")

    def find(self, run_dir: Path, entries: list[dict[str, Any]], since: str) -> dict[str, list[str]]:
        """Ids the scheduler already holds for these manifest entries (by name), submitted since `since`:
        what an earlier submit whose reply was lost may have queued."""
        return {}

    # ---- following and steering
    def states(self, job_ids: list[str]) -> dict[str, JobInfo]:
        """What the scheduler says about each job id it knows; the rest are judged by their files."""
        return {}

    def cancel(self, job_ids: list[str]) -> None:
        return None

    def usage(self, job_ids: list[str]) -> dict[str, list[Attempt]]:
        """Every attempt of each job id the scheduler's accounting knows; {} where it keeps
        none (the summary then reckons from the request). Asked by summary and report, never by status."""
        return {}

    def requeue_refusal(self, run_dir: Path) -> str | None:
        """Why `jobgen requeue` cannot work for this scheduler's runs (None: it can)."""
        return (
            f"{run_dir} ran with the {self.name} backend, which cannot requeue "
            "(submit the experiment again to repeat it)"
        )

    def requeue(self, job_id: str, what: str) -> None:
        """Put an ended (or running) job back in the queue under the same id."""
        raise JobgenError(f"the {self.name} backend cannot requeue")

    def signal(self, job_id: str, signal: str, what: str) -> None:
        """Send a signal to a running job's steps."""
        raise JobgenError(f"the {self.name} backend cannot signal jobs")

    # ---- files
    def log_files(self, job_dir: Path, stream: str | None = None) -> list[Path]:
        """The job's log files of one stream (None: every stream), oldest first."""
        by_folder: dict[str, list[str]] = {}
        for s, ps in self.logs.items():
            if stream in (None, s):
                for pattern in ps:
                    folder, _, name = pattern.rpartition("/")
                    by_folder.setdefault(folder, []).append(name)
        found: set[Path] = set()
        for folder, names in by_folder.items():  # each folder listed once, however many patterns name it
            base = job_dir / folder if folder else job_dir
            matches = _matcher(tuple(names))
            try:
                with os.scandir(base) as entries:
                    found.update(base / e.name for e in entries if matches(e.name) and e.is_file())
            except OSError:
                continue
        return _in_order(list(found))

    # ---- rules
    def shape_problems(self, shape: JobShape) -> list[str]:
        """Job shapes this scheduler cannot start, each with its fix."""
        return []


@functools.lru_cache(maxsize=64)
def _matcher(patterns: tuple[str, ...]) -> Callable[[str], re.Match[str] | None]:
    """One compiled regular expression for these file-name patterns (fnmatchcase's, each matched whole)."""
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)).match


def _in_order(logs: list[Path]) -> list[Path]:
    """Logs oldest first, as oldest_first orders them. The streams of one job id (Slurm's
    `slurm-<id>.out` and `.err`, submitit's `<id>_<task>_log.out` and `.err`) are put in name order
    without a stat: which of the two was written to last says nothing of the order of attempts
    (jobgen.results.diagnose orders them by time itself)."""
    if len({log.name.rpartition(".")[0] or log.name for log in logs}) <= 1:
        return sorted(logs, key=lambda log: log.name)
    return sorted(logs, key=oldest_first)


def oldest_first(path: Path) -> tuple[float, str]:
    """Sort key for log files: by modification time, then name (a vanished file sorts first)."""
    try:
        return path.stat().st_mtime, path.name
    except OSError:
        return 0.0, path.name
