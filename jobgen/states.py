"""One enum for job states, and the one table that maps Slurm's state strings onto it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class State(str, enum.Enum):
    DRY_RUN = "DRY_RUN"
    NOT_SUBMITTED = "NOT_SUBMITTED"
    WAITING = "WAITING"  # not submitted yet: waits for room in the queue (launch.max_queued)
    SUBMITTED = "SUBMITTED"
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    REQUEUED = "REQUEUED"
    SUSPENDED = "SUSPENDED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    UNKNOWN = "UNKNOWN"

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATES

    def __str__(self) -> str:
        return self.value


FINAL_STATES = frozenset(
    {
        State.COMPLETED,
        State.FAILED,
        State.CANCELLED,
        State.TIMEOUT,
        State.OUT_OF_MEMORY,
        State.NODE_FAIL,
        State.PREEMPTED,
        State.DRY_RUN,
        State.NOT_SUBMITTED,
    }
)

# Long forms (sacct, squeue -o %T, scontrol) and short forms (squeue -o %t).
SLURM_STATES: dict[str, State] = {
    "PENDING": State.PENDING,
    "PD": State.PENDING,
    "CONFIGURING": State.PENDING,
    "CF": State.PENDING,
    "REQUEUE_HOLD": State.PENDING,
    "RH": State.PENDING,
    "REQUEUE_FED": State.PENDING,
    "RF": State.PENDING,
    "RESV_DEL_HOLD": State.PENDING,
    "RD": State.PENDING,
    "RUNNING": State.RUNNING,
    "R": State.RUNNING,
    "COMPLETING": State.RUNNING,
    "CG": State.RUNNING,
    "STAGE_OUT": State.RUNNING,
    "SO": State.RUNNING,
    "SIGNALING": State.RUNNING,
    "SI": State.RUNNING,
    "RESIZING": State.RUNNING,
    "RS": State.RUNNING,
    "REQUEUED": State.REQUEUED,
    "RQ": State.REQUEUED,
    "SUSPENDED": State.SUSPENDED,
    "S": State.SUSPENDED,
    "STOPPED": State.SUSPENDED,
    "ST": State.SUSPENDED,
    "COMPLETED": State.COMPLETED,
    "CD": State.COMPLETED,
    "FAILED": State.FAILED,
    "F": State.FAILED,
    "BOOT_FAIL": State.NODE_FAIL,
    "BF": State.NODE_FAIL,
    "DEADLINE": State.TIMEOUT,
    "DL": State.TIMEOUT,
    "SPECIAL_EXIT": State.FAILED,
    "SE": State.FAILED,
    "REVOKED": State.CANCELLED,
    "RV": State.CANCELLED,
    "CANCELLED": State.CANCELLED,
    "CA": State.CANCELLED,
    "TIMEOUT": State.TIMEOUT,
    "TO": State.TIMEOUT,
    "OUT_OF_MEMORY": State.OUT_OF_MEMORY,
    "OOM": State.OUT_OF_MEMORY,
    "NODE_FAIL": State.NODE_FAIL,
    "NF": State.NODE_FAIL,
    "PREEMPTED": State.PREEMPTED,
    "PR": State.PREEMPTED,
}


def from_slurm(text: str) -> State:
    """Map a Slurm state string ("CANCELLED by 0", "RUNNING", "CD", "COMPLETED+") to a State."""
    word = text.strip().split(" ", 1)[0].rstrip("+*").upper()
    if not word:
        return State.UNKNOWN
    return SLURM_STATES.get(word, State.UNKNOWN)


def parse(text: str) -> State:
    """Read a state stored in a manifest; unknown strings become UNKNOWN."""
    try:
        return State(text)
    except ValueError:
        return from_slurm(text)


class Answer(dict[str, "JobInfo"]):
    """A scheduler's answer about some jobs (id -> JobInfo). `silent` says why it could say nothing of
    the jobs missing from it (its controller did not answer, its tools failed); "" when it answered, so
    that a job it does not name is one it no longer holds (or a scheduler that keeps no jobs)."""

    silent: str = ""


@dataclass(slots=True)
class JobInfo:
    """What a scheduler (or the run's files) says about one job: the one shape every backend answers in."""

    state: State
    elapsed: str = ""
    nodes: str = ""
    nodelist: str = ""
    exit_code: str = ""
    start: str = ""
    end: str = ""
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
