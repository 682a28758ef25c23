"""What a run reports: timers, counters, metrics.csv rows and result.json (all written atomically)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import resource
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from training import console, trackers
from training.progress import PROGRESS_FILE
from training.spec import Spec

RESULT_SCHEMA = 1
CSV_FIELDS = ("epoch", "step", "split", "loss", "acc", "f1", "lr", "samples_per_s", "time_s")
PROGRESS_EVERY_S = 5.0


@dataclass
class Stats:
    """Counters one run accumulates; engines fill them, result() turns them into result.json."""

    precision_effective: str = ""
    accelerator: str = "cpu"
    world_size: int = 1
    samples: dict[str, int] = field(default_factory=dict)
    times_s: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("data_prep", "warmup_compile", "train", "eval", "total"), 0.0)
    )
    timed_samples: int = 0  # training samples counted after warm-up (all ranks)
    timed_tokens: int = 0  # real (non-pad) tokens in those samples (all ranks)
    real_tokens: int = 0  # for padded_token_fraction, over every training batch seen
    padded_slots: int = 0
    trained_samples: int = 0  # rows trained (all ranks), top-up repeats included
    repeated_samples: int = 0  # of those, top-up repeats that keep ranks in step
    scored: dict[str, int] = field(default_factory=dict)  # rows each split was scored on (all ranks)
    val_acc_per_epoch: list[float] = field(default_factory=list)  # classification only
    val_metrics_per_epoch: list[dict[str, Any]] = field(default_factory=list)  # one per validated epoch
    primary_metric: str = "accuracy"  # picks the best epoch (training.contract.primary_metric)
    test_acc: float | None = None
    test_f1: float | None = None
    test_metrics_by_split: dict[str, dict[str, Any]] = field(default_factory=dict)  # "test" first
    predictions: str | None = None  # predictions.csv, when written
    tested_epoch: int | None = None  # the (best validation) epoch whose weights the test scored
    parameters: dict[str, Any] = field(default_factory=dict)  # {"total": n, "per_rank": [held by rank r]}
    epochs_done: int = 0
    optimizer_steps: int = 0
    resumed: bool = False
    interrupted: bool = False
    paused_at: int = 0  # the halving rung (epochs) this attempt stopped at; 0 = not paused
    attempt_started: float = field(default_factory=time.perf_counter)
    gpu_peaks_mb: list[float] = field(default_factory=list)  # [allocated, reserved], max over ranks (GPU only)

    def state(self) -> dict[str, Any]:
        """The parts a checkpoint must carry so a resumed run reports the whole run (every attempt)."""
        keep = (
            "timed_samples",
            "timed_tokens",
            "real_tokens",
            "padded_slots",
            "trained_samples",
            "repeated_samples",
            "scored",
            "val_acc_per_epoch",
            "val_metrics_per_epoch",
        )
        times = dict(self.times_s, total=self.times_s["total"] + time.perf_counter() - self.attempt_started)
        return {"times_s": times, **{k: getattr(self, k) for k in keep}}

    def restore(self, state: dict[str, Any]) -> None:
        """Take over the earlier attempts' counters; times add to this attempt's (its data_prep so far)."""
        for key, value in state.items():
            if key == "times_s":
                self.times_s = {k: self.times_s.get(k, 0.0) + value.get(k, 0.0) for k in self.times_s | value}
            else:
                setattr(self, key, value)

    def epochs_validated(self) -> int:
        return len(self.val_metrics_per_epoch)

    def val_primary(self) -> list[float]:
        """Each validated epoch's primary metric, as `max` compares them (see `best_epoch`)."""
        from training.metrics import better

        return [better(self.primary_metric, m.get(self.primary_metric)) for m in self.val_metrics_per_epoch]

    def add_validation(self, scores: dict[str, Any]) -> None:
        """One epoch's validation (Scores.compute()'s dict)."""
        self.val_metrics_per_epoch.append(scores["metrics"])
        if scores["acc"] is not None:
            self.val_acc_per_epoch.append(scores["acc"])
        self.scored["validation"] = scores["scored"]

    def add_test(self, split: str, scores: dict[str, Any], spec: Spec, prepared: Any, rank: int) -> None:
        """One test split's scores (the best weights); the test split's predictions.csv on rank 0."""
        self.test_metrics_by_split[split] = scores["metrics"]
        self.scored[split] = scores["scored"]
        if split != "test":
            return
        self.test_acc, self.test_f1 = scores["acc"], scores["f1"]
        if spec.train.save_predictions and rank == 0:
            path = write_predictions(spec.job_dir / PREDICTIONS_FILE, scores["predictions"], prepared.splits["test"])
            self.predictions = path.name

    def finish(self) -> None:
        self.times_s["total"] += time.perf_counter() - self.attempt_started
        self.attempt_started = time.perf_counter()


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


class MetricsLog:
    """Per-step/epoch rows for metrics.csv; a resumed run appends to what the first attempt wrote."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self.path, self.enabled, self.rows = path, enabled, []
        self._progress_at = float("-inf")
        if enabled and path.exists():
            self.rows = list(csv.DictReader(io.StringIO(path.read_text())))
        # time_s: wall seconds since training started, continued from the last row after a resume.
        self._started = time.monotonic() - float(next((r["time_s"] for r in reversed(self.rows) if r.get("time_s")), 0))
        self.trackers = trackers.active() if enabled else None  # TensorBoard, W&B, MLflow (train.loggers)

    def progress(self, *, epoch: int, epochs: int, batch: int, batches: int, step: int, force: bool = False) -> None:
        """progress.json beside metrics.csv: where a running job is, for `jobgen status` (rank 0, at
        most every few seconds; `epoch` counts from 0, `batch` is batches done in it)."""
        now = time.monotonic()
        if not self.enabled or (not force and now - self._progress_at < PROGRESS_EVERY_S):
            return
        self._progress_at = now
        doc = {
            "epoch": epoch,
            "epochs": epochs,
            "batch": batch,
            "batches": batches,
            "step": step,
            "updated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        atomic_write(self.path.with_name(PROGRESS_FILE), json.dumps(doc) + "\n")

    def add(self, **row: Any) -> None:
        if self.enabled:
            row.setdefault("time_s", time.monotonic() - self._started)
            self.rows.append({k: _fmt(row.get(k)) for k in CSV_FIELDS})
            if self.trackers is not None:
                self.trackers.log(row)

    def flush(self) -> None:
        if self.enabled:
            out = io.StringIO()
            writer = csv.DictWriter(out, fieldnames=CSV_FIELDS)
            writer.writeheader()
            writer.writerows(self.rows)
            atomic_write(self.path, out.getvalue())


def _fmt(value: Any) -> Any:
    return f"{value:.6g}" if isinstance(value, float) else ("" if value is None else value)


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in ("torch", "lightning", "transformers", "datasets", "torchmetrics", "deepspeed", "peft", "jobgen"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")  # present wherever the NVIDIA kernel driver is loaded


def installed_packages(path: list[str] | None = None) -> list[str]:
    """Every distribution on sys.path (or `path`) as `name==version`, once each, sorted as pip sorts.

    Where one distribution is there twice (a copy vendored by setuptools, a user site beside the venv)
    the first on the path is kept: it is the one `import` finds and importlib.metadata.version() names."""
    first: dict[str, str] = {}
    for dist in metadata.distributions() if path is None else metadata.distributions(path=path):
        name = dist.metadata["Name"]
        if name:
            first.setdefault(re.sub(r"[-_.]+", "-", name).lower(), f"{name}=={dist.version}")
    return sorted(first.values(), key=str.lower)


def ran_on(driver_file: Path = NVIDIA_DRIVER) -> dict[str, Any]:
    """What the job ran on, so that two runs can be compared later: the host, Python, every installed
    distribution as `pip freeze` names it (read from the environment's metadata: no pip needed, as in a
    uv venv), and where there is a GPU the CUDA, cuDNN and NCCL versions torch was built with, the
    driver's version and the GPUs' names. CUDA is not initialised on a CPU job."""
    import platform
    import socket

    import torch

    packages = installed_packages()
    out: dict[str, Any] = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": packages,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "nccl": None,
        "driver": _driver_version(driver_file),
        "gpus": [],
    }
    if torch.cuda.is_available():
        out["cudnn"] = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
        try:
            nccl = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
            out["nccl"] = ".".join(str(part) for part in nccl)
        except (AttributeError, RuntimeError):  # a build without NCCL
            pass
        out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return out


def _driver_version(path: Path) -> str | None:
    """'550.54.15' from the driver's first line: 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15 ...'."""
    try:
        first = path.read_text(errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return None
    import re

    found = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)*)(?:\s|$)", first)  # also "Open Kernel Module for x86_64"
    return found.group(1) if found else None


def _slurm() -> dict[str, str | None] | None:
    env = os.environ
    if "SLURM_JOB_ID" not in env:
        return None
    return {
        "job_id": env["SLURM_JOB_ID"],
        "array_task_id": env.get("SLURM_ARRAY_TASK_ID"),
        "nodelist": env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST"),
    }


def gpu_peaks_mb() -> list[float]:
    """This process' peak GPU memory in MiB over the attempt: [allocated by tensors, reserved by torch's
    caching allocator]. Reserved is what the job held of the device (and what must fit: an allocation
    fails when reserved memory cannot grow); allocated is the part tensors used."""
    import torch

    return [torch.cuda.max_memory_allocated() / 2**20, torch.cuda.max_memory_reserved() / 2**20]


def gpu_peaks_over_ranks(local: list[float], device: Any) -> list[float]:
    """The largest of every rank's `local` values (a collective: every rank calls it, at the same point).
    Under FSDP and ZeRO ranks hold different shares (rank 0 keeps what it gathers to save): the job
    needs what its fullest device needs, not rank 0's."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(local)
    tensor = torch.tensor(local, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [float(v) for v in tensor.tolist()]


def peak_memory_mb(stats: Stats) -> dict[str, float | None]:
    """Peak host RSS of this process (rank 0), and on a GPU the peaks over every rank (stats.gpu_peaks_mb,
    filled by training.run; this process' own when it is not)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    gpu: list[float | None] = [None, None]
    if stats.accelerator == "gpu":
        gpu = list(stats.gpu_peaks_mb or gpu_peaks_mb())
    allocated, reserved = (None if v is None else round(v, 1) for v in gpu)
    return {"host_rss": round(rss, 1), "gpu_max_allocated": allocated, "gpu_max_reserved": reserved}


PREDICTIONS_FILE = "predictions.csv"


def write_predictions(path: Path, preds: Any, rows: Any) -> Path:
    """predictions.csv: row (the sample's row in the source data), label, prediction, score; one line
    per sample, sorted by row. Classes are ids (the model config's id2label names them); multi-label
    cells list the classes (and the predicted ones' probabilities) separated by spaces. Floats are
    written in full (repr), so the metrics recompute exactly from the file."""
    from training.data import SOURCE_ROW

    source = rows[SOURCE_ROW]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["row", "label", "prediction", "score"])
    lines = []
    for i, position in enumerate(preds.row.tolist()):
        if preds.problem_type == "multi_label":
            label = " ".join(str(c) for c in preds.label[i].nonzero()[0].tolist())
            picked = preds.prediction[i].nonzero()[0].tolist()
            prediction = " ".join(str(c) for c in picked)
            score = " ".join(repr(float(preds.score[i][c])) for c in picked)
        elif preds.problem_type == "regression":
            label, prediction, score = (repr(float(x[i])) for x in (preds.label, preds.prediction, preds.score))
        else:
            label, prediction = str(int(preds.label[i])), str(int(preds.prediction[i]))
            score = repr(float(preds.score[i]))
        lines.append((int(source[position]), label, prediction, score))
    writer.writerows(sorted(lines))
    atomic_write(path, out.getvalue())
    return path


def _metrics_out(values: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if values is None else dict(values)


def build_result(spec: Spec, stats: Stats, requeue_count: int) -> dict[str, Any]:
    t = spec.train
    tested = stats.tested_epoch
    by_split = {
        k.removeprefix("test_") if k != "test" else spec.data.test_split: v
        for k, v in stats.test_metrics_by_split.items()
    }
    train_s = stats.times_s["train"]
    slots = stats.padded_slots
    return {
        "schema": RESULT_SCHEMA,
        "job": spec.job,
        "experiment": spec.experiment,
        "engine": t.engine,
        "strategy": t.strategy,
        "precision": {"requested": t.precision, "effective": stats.precision_effective or t.precision},
        "compile": t.compile,
        "accelerator": stats.accelerator,
        "nodes": t.num_nodes,
        "devices_per_node": t.devices,
        "world_size": stats.world_size,
        "model": t.model,
        "dataset": spec.data.dataset or ",".join(sorted(spec.data.files.values())),
        "samples": stats.samples,
        "parameters": stats.parameters or None,
        "samples_trained": {
            "total": stats.trained_samples,
            "repeats": stats.repeated_samples,
            "timed": stats.timed_samples,
        },
        "scored": stats.scored,
        "times_s": {k: round(v, 3) for k, v in stats.times_s.items()},
        "throughput": {
            "samples_per_s": round(stats.timed_samples / train_s, 2) if train_s else None,
            "tokens_per_s": round(stats.timed_tokens / train_s, 1) if train_s else None,
        },
        "padded_token_fraction": round(1 - stats.real_tokens / slots, 4) if slots else None,
        "peak_memory_mb": peak_memory_mb(stats),
        "val_acc_per_epoch": [round(a, 5) for a in stats.val_acc_per_epoch],
        "best_val_acc": round(max(stats.val_acc_per_epoch), 5) if stats.val_acc_per_epoch else None,
        "test_acc": stats.test_acc,
        "test_f1": stats.test_f1,
        "primary_metric": stats.primary_metric,
        "test_metrics": _metrics_out(stats.test_metrics_by_split.get("test")),
        "val_metrics": _metrics_out(
            stats.val_metrics_per_epoch[tested] if tested is not None and tested < stats.epochs_validated() else None
        ),
        # Every tested split by its source name (data.test_split, then data.extra_test_splits).
        "test_metrics_by_split": by_split,
        "predictions": stats.predictions,
        "tested_epoch": stats.tested_epoch,
        "epochs_done": stats.epochs_done,
        "optimizer_steps": stats.optimizer_steps,
        "resumed": stats.resumed,
        "requeue_count": requeue_count,
        "versions": _versions(),
        "git_sha": os.environ.get("JOBGEN_GIT_SHA") or None,
        "slurm": _slurm(),
        "ran_on": ran_on(),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def write_result(spec: Spec, result: dict[str, Any]) -> Path:
    path = spec.job_dir / "result.json"
    atomic_write(path, json.dumps(result, indent=2) + "\n")
    return path


def result_stamp(job_dir: Path) -> tuple[int, int] | None:
    """(inode, mtime) of the job's result.json, None while it has none. atomic_write always puts a new
    file in place, so a stamp that changed across a launch says that launch wrote the result."""
    try:
        found = (job_dir / "result.json").stat()
    except OSError:
        return None
    return found.st_ino, found.st_mtime_ns


def finished_anyway(job_dir: Path, before: tuple[int, int] | None, status: int) -> bool:
    """A launch that exited non-zero after writing its result: the training finished, and what died
    did so on the way out (teardown, interpreter exit). Said in the log; the caller reports success.
    The twin of jobgen/templates/_result_guard.j2, for launches training itself makes (training/ranks.py)."""
    now = result_stamp(job_dir)
    if status == 0 or now is None or now == before:
        return False
    console.line(
        f"training: the ranks wrote {job_dir / 'result.json'}, then exited with status {status} on the way "
        "out; the job counts as completed",
        err=True,
    )
    return True


def graphs_compiled() -> int:
    """Graphs torch.compile has built so far in this process: a step that adds one paid compile time."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


class Clock:
    """Adds wall time spent in a `with` block to stats.times_s[name]."""

    def __init__(self, stats: Stats, name: str) -> None:
        self.stats, self.name = stats, name

    def __enter__(self) -> Clock:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stats.times_s[self.name] += time.perf_counter() - self.start
