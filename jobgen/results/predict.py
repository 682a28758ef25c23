"""From a probe's measurements (a job's probe.json, training/probe.py) to the full job's wall time and
peak memory, and from those to the limits `slurm.time = "auto"` and `slurm.mem = "auto"` ask for.

Pure arithmetic: the model is written down in docs/contracts.md ("Probes"); tests/core/test_probe.py
pins it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Prediction:
    """One sweep point: what its probe measured and what the full job will take."""

    name: str
    samples_per_s: float | None  # training samples/s in the timed window, after warm-up (all ranks)
    data_prep_s: float
    eval_s_per_sample: float | None
    checkpoint_s: float  # one epoch end: the best weights and the resume checkpoint saved
    peak_rss_mb: float | None  # one rank's host RSS
    peak_gpu_mb: float | None
    startup_s: float  # start to end of the job, less what the probe measured: launch, imports, set-up, exit
    train_s: float
    eval_s: float
    checkpoints_s: float
    epochs: int
    predicted_wall_s: float
    predicted_peak_mem_mb: float | None  # per node: its ranks' host RSS
    probe_elapsed_s: float
    elapsed_from: str  # "scheduler" (Slurm's Elapsed, or the local backend's start and end) or "process"

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def predict(name: str, m: dict[str, Any], elapsed_s: float | None, ranks_per_node: int) -> Prediction:
    """The full job from its probe. `elapsed_s`: the probe job's own wall time as its scheduler counts it
    (None: the probe process' own clock, which misses the launch before Python started)."""
    full = m["full"]
    bpe = int(full["batches_per_epoch"])
    epochs = int(full["epochs"])
    batches = epochs * bpe
    if full.get("max_steps"):
        batches = min(batches, int(full["max_steps"]) * int(full.get("grad_accum") or 1))
    epochs_run = max(1, math.ceil(batches / bpe)) if bpe else epochs
    warm = int(m["warmup_batches"])
    step = m["batch_wall_s"] or 0.0
    train = float(m["warmup_wall_s"]) + max(batches - warm, 0) * step
    samples = full["samples"]
    rows = int(m.get("eval_rows") or full["eval_rows"])
    per_sample = float(m["eval_s"]) / rows if rows else None
    evaluated = epochs_run * int(samples.get("validation", 0)) + int(samples.get("test", 0))
    eval_s = (per_sample or 0.0) * evaluated
    checkpoints = epochs_run * float(m["epoch_end_s"])
    source = "scheduler" if elapsed_s is not None else "process"
    elapsed = float(elapsed_s if elapsed_s is not None else m["process_s"])
    measured = float(m["data_prep_s"]) + float(m["engine_s"])
    startup = max(elapsed - measured, 0.0)
    wall = startup + float(m["data_prep_s"]) + train + eval_s + checkpoints
    peak = m.get("peak_memory_mb") or {}
    rss = peak.get("host_rss")
    return Prediction(
        name=name,
        samples_per_s=m.get("samples_per_s"),
        data_prep_s=float(m["data_prep_s"]),
        eval_s_per_sample=per_sample,
        checkpoint_s=float(m["epoch_end_s"]),
        peak_rss_mb=rss,
        # What the job held of its device (older probes recorded only what tensors used).
        peak_gpu_mb=peak.get("gpu_max_reserved", peak.get("gpu_max_allocated")),
        startup_s=startup,
        train_s=train,
        eval_s=eval_s,
        checkpoints_s=checkpoints,
        epochs=epochs_run,
        predicted_wall_s=wall,
        predicted_peak_mem_mb=None if rss is None else float(rss) * max(ranks_per_node, 1),
        probe_elapsed_s=elapsed,
        elapsed_from=source,
    )


def time_limit_minutes(predicted_s: float, margin: float, max_s: int | None) -> int:
    """Whole minutes (Slurm keeps time limits in minutes): predicted × margin, rounded up, at least 1,
    never above the partition's MaxTime (`max_s`, None = unlimited). Raises ValueError when the job
    itself (without the margin) would not fit."""
    if max_s is not None and predicted_s > max_s:
        raise ValueError(f"predicted {duration(predicted_s)} is longer than the partition's MaxTime {duration(max_s)}")
    minutes = max(1, math.ceil(predicted_s * margin / 60 - 1e-9))
    if max_s is not None:
        minutes = min(minutes, max(max_s // 60, 1))
    return minutes


def mem_limit_mb(predicted_mb: float, margin: float) -> int:
    return max(1, math.ceil(predicted_mb * margin))


def slurm_time(minutes: int) -> str:
    """Minutes as sbatch's D-HH:MM:SS (HH:MM:SS under a day)."""
    days, rest = divmod(minutes, 24 * 60)
    text = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{text}" if days else text


def duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
