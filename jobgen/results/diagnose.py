"""Why a job did not finish: its logs' last words matched against known failures, with what to do.

The rules are ordered (see RULES); the first that matches in any log wins. Only the tail of each log
is read (a log can be gigabytes; the cause of death is at its end).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from jobgen.backends._base import oldest_first
from jobgen.results.logs import tail_lines
from jobgen.states import State
from training.progress import is_progress

_SLURM_FRAME = re.compile(r"^(?:slurmstepd|srun|slurmd)(?:-\S+)?: error: (?:\*\*\* )?|\s*\*\*\*$")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Failure)(:.*)?$")


@dataclass(frozen=True)
class Cause:
    """Why a job did not finish, read from its logs, with what to do about it."""

    kind: str  # a RULES kind ("gpu_oom", "time_limit", ...) or "exception"
    message: str  # one line, e.g. the last exception line
    hint: str
    log: str = ""  # the log file it came from, relative to the run directory


@dataclass(frozen=True)
class _Rule:
    kind: str
    pattern: re.Pattern[str]
    hint: str


# Order matters. Errors that name their cause (OOM, collective timeout, port clash) come first: they also
# raise a Python exception, and a hung job they leave behind may later be cancelled or hit the time limit.
# Slurm's own kill reasons come before a bare exception, because the SIGTERM they send makes every rank
# print a traceback that is only an echo of the kill.
RULES: tuple[_Rule, ...] = (
    _Rule(
        "gpu_oom",
        re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED"),
        "GPU out of memory: lower batch_size (raise grad_accum to keep the effective batch), use bf16, "
        "or shard with FSDP/DeepSpeed (offload)",
    ),
    _Rule(
        "host_oom",
        re.compile(r"oom[-_]kill|task \d+: Out Of Memory", re.IGNORECASE),
        "killed for host memory: raise slurm.mem, lower num_workers, or use DeepSpeed without CPU offload",
    ),
    _Rule(
        "nccl_timeout",
        # Not a bare "timeout": NCCL_DEBUG=INFO prints the configured timeout at start-up.
        re.compile(
            r"collective operation timeout|(NCCL|gloo|c10d|ProcessGroup|DistStore|distributed).*timed out"
            r"|timed out waiting \d+ ?ms for",
            re.IGNORECASE,
        ),
        "a collective timed out: one rank died or hung; read every rank's log (NCCL_DEBUG=INFO) "
        "and check that all ranks run the same steps",
    ),
    _Rule(
        "address_in_use",
        re.compile(r"address already in use|EADDRINUSE", re.IGNORECASE),
        "MASTER_PORT clash with another job on the node: derive the port from SLURM_JOB_ID and resubmit",
    ),
    _Rule(
        "time_limit",
        re.compile(r"DUE TO TIME LIMIT"),
        "hit the time limit: `jobgen requeue` continues it from its last checkpoint; raise slurm.time, "
        "or set slurm.requeue so it checkpoints before the limit",
    ),
    _Rule(
        "node_fail",
        re.compile(r"DUE TO NODE FAIL|NODE_FAIL|Node failure", re.IGNORECASE),
        "a node failed: `jobgen requeue` starts it again from its last checkpoint (exclude the node via "
        "slurm.extra if it fails again)",
    ),
    _Rule(
        "preempted",
        re.compile(r"DUE TO PREEMPTION"),
        "preempted by a higher-priority job: `jobgen requeue` resumes it from its last checkpoint; set "
        "slurm.requeue to have that happen by itself",
    ),
    _Rule(
        "cancelled",
        re.compile(r"\*\*\* JOB \S+ ON \S+ CANCELLED AT"),
        "cancelled (scancel or an admin): `jobgen requeue` starts it again if that was not intended",
    ),
)
CAUSE_STATES: dict[str, State] = {
    # A CUDA OOM is an exception, so Slurm says FAILED; OUT_OF_MEMORY is its cgroup's kill.
    "host_oom": State.OUT_OF_MEMORY,
    "time_limit": State.TIMEOUT,
    "node_fail": State.NODE_FAIL,
    "preempted": State.PREEMPTED,
    "cancelled": State.CANCELLED,
}
LAST_LINE = "last_line"  # not a diagnosis: never changes a state
EXCEPTION_HINT = "Python exception: fix it, the full traceback is in {log}"


def find_cause(paths: list[Path], base: Path) -> Cause | None:
    """The likely cause of failure from a job's logs, or None when they say nothing. `base`: the folder
    the cause's log is named relative to. The logs are taken oldest first by their times here (a list of
    them puts one job's .out and .err in name order): of one attempt's two streams, the one written to
    last is the likelier to say why it stopped."""
    if len(paths) > 1:
        paths = sorted(paths, key=oldest_first)
    logs = [(p, tail_lines(p)) for p in paths]
    for rule in RULES:
        for path, lines in logs:
            line = next((ln for ln in reversed(lines) if rule.pattern.search(ln)), None)
            if line is not None:
                return Cause(rule.kind, _clip(line), rule.hint, _rel(path, base))
    for path, lines in reversed(logs):
        line = last_exception_line(lines)
        if line is not None:
            log = _rel(path, base)
            return Cause("exception", _clip(line), EXCEPTION_HINT.format(log=log), log)
    # Nothing recognised: a program that exits with a clean one-line error still says why on its last line.
    # The training's progress lines and heartbeats (training/progress.py) say where a job was, not why it
    # stopped: the last other line, unless there is none.
    for path, lines in reversed(logs):
        if lines:
            log = _rel(path, base)
            said = next((ln for ln in reversed(lines) if not is_progress(ln)), lines[-1])
            return Cause(LAST_LINE, _clip(said), f"no known cause: read {log}", log)
    return None


def last_exception_line(lines: list[str]) -> str | None:
    """The last 'SomeError: message' line that follows a traceback."""
    if not any("Traceback (most recent call last)" in ln for ln in lines):
        return None
    # torchrun's ChildFailedError only says that a rank failed; the rank's own exception says why.
    found = [ln for ln in reversed(lines) if _EXCEPTION_LINE.match(ln)]
    return next((ln for ln in found if "ChildFailedError" not in ln), found[0] if found else None)


def _rel(path: Path, base: Path) -> str:
    # As Path.relative_to, on strings: a status asks it once per ended job.
    text, root = str(path), str(base).rstrip("/") + "/"
    if text.startswith(root) and len(text) > len(root):
        return text[len(root) :]
    return "." if text == str(base) else text


def _clip(line: str, width: int = 200) -> str:
    line = _SLURM_FRAME.sub("", line)
    return line if len(line) <= width else line[: width - 1] + "…"
