"""What a job cost and how well it used what it held: GPU-hours, CPU-hours, energy, the share of its
time limit it used, and its model FLOPs utilization (MFU).

Hours are allocated resources × elapsed time, summed over every attempt of the job (a requeue, a chain
segment, a job jobgen submitted again: each was paid for). They come from Slurm's accounting (`sacct
-D`: AllocTRES, ElapsedRaw, TimelimitRaw, ConsumedEnergyRaw) when the cluster keeps it, else from the
request (spec.json's `slurm` section) × the elapsed time Slurm reported, for a job that ran once. A
number that cannot be known is None (shown blank), never a guess: no energy plugin, a job that ran
several times without accounting, a job on the local backend (it holds no allocation).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from jobgen import backends
from jobgen.backends._base import Attempt
from jobgen.facts import aware_time, time_seconds
from jobgen.record.model import Run, RunJob
from jobgen.results.state_rule import SETTLED
from jobgen.states import State
from training.contract import COMPUTE_DTYPES

Accounting = Mapping[str, list[Attempt]]  # job id -> its attempts, as the scheduler's accounting says

NEVER_SUBMITTED = frozenset({State.DRY_RUN, State.NOT_SUBMITTED, State.WAITING})


@dataclass(frozen=True, slots=True)
class Usage:
    """What one job held and used, all its attempts together; None where it cannot be known."""

    gpu_hours: float | None
    cpu_hours: float | None
    energy_kwh: float | None
    time_used: float | None  # elapsed ÷ time limit, both summed over the attempts that started
    source: str  # "sacct" or "request"
    ran: bool = True  # False: the accounting says no attempt started (every number is then None)


Question = dict[str, list[str]]  # backend -> the job ids its accounting is asked about


def question(runs: Iterable[Run], skip: Callable[[RunJob], bool] | None = None) -> Question:
    """What the accounting is asked: every id of every submitted job of these runs (but those `skip`
    says are known), by backend."""
    asking: Question = {}
    for run in runs:
        for job in run.jobs:
            if job.state not in NEVER_SUBMITTED and not (skip and skip(job)):
                asking.setdefault(run.backend, []).extend(job_ids(job))
    return asking


def answer(asking: Question) -> dict[str, list[Attempt]]:
    """The accounting's answer to a question: every attempt of each job id it knows."""
    out: dict[str, list[Attempt]] = {}
    for backend, ids in asking.items():
        if ids:
            out |= backends.get(backend).usage(ids)
    return out


def _values(a: Attempt) -> list[Any]:
    """An attempt's fields in order, as dataclasses.astuple gives them (without its deep copy)."""
    return [a.started, a.elapsed_s, a.limit_s, a.cpus, a.gpus, a.energy_j, a.final]


# --- the accounting's final word, kept in the manifest -------------------------------------------------
#
# Once a job has ended for good and the accounting calls the last attempt of each of its ids final, its
# attempts no longer change: summary and report keep them in the job's manifest entry (USAGE, written
# through jobgen.record.store like every manifest change) and ask sacct nothing for it again. What they were
# kept for is their key: the job's ids, how often `jobgen requeue` ran it again, the restarts its result
# counts and the end Slurm last gave. A later attempt changes one of them (a requeue counts, a new end is
# recorded), so the kept attempts are no longer taken and sacct is asked again; `--refresh` asks anyway.

USAGE = "usage"  # the manifest entry's field
_ATTEMPT_KINDS = (bool, int, int, int, int, int, bool)  # Attempt's fields; None allowed for limit..energy


def _is_attempt(value: Any) -> bool:
    """Whether a kept value has an Attempt's fields, in order, of their types."""
    return (
        type(value) is list
        and len(value) == len(_ATTEMPT_KINDS)
        and all(
            type(v) is kind or (v is None and 2 <= n <= 5)
            for n, (v, kind) in enumerate(zip(value, _ATTEMPT_KINDS, strict=True))
        )
    )


def usage_key(job: RunJob, restarts: int, ids: list[str] | None = None) -> list[Any]:
    """What kept attempts must still match to be the job's: a later attempt changes it. `ids`: job_ids(job)."""
    return [
        job_ids(job) if ids is None else ids,
        int(job.entry.get("requeues") or 0),
        restarts,
        job.entry.get("ended_at"),
    ]


def kept_attempts(job: RunJob, restarts: int) -> dict[str, list[Attempt]] | None:
    """The attempts kept in the job's manifest entry (id -> attempts), when they are still its own: the job
    has ended for good and nothing ran it again since. None: ask the accounting."""
    kept = job.entry.get(USAGE)
    if job.state not in SETTLED or type(kept) is not dict:
        return None
    ids = job_ids(job)
    if kept.get("key") != usage_key(job, restarts, ids):
        return None
    attempts = kept.get("attempts")
    if type(attempts) is not dict:
        return None
    out: dict[str, list[Attempt]] = {}
    for jid in ids:
        values = attempts.get(jid)
        if type(values) is not list or not values:
            return None
        for value in values:
            if not _is_attempt(value):
                return None  # damaged: ask again (a bad cache costs time, never a wrong number)
        out[jid] = [Attempt(*value) for value in values]
    return out


def attempts_to_keep(job: RunJob, accounting: Accounting, restarts: int) -> dict[str, Any] | None:
    """The job's USAGE entry to keep from the accounting's answer; None while it may still change: the job
    has not ended for good, or the accounting (which lags the controller) does not call the last attempt of
    each of its ids final yet."""
    ids = job_ids(job)
    if job.state not in SETTLED or not ids or not all(accounting.get(i) and accounting[i][-1].final for i in ids):
        return None
    attempts = {i: [_values(a) for a in accounting[i]] for i in ids}
    return {"key": usage_key(job, restarts, ids), "attempts": attempts}


def job_ids(job: RunJob) -> list[str]:
    """Every Slurm id the job ran under: the ones jobgen submitted it as before, then its segments or id."""
    return [*job.previous_job_ids, *job.ids]


def usage_of(job: RunJob, accounting: Accounting | None, requeues: int = 0) -> Usage | None:
    """The job's usage from the accounting when it knows every id of the job, else from its request
    (`requeues`: how often its result says it ran again; the manifest counts `jobgen requeue`s). None when
    nothing is known; `ran` False when the accounting says it never started."""
    ids = job_ids(job)
    if not ids or job.state in NEVER_SUBMITTED:
        return None
    if accounting and all(i in accounting for i in ids):
        attempts = [a for i in ids for a in accounting[i]]
        # Slurm allocates exactly the GPUs --gpus-per-node asks for: the request says what the
        # accounting leaves out where it does not track them.
        asked = _asked(job)[0] if any(a.gpus is None for a in attempts) else None
        return from_attempts(attempts, asked)
    return from_request(job) if requeues == 0 and not job.entry.get("requeues") else None


def from_attempts(attempts: list[Attempt], asked_gpus: int | None = None) -> Usage:
    """Sums over the attempts that started (none did: a Usage that says so). `asked_gpus`: the GPUs of
    an attempt whose accounting does not list them (None: unknown)."""
    ran = [a for a in attempts if a.started]
    if not ran:
        return Usage(None, None, None, None, "sacct", ran=False)
    # Each attempt's GPUs, the request's where the accounting lists none (beside it: no copy of each attempt).
    gpus = [a.gpus if a.gpus is not None else asked_gpus for a in ran]
    limits = [a.limit_s for a in ran]
    energy = [a.energy_j for a in ran]
    return Usage(
        gpu_hours=_hours(ran, gpus),
        cpu_hours=_hours(ran, [a.cpus for a in ran]),
        # Every attempt's or none: a sum that leaves one out would be too small, and look right.
        energy_kwh=None if None in energy else math.fsum(e or 0 for e in energy) / 3.6e6,
        time_used=_fraction(sum(a.elapsed_s for a in ran), None if None in limits else sum(x or 0 for x in limits)),
        source="sacct",
    )


def _hours(attempts: list[Attempt], counts: list[int | None]) -> float | None:
    """Resource-hours: each attempt's count (GPUs, CPUs) × its elapsed time; None when a count is unknown."""
    if None in counts:
        return None
    return math.fsum((n or 0) * a.elapsed_s for n, a in zip(counts, attempts, strict=True)) / 3600


def _fraction(used: float, limit: float | None) -> float | None:
    return used / limit if limit else None


# sbatch options in slurm.extra that change what a job is allocated beyond its [slurm] request: with
# one of them the request does not say what the job held.
CHANGES_ALLOCATION = frozenset(
    {"exclusive", "gres", "gpus", "gpus-per-task", "gpus-per-socket", "ntasks", "cpus-per-gpu", "mincpus"}
    | {"ntasks-per-gpu", "ntasks-per-core", "ntasks-per-socket", "threads-per-core", "overcommit", "oversubscribe"}
)


def from_request(job: RunJob) -> Usage | None:
    """What the job asked for (spec.json's `slurm`) × the elapsed time Slurm reported for it (this
    command's answer, or the start and end jobgen recorded). Only for a job that ran once: the
    elapsed time of earlier attempts is recorded nowhere but in the accounting."""
    elapsed = elapsed_seconds(job) if len(job_ids(job)) == 1 else None
    if elapsed is None:
        return None
    held_gpus, held_cpus, limit = _asked(job)
    return Usage(
        gpu_hours=None if held_gpus is None else held_gpus * elapsed / 3600,
        cpu_hours=None if held_cpus is None else held_cpus * elapsed / 3600,
        energy_kwh=None,
        time_used=_fraction(elapsed, limit),
        source="request",
    )


def _asked(job: RunJob) -> tuple[int | None, int | None, int | None]:
    """(GPUs, CPUs, time limit in seconds) the job asked for in spec.json's `slurm`; None for what the
    request does not say (an option in slurm.extra that changes the allocation, whole nodes). Kept in the
    run's index (RunJob.indexed): a summary of a cluster whose accounting lists no GPUs asks it of
    every job."""
    found = job.indexed("spec.json", ASKED_KEY, _read_asked, _is_asked)
    return found[0], found[1], found[2]


def keep_asked(job: RunJob) -> None:
    """Keep what the job's spec.json asked for (see _asked), as a command that parsed it anyway does."""
    job.indexed("spec.json", ASKED_KEY, _read_asked, _is_asked)


ASKED_KEY = "asked"  # the key of _asked's answer in the run's index, of a spec.json


def _is_asked(kept: Any) -> bool:
    return type(kept) is list and len(kept) == 3 and all(v is None or type(v) is int for v in kept)


def _read_asked(job: RunJob) -> list[int | None]:
    slurm = job.spec().get("slurm")
    if not isinstance(slurm, dict):
        return [None, None, None]
    nodes, gpus, tasks, cpus = (
        _whole(slurm.get(k)) for k in ("nodes", "gpus_per_node", "ntasks_per_node", "cpus_per_task")
    )
    extra = slurm.get("extra")
    extra = extra if isinstance(extra, dict) else {}
    exact = not slurm.get("exclusive") and not CHANGES_ALLOCATION & {k for k, v in extra.items() if v is not False}
    held_gpus = nodes * gpus if exact and nodes and gpus is not None else None
    held_cpus = nodes * tasks * cpus if exact and nodes and tasks and cpus else None
    return [held_gpus, held_cpus, _seconds(slurm.get("time"))]


def elapsed_seconds(job: RunJob) -> int | None:
    """Seconds the job has held its allocation: Slurm's word in this command (so far, while it runs),
    else the start and end jobgen recorded (an end is recorded only once Slurm says the job ended; an
    elapsed time recorded while it ran would be too short)."""
    live = job.live  # what a scheduler answered (its source named), or states a caller handed in
    source = str(getattr(live, "source", None) or "")
    if live is not None and source and live.state is not State.PENDING:
        said = str(getattr(live, "elapsed", "") or "")
        return _seconds(said) if ":" in said else None  # [D-][HH:]MM:SS
    # Slurm prints naive local times; jobgen writes aware UTC ones: both made aware, to subtract them.
    start, end = aware_time(job.entry.get("started_at")), aware_time(job.entry.get("ended_at"))
    if start is None or end is None or end < start:
        return None
    return round((end - start).total_seconds())


def _seconds(text: Any) -> int | None:
    """A Slurm time (sbatch's forms: MM, MM:SS, HH:MM:SS, D-HH, ...) in seconds; None for UNLIMITED or junk."""
    if not isinstance(text, str) or not re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}", text):
        return None
    return time_seconds(text)


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


# --- model FLOPs utilization ------------------------------------------------------------------------------

TFLOPS = 1e12
# Dense peak FLOP/s (no sparsity) per GPU by the dtype a precision computes in (training.contract's
# COMPUTE_DTYPES), from NVIDIA's data sheets and whitepapers: "bf16" and "fp16" on the tensor cores with
# FP32 accumulation (what autocast uses), "fp32" without TF32 (torch's default for matmuls; training/ does
# not turn TF32 on). Patterns are tried in order against torch.cuda.get_device_name(); a GPU whose name
# matches none, a MIG slice (its share of the parent is not its share of the peak), or a dtype a GPU has
# no peak for gives no MFU.
PEAKS: tuple[tuple[str, dict[str, float] | None], ...] = (
    (r"\bMIG\b", None),
    (r"\bGH200\b", {"bf16": 989.4, "fp16": 989.4, "fp32": 67.0}),
    (r"\bH100\b.*\bNVL\b", {"bf16": 835.5, "fp16": 835.5, "fp32": 60.0}),
    (r"\bH100\b.*(HBM3|SXM)", {"bf16": 989.4, "fp16": 989.4, "fp32": 67.0}),
    (r"\bH100\b.*PCIe", {"bf16": 756.5, "fp16": 756.5, "fp32": 51.0}),
    (r"\bH200\b.*\bNVL\b", {"bf16": 835.5, "fp16": 835.5, "fp32": 60.0}),
    (r"\bH200\b", {"bf16": 989.4, "fp16": 989.4, "fp32": 67.0}),
    (r"\bA100\b", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    (r"\bV100S\b", {"fp16": 130.0, "fp32": 16.4}),
    (r"\bV100-SXM2", {"fp16": 125.0, "fp32": 15.7}),
    (r"\bV100-PCIE", {"fp16": 112.0, "fp32": 14.0}),
    (r"\bRTX 4090\b", {"bf16": 165.2, "fp16": 165.2, "fp32": 82.6}),  # GeForce: FP32 accumulation at half rate
    (r"\bL40S\b", {"bf16": 362.05, "fp16": 362.05, "fp32": 91.6}),
    (r"\bL40\b", {"bf16": 181.05, "fp16": 181.05, "fp32": 90.5}),
    (r"\bL4\b", {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3}),
    (r"\bA10G\b", {"bf16": 70.0, "fp16": 70.0, "fp32": 35.0}),  # AWS's A10 variant: 80 SMs, half-rate tensor cores
    (r"\bA10\b", {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2}),
    (r"\bT4\b", {"fp16": 65.0, "fp32": 8.1}),
)


def peak_flops(gpu: str, precision: str | None) -> float | None:
    """The GPU's dense peak FLOP/s at the precision the job ran in (training.contract's PRECISIONS, which
    say the dtype it computes in); None if unknown."""
    kind = COMPUTE_DTYPES.get(precision or "")
    for pattern, peaks in PEAKS:
        if re.search(pattern, gpu, re.IGNORECASE):
            return peaks[kind] * TFLOPS if peaks is not None and kind in peaks else None
    return None


def mfu(
    gpus: Iterable[str], precision: str | None, parameters: int | None, tokens_per_s: float | None, devices: int | None
) -> float | None:
    """Model FLOPs per second over the peak of the devices: 6 × parameters × tokens/s (the training
    approximation of Kaplan et al. 2020, "Scaling Laws for Neural Language Models": forward 2N, backward
    4N per token) ÷ (devices × one GPU's peak). None on CPU, for an unknown GPU, or mixed GPUs."""
    names = set(gpus)
    if len(names) != 1 or not parameters or not tokens_per_s or not devices:
        return None
    peak = peak_flops(names.pop(), precision)
    return None if peak is None else 6 * parameters * tokens_per_s / (devices * peak)
