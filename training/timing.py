"""The one timing window every engine uses (docs/contracts.md, "The timing window").

`open()` is called before a training batch is fetched, `close(batch)` right after that batch's
backward and optimizer step. The window therefore holds data loading (except each epoch's first
batch, fetched before the clock opens in every engine), host-to-device
copies, forward, backward, gradient sync and the optimizer step, and on a GPU the wait for all of
it to finish (close synchronizes). What happens between a close and the next open is jobgen's own
bookkeeping and is never timed in any engine: metrics rows, progress.json, the progress bar, the
requeue agreement between ranks, checkpoints. Validation and test are timed apart ("eval").

The first `warmup_compile_steps` batches of an attempt are timed as "warmup_compile" and left out of
the throughput counters in every run, compiled or eager: an eager run's first steps pay their own
warm-up (CUDA's lazy loading, cuBLAS handles, the caching allocator's growth), and a compiled job and
its eager baseline must time the same window. When compiling, any later batch that compiled a new
graph goes there too. samples/s is the work of the timed batches divided by their time, so the
configurations are compared per sample, over work of the same kind.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training import probe
from training.loaders import repeats, token_counts
from training.results import Stats, graphs_compiled
from training.spec import Spec

# Per-rank counters, summed over ranks by flush(): the order of Stats.add_counters().
COUNTERS = ("timed_samples", "timed_tokens", "real_tokens", "padded_slots", "trained_samples", "repeated_samples")


# A debugging aid for checking exact resume: every rank appends "epoch: rows" of each trained batch
# to $JOBGEN_TRACE_ROWS/rank<N>.txt (a repeat shows as a negative row, see training/loaders.py).
TRACE_DIR = os.environ.get("JOBGEN_TRACE_ROWS", "")
# Another: every batch waits this many seconds after its timed window closes (counted in no time and no
# throughput), so that a test can reach a short job in the middle of its training, with a signal or a
# requeue, however fast the machine trains it (the tiny model's 126 batches took 3.4 s on an idle one).
STEP_PAUSE_S = float(os.environ.get("JOBGEN_STEP_PAUSE_S") or 0)


def trace_rows(directory: Path, epoch: int, batch: dict[str, Any]) -> None:
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"rank{rank}.txt", "a") as handle:
        handle.write(f"{epoch}: {' '.join(str(int(r)) for r in batch['row'])}\n")


class TrainClock:
    def __init__(self, stats: Stats, spec: Spec) -> None:
        self.stats, self.train = stats, spec.train
        self.local = dict.fromkeys(COUNTERS, 0)
        self.batches_this_attempt = 0
        self.tick = time.perf_counter()
        self.graphs = 0
        # Set by the engine when several ranks compile: is a flag true on any rank? (a collective)
        self.any_rank: Callable[[bool], bool] | None = None

    def open(self) -> None:
        if self.train.compile:
            self.graphs = graphs_compiled()
        self.tick = time.perf_counter()

    def close(self, batch: dict[str, Any], epoch: int) -> float:
        """End the window of `batch`; returns its seconds."""
        if self.stats.accelerator == "gpu":
            import torch

            torch.cuda.synchronize()
        seconds = time.perf_counter() - self.tick
        real, slots = token_counts(batch)
        rows = int(batch["labels"].shape[0])
        c = self.local
        c["real_tokens"] += real
        c["padded_slots"] += slots
        c["trained_samples"] += rows
        c["repeated_samples"] += repeats(batch)
        warming = self.batches_this_attempt < self.train.warmup_compile_steps or (
            self.train.compile and graphs_compiled() != self.graphs
        )
        if self.train.compile and self.any_rank is not None:
            # One rank's recompile (its partial last batch) stalls the others in the step's collectives:
            # the batch is warm-up on every rank, or its stall is timed as their training.
            warming = self.any_rank(warming)
        if warming:
            self.stats.times_s["warmup_compile"] += seconds
        else:
            self.stats.times_s["train"] += seconds
            c["timed_samples"] += rows
            c["timed_tokens"] += real
        self.batches_this_attempt += 1
        probe.on_batch(self.tick, seconds, rows)
        if TRACE_DIR:
            trace_rows(Path(TRACE_DIR), epoch, batch)
        if STEP_PAUSE_S:
            time.sleep(STEP_PAUSE_S)  # before the next window opens (TrainClock.open)
        return seconds

    def flush(self, reduce_sum: Callable[[list[float]], list[float]]) -> None:
        """Add every rank's counters to stats (a collective: every rank calls it, at the same point)."""
        sums = reduce_sum([float(self.local[k]) for k in COUNTERS])
        for key, value in zip(COUNTERS, sums, strict=True):
            setattr(self.stats, key, getattr(self.stats, key) + int(round(value)))
        self.local = dict.fromkeys(COUNTERS, 0)
