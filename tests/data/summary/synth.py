"""Write synthetic run directories in the shape of docs/contracts.md, for the summary's tests and bench.

Only the files a run leaves behind (manifest.json, result.json, spec.json, logs) are written; the values
are parameters, so tests compare the summary against what they wrote, not against constants.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from jobgen.states import State

LOGS = Path(__file__).parent / "logs"
T0 = datetime(2026, 11, 29, 20, 0, 0, tzinfo=timezone.utc)


@dataclass
class FakeJob:
    """One job of a synthetic run: what the manifest says and what the job left behind."""

    name: str
    sweep: dict[str, Any] = field(default_factory=dict)
    state: str = "SUBMITTED"
    engine: str = "lightning"
    strategy: str = "ddp"
    precision: str = "bf16-mixed"
    compile: bool = False
    nodes: int = 1
    devices: int = 2
    submitted_s: float | None = 0.0  # seconds after T0; None = never submitted
    queue_s: float = 30.0
    train_s: float = 100.0
    total_s: float = 120.0
    samples_per_s: float = 250.0
    peak_gpu_mb: float | None = 4000.0
    peak_host_mb: float = 2000.0
    best_val_acc: float = 0.88
    test_acc: float = 0.87
    test_f1: float | None = 0.86
    requeue_count: int = 0
    result: str | dict[str, Any] | None = "ok"  # "ok": a valid result; str: raw text; dict: as is; None: none
    logs: dict[str, str] = field(default_factory=dict)  # file name -> text
    error: str | None = None
    slurm: dict[str, Any] | None = None  # spec.json's [slurm] section (the request), when given
    ran_s: float | None = None  # Slurm's start and end of the job, as `jobgen status` recorded them
    elapsed: str | None = None  # Slurm's elapsed time, as `jobgen status` recorded it
    job_ids: list[str] | None = None  # [earlier ids..., id]: a job jobgen submitted again
    requeues: int = 0  # times `jobgen requeue` queued it again (the manifest's count)
    segments: list[str] | None = None  # a chained job's segment ids (slurm.chain)
    gpus: list[str] = field(default_factory=list)  # ran_on.gpus
    parameters: int | None = None
    trainable: int | None = None  # parameters.trainable (LoRA: fewer than parameters)
    primary: str = "accuracy"  # result.json primary_metric
    mcc: float = 0.5  # test_metrics' mcc; val_metrics' is 0.01 higher
    predictions: bool = False  # train.save_predictions: a predictions.csv in the job folder

    def finished_at(self) -> datetime:
        return T0 + timedelta(seconds=(self.submitted_s or 0.0) + self.queue_s + self.total_s)


def result_json(job: FakeJob, experiment: str) -> dict[str, Any]:
    """A complete schema-1 result.json for the job."""
    return {
        "schema": 1,
        "job": job.name,
        "experiment": experiment,
        "engine": job.engine,
        "strategy": job.strategy,
        "precision": {"requested": job.precision, "effective": job.precision},
        "compile": job.compile,
        "accelerator": "gpu" if job.peak_gpu_mb is not None else "cpu",
        "nodes": job.nodes,
        "devices_per_node": job.devices,
        "world_size": job.nodes * job.devices,
        "model": "builtin:tiny",
        "dataset": "builtin:synthetic",
        "samples": {"train": 1000, "validation": 100, "test": 200},
        "times_s": {
            "data_prep": 1.0,
            "warmup_compile": 0.0,
            "train": job.train_s,
            "eval": job.total_s - job.train_s - 1.0,
            "total": job.total_s,
        },
        "throughput": {"samples_per_s": job.samples_per_s, "tokens_per_s": job.samples_per_s * 100},
        "padded_token_fraction": 0.03,
        "peak_memory_mb": {"host_rss": job.peak_host_mb, "gpu_max_allocated": job.peak_gpu_mb},
        "val_acc_per_epoch": [job.best_val_acc - 0.02, job.best_val_acc],
        "best_val_acc": job.best_val_acc,
        "test_acc": job.test_acc,
        "test_f1": job.test_f1,
        "epochs_done": 2,
        "resumed": job.requeue_count > 0,
        "requeue_count": job.requeue_count,
        "versions": {"torch": "2.5.0", "lightning": "2.4.0", "transformers": "4.46.0", "jobgen": "0.1.0"},
        "git_sha": None,
        "slurm": {"job_id": "1", "array_task_id": None, "nodelist": "gpu001"},
        "finished_at": job.finished_at().isoformat(),
        "parameters": None
        if job.parameters is None
        else {"total": job.parameters, "trainable": job.trainable, "per_rank": []},
        "ran_on": {"gpus": job.gpus},
        "primary_metric": job.primary,
        "test_metrics": {"accuracy": job.test_acc, "macro_f1": job.test_acc - 0.01, "f1": job.test_f1, "mcc": job.mcc},
        "val_metrics": {"accuracy": job.best_val_acc, "macro_f1": None, "mcc": job.mcc + 0.01},
        "predictions": "predictions.csv" if job.predictions else None,
    }


def write_run(root: Path, experiment: str, jobs: Iterable[FakeJob], run_id: str = "20261129-200000-ab12") -> Path:
    """Write <root>/<experiment>/<run_id>/ with its manifest and every job's files; return the run dir.
    The run's backend is local when its jobs' logs are the local backend's (local.out), else sbatch."""
    jobs = list(jobs)
    local = any("local.out" in (job.logs or {}) for job in jobs)
    run_dir = root / experiment / run_id
    run_dir.mkdir(parents=True)
    entries = []
    for index, job in enumerate(jobs):
        job_dir = run_dir / "jobs" / job.name
        job_dir.mkdir(parents=True)
        _write_job(job_dir, job, experiment)
        entries.append(_entry(job, index))
    manifest = {
        "schema": 1,
        "run_id": run_id,
        "experiment": experiment,
        "experiment_file": f"/abs/experiments/{experiment}.toml",
        "backend": "local" if local else "sbatch",
        "dry_run": False,
        "created": T0.isoformat(),
        "jobgen_version": "0.1.0",
        "git": {"sha": None, "dirty": False},
        "jobs": entries,
    }
    (run_dir / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return run_dir


def _entry(job: FakeJob, index: int) -> dict[str, Any]:
    submitted = None if job.submitted_s is None else (T0 + timedelta(seconds=job.submitted_s)).isoformat()
    return {
        "name": job.name,
        "index": index,
        "sweep": job.sweep,
        "dir": f"jobs/{job.name}",
        "spec": f"jobs/{job.name}/spec.json",
        "script": f"jobs/{job.name}/job.sbatch",
        "submit_command": ["sbatch", "--parsable", "job.sbatch"],
        "job_id": None if job.submitted_s is None else str(4000 + index),
        "array_index": None,
        "submitted_at": submitted,
        "state": job.state,
        "error": job.error,
        **({"elapsed": job.elapsed} if job.elapsed else {}),
        **({"requeues": job.requeues} if job.requeues else {}),
        **({"job_id": job.segments[0], "segments": job.segments} if job.segments else {}),
        **(_slurm_times(job) if job.ran_s is not None else {}),
        **({"job_id": job.job_ids[-1], "previous_job_ids": job.job_ids[:-1]} if job.job_ids else {}),
    }


def _slurm_times(job: FakeJob) -> dict[str, str]:
    start = T0 + timedelta(seconds=(job.submitted_s or 0.0) + job.queue_s)
    # As Slurm prints them: local time without a zone.
    return {
        "started_at": start.astimezone().replace(tzinfo=None).isoformat(timespec="seconds"),
        "ended_at": (start + timedelta(seconds=job.ran_s or 0.0))
        .astimezone()
        .replace(tzinfo=None)
        .isoformat(timespec="seconds"),
    }


def _write_job(job_dir: Path, job: FakeJob, experiment: str) -> None:
    spec = {
        "schema": 1,
        "experiment": experiment,
        "job": job.name,
        "sweep": job.sweep,
        "train": {
            "engine": job.engine,
            "strategy": job.strategy,
            "precision": job.precision,
            "compile": job.compile,
            "num_nodes": job.nodes,
            "devices": job.devices,
        },
        **({"slurm": job.slurm} if job.slurm is not None else {}),
    }
    (job_dir / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    if job.result == "ok":
        text = json.dumps(result_json(job, experiment))
    elif isinstance(job.result, dict):
        text = json.dumps(job.result)
    else:
        text = job.result
    if text is not None:
        (job_dir / "result.json").write_text(text, encoding="utf-8")
    if job.predictions:
        (job_dir / "predictions.csv").write_text("row,label,prediction,score\n0,1,1,0.9\n", encoding="utf-8")
    for name, log in job.logs.items():
        (job_dir / name).write_text(log, encoding="utf-8")


def log(name: str) -> str:
    """A realistic log tail from tests/data/summary/logs/."""
    return (LOGS / name).read_text(encoding="utf-8")


# --- the fault table: every way a job can end without a usable result ----------------------------------

TRUNCATED = '{"schema": 1, "job": "x", "times_s": {"train": 12'
OLD = {"schema": 0, "job": "x", "train_time": 12.0, "acc": 0.9, "versions": {"jobgen": "0.0.3"}}

# (id, job, expected state, text the row's problem must contain, expected cause kind or None)
FAULTS = [
    (
        "missing-result",
        FakeJob("j", state="COMPLETED", result=None),
        State.FAILED,  # exit 0 without its result is never COMPLETED: its work is lost
        "without writing",
        None,
    ),
    ("truncated-json", FakeJob("j", result=TRUNCATED), State.COMPLETED, "corrupt or truncated", None),
    ("older-format", FakeJob("j", result=OLD), State.COMPLETED, "result from an older format", None),
    ("newer-format", FakeJob("j", result={**OLD, "schema": 9}), State.COMPLETED, "newer format", None),
    ("not-a-dict", FakeJob("j", result="[1, 2]"), State.COMPLETED, "not a JSON object", None),
    ("pending", FakeJob("j", state="PENDING", result=None), State.PENDING, "not started", None),
    (
        "not-submitted",
        FakeJob("j", state="NOT_SUBMITTED", submitted_s=None, result=None, error="sbatch: invalid account"),
        State.NOT_SUBMITTED,
        "not submitted: sbatch: invalid account",
        None,
    ),
    (
        "cancelled",
        FakeJob("j", result=None, logs={"slurm-4000.out": log("cancelled.out")}),
        State.CANCELLED,
        "CANCELLED AT",
        "cancelled",
    ),
    (
        "timeout",
        FakeJob("j", result=None, logs={"slurm-4000.out": log("time_limit.out")}),
        State.TIMEOUT,
        "DUE TO TIME LIMIT",
        "time_limit",
    ),
    (
        "exception",
        FakeJob("j", result=None, logs={"slurm-4000.out": log("exception.out")}),
        State.FAILED,
        "KeyError: 'sentence'",
        "exception",
    ),
    (
        "cuda-oom",
        FakeJob("j", result=None, logs={"slurm-4000.out": log("oom.out")}),
        State.FAILED,
        "CUDA out of memory",
        "gpu_oom",
    ),
    (
        "oom-kill",
        FakeJob("j", result=None, logs={"slurm-4000.out": log("oom_kill.out")}),
        State.OUT_OF_MEMORY,
        "Out Of Memory",
        "host_oom",
    ),
    (
        "address-in-use",
        FakeJob("j", result=None, logs={"slurm-4000.out": "", "slurm-4000.err": log("address_in_use.err")}),
        State.FAILED,
        "Address already in use",
        "address_in_use",
    ),
    (
        "nccl-timeout",
        FakeJob("j", result=None, logs={"slurm-4000.out": log("nccl_timeout.out")}),
        State.FAILED,
        "collective operation timeout",
        "nccl_timeout",
    ),
    (
        "node-failure",
        FakeJob("j", result=None, logs={"slurm-4000.out": log("node_fail.out")}),
        State.NODE_FAIL,
        "NODE FAILURE",
        "node_fail",
    ),
    (
        "local-backend-exception",
        FakeJob("j", result=None, logs={"local.out": log("exception.out")}),
        State.FAILED,
        "KeyError",
        "exception",
    ),
]
