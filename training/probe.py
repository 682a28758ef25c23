"""A probe: the job itself, on a step budget, measured so that jobgen can predict the full job
(`jobgen probe`, docs/contracts.md "Probes").

The spec's `probe` section ({"steps": 20, "warmup_steps": 5, "eval_samples": 256}) turns a job into its
probe: training stops after warm-up + steps optimizer steps (the engines' own `max_steps`), validation
and test score an evenly spaced slice of `eval_samples` rows each, and the epoch's end runs as usual
(the best weights and the resume checkpoint are saved). Every engine's timing window
(training/timing.py) reports each batch here; rank 0 writes `probe.json` beside result.json with the
measurements and the size of the full job (its splits, batches per epoch, epochs, max_steps).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

from training import console
from training.spec import Spec

PROBE_SCHEMA = 1
STARTED = time.perf_counter()  # imported first thing by training.run: the process is this old, near enough


@dataclasses.dataclass
class Recorder:
    """One rank's record of its training batches: when each window opened and closed, and its rows."""

    warmup: int
    opened: list[float] = dataclasses.field(default_factory=list)
    closed: list[float] = dataclasses.field(default_factory=list)
    seconds: list[float] = dataclasses.field(default_factory=list)
    rows: list[int] = dataclasses.field(default_factory=list)
    engine_done: float | None = None
    full: dict[str, Any] = dataclasses.field(default_factory=dict)

    def batch(self, opened: float, seconds: float, rows: int) -> None:
        self.opened.append(opened)
        self.closed.append(time.perf_counter())
        self.seconds.append(seconds)
        self.rows.append(rows)


RECORDER: Recorder | None = None


def on_batch(opened: float, seconds: float, rows: int) -> None:
    """Called by every engine's timing window at its close (training/timing.py)."""
    if RECORDER is not None:
        RECORDER.batch(opened, seconds, rows)


def budget(spec: Spec) -> Spec:
    """The spec this process runs: for a probe, training stops after warm-up + steps optimizer steps."""
    global RECORDER
    if not spec.probe:
        RECORDER = None  # an earlier probe in this process (tests run several jobs in one) is over
        return spec
    t = spec.train
    warmup = int(spec.probe.get("warmup_steps", 5))
    warmup = max(warmup, t.warmup_compile_steps)  # the clock's warm-up, compiled or not (training/timing.py)
    steps = warmup + int(spec.probe.get("steps", 20))
    RECORDER = Recorder(warmup=warmup * t.grad_accum)  # in batches: the window closes once per batch
    # A launcher that starts the ranks itself hands them this spec again: the full job's max_steps stays known.
    full_max = int(spec.probe.get("full_max_steps", t.max_steps))
    RECORDER.full = {"epochs": t.epochs, "max_steps": full_max, "grad_accum": t.grad_accum}
    limit = min(steps, full_max) if full_max else steps
    return dataclasses.replace(
        spec, probe={**spec.probe, "full_max_steps": full_max}, train=dataclasses.replace(t, max_steps=limit)
    )


def slice_eval(spec: Spec, prepared: Any) -> Any:
    """Record the full job's split sizes, then keep an evenly spaced slice of validation and test."""
    if RECORDER is None or not spec.probe:
        return prepared
    world = spec.train.world_size
    sizes = {split: len(rows) for split, rows in prepared.splits.items()}
    RECORDER.full["samples"] = sizes
    RECORDER.full["data_from_cache"] = bool(prepared.from_cache)
    RECORDER.full["batches_per_epoch"] = math.ceil(math.ceil(sizes["train"] / spec.train.batch_size) / world)
    keep = int(spec.probe.get("eval_samples", 256))
    splits = dict(prepared.splits)
    for split in ("validation", "test"):
        n = sizes[split]
        if n > keep:
            splits[split] = prepared.splits[split].select([i * n // keep for i in range(keep)])
    RECORDER.full["eval_rows"] = sum(len(splits[s]) for s in ("validation", "test"))
    from datasets import DatasetDict

    return dataclasses.replace(prepared, splits=DatasetDict(splits))


def engine_done() -> None:
    if RECORDER is not None:
        RECORDER.engine_done = time.perf_counter()


def measurements(rec: Recorder, stats: Any) -> dict[str, Any]:
    """What probe.json holds (rank 0's clock; counts of all ranks are rank 0's times the world)."""
    n, warm = len(rec.closed), min(rec.warmup, max(len(rec.closed) - 1, 0))
    first = rec.opened[0] if n else 0.0
    steady = range(warm, n)
    window = sum(rec.seconds[i] for i in steady)
    rows = sum(rec.rows[i] for i in steady)
    start = rec.closed[warm - 1] if warm else first
    done = rec.engine_done or time.perf_counter()
    last = rec.closed[-1] if n else done
    eval_s = float(stats.times_s["eval"])
    return {
        "schema": PROBE_SCHEMA,
        "batches": n,
        "warmup_batches": warm,
        "timed_batches": len(steady),
        "samples_per_s": rows * stats.world_size / window if window > 0 else None,
        "warmup_wall_s": start - first,  # from the first window's opening to the last warm-up batch's end
        "batch_wall_s": (last - start) / len(steady) if len(steady) else None,  # a steady batch, bookkeeping too
        "data_prep_s": float(stats.times_s["data_prep"]),
        "eval_s": eval_s,
        "eval_rows": sum(stats.scored.values()) or rec.full.get("eval_rows", 0),  # rows scored (all ranks)
        "epoch_end_s": max(done - last - eval_s, 0.0),  # saves and the engine's epoch end, without evaluation
        "setup_s": first - STARTED - float(stats.times_s["data_prep"]),
        "engine_s": done - first,
        "process_s": time.perf_counter() - STARTED,
        "world_size": stats.world_size,
        "full": rec.full,
    }


def write(spec: Spec, stats: Any, rank: int) -> None:
    """Rank 0 writes probe.json (after result.json), atomically."""
    if RECORDER is None or not spec.probe or rank != 0:
        return
    from training.results import atomic_write, peak_memory_mb

    doc = measurements(RECORDER, stats)
    doc["peak_memory_mb"] = peak_memory_mb(stats)
    path = Path(spec.job_dir) / "probe.json"
    atomic_write(path, json.dumps(doc, indent=1) + "\n")
    console.line(f"training: wrote {path}")
