"""Facts every stage of jobgen shares, each written once: the standard library only, imported by all.

Below everything else (backends, experiment, plan, record, results, commands): nothing here imports
another jobgen module, so any of them can use these without an import circle.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass
from pathlib import Path

# A job or experiment name becomes a folder and part of Slurm's job name.
MAX_NAME = 100
# A run folder's name: <YYYYmmdd-HHMMSS>-<4 hex digits> (jobgen.record.store.new_run_id).
RUN_ID_RE = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4}")
# The schema number of each record jobgen and the training write (docs/contracts.md).
MANIFEST_SCHEMA = 1
SPEC_SCHEMA = 1
RESULT_SCHEMA = 1
RETRIES_SCHEMA = 1  # retries.json, written by the batch script (jobgen/templates/_retry.j2)
SCHEMAS = {
    "manifest.json": MANIFEST_SCHEMA,
    "spec.json": SPEC_SCHEMA,
    "result.json": RESULT_SCHEMA,
    "retries.json": RETRIES_SCHEMA,
}
# Variables whose values are secrets: they never land in scripts, records or logs.
SECRET_RE = re.compile(r"TOKEN|SECRET|KEY|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def now_iso() -> str:
    """This moment in UTC, to the second, as every record stores times."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def aware_time(value: object) -> dt.datetime | None:
    """A time as the records and Slurm write it (ISO 8601), aware: jobgen's are UTC, Slurm's naive ones
    are this machine's local time. None for anything else."""
    if not isinstance(value, str):
        return None
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.astimezone()


def signal_name(text: str) -> str:
    """A signal as Slurm's options want it: 'sigusr2', 'SIGUSR2' and 'USR2' are all 'USR2'."""
    return text.upper().removeprefix("SIG")


def submit_tag(run_id: str, name: str) -> str:
    """What jobgen puts in a job's --comment: when sbatch's reply is lost, the job is found by it."""
    return f"jobgen:{run_id}:{name}"


def time_minutes(text: str) -> int:
    """Minutes of a Slurm time limit (already validated): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return 365 * 24 * 60
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        hours, minutes, seconds = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    else:
        hours, (minutes, seconds) = 0, (parts + [0])[:2]
    total = (int(days or 0) * 24 + hours) * 60 + minutes
    return max(1, total + (1 if seconds else 0))


def time_seconds(v: str) -> int | None:
    """Seconds in a Slurm time that _TIME_RE accepts; None for UNLIMITED/INFINITE. sbatch reads
    M, M:S, H:M:S without a day, and D-H, D-H:M, D-H:M:S with one."""
    if not v[:1].isdigit():
        return None
    days, _, clock = v.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:
        hours, minutes, secs = (parts + [0, 0])[:3]
    else:
        hours, minutes, secs = [[0, parts[0], 0], [0, *parts], parts][len(parts) - 1]
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + secs


@dataclass(frozen=True, slots=True)
class JobShape:
    """What a scheduler needs to know of a job to say whether it can start it (Scheduler.shape_problems):
    the experiment's values, without the experiment, so the backends need nothing above them."""

    nodes: int
    gpus_per_node: int
    accelerator: str
    launcher: str
    requeue: bool


def identity(path: Path) -> tuple[int, int] | None:
    """A file's version (version_of): another version of it has another; None when it is not there."""
    try:
        return version_of(path.stat())
    except OSError:
        return None


def version_of(stat: os.stat_result) -> tuple[int, int]:
    """What tells two versions of a file apart: its inode and mtime (ns), from a stat of it."""
    return stat.st_ino, stat.st_mtime_ns
