"""The training loop shared by the plain-PyTorch and Fabric engines.

What differs between them (device placement, backward, gradient sync, collectives, checkpoint I/O)
sits behind the small `Runtime` interface each engine implements; everything else is here once.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from training import requeue
from training.loaders import token_counts
from training.metrics import Scores
from training.results import Clock, MetricsLog, Stats, graphs_compiled
from training.spec import Spec


class Runtime(Protocol):
    rank: int
    world: int
    device: Any

    def to_device(self, batch: dict[str, Any]) -> dict[str, Any]: ...
    def autocast(self) -> AbstractContextManager: ...
    def no_sync(self, model: Any, enabled: bool) -> AbstractContextManager: ...
    def backward(self, loss: Any, model: Any) -> None: ...
    def optimizer_step(self, optimizer: Any) -> None: ...
    def reduce_sum(self, values: list[float]) -> list[float]: ...
    def barrier(self) -> None: ...
    def save(self, path: Path, state: dict[str, Any]) -> None: ...
    def load(self, path: Path, state: dict[str, Any]) -> None: ...


@dataclass
class Job:
    """Everything one fit needs, built by the engine."""

    spec: Spec
    rt: Runtime
    model: Any
    optimizer: Any
    scheduler: Any
    loaders: dict[str, Any]
    num_classes: int
    stats: Stats
    log: MetricsLog
    watcher: requeue.Watcher | None
    progress: dict[str, int] = field(default_factory=lambda: {"epoch": 0, "batch": 0, "global_step": 0})
    local: list[float] = field(default_factory=lambda: [0.0] * 4)  # samples, tokens, real, slots
    steps_this_attempt: int = 0


def state_of(job: Job) -> dict[str, Any]:
    return {"model": job.model, "optimizer": job.optimizer, "scheduler": job.scheduler,
            "progress": job.progress, "stats": job.stats.state()}


def flush_counters(job: Job) -> None:
    """Sum this rank's throughput counters over all ranks into stats (a collective: all ranks call)."""
    samples, tokens, real, slots = job.rt.reduce_sum(job.local)
    s = job.stats
    s.timed_samples += int(samples)
    s.timed_tokens += int(tokens)
    s.real_tokens += int(real)
    s.padded_slots += int(slots)
    job.local = [0.0] * 4


def checkpoint(job: Job) -> None:
    """Save to a temporary name, then rank 0 renames it: a half-written checkpoint is never 'newest'."""
    flush_counters(job)
    directory = job.spec.checkpoint_dir
    name = f"step-{job.progress['global_step']:07d}.ckpt"
    tmp = directory / f".tmp-{name}"
    if job.rt.rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
    job.rt.barrier()
    job.rt.save(tmp, state_of(job))
    job.rt.barrier()
    if job.rt.rank == 0:
        _replace(tmp, directory / name)
    job.rt.barrier()


def _replace(tmp: Path, final: Path) -> None:
    import os
    import shutil

    for old in final.parent.iterdir():  # keep only the newest: these are for resuming, not analysis
        if old.name.startswith("step-") and old != final:
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    os.replace(tmp, final)


def resume(job: Job) -> None:
    found = requeue.newest_checkpoint(job.spec.checkpoint_dir, ".ckpt")
    if found is None:
        return
    state = state_of(job)
    job.rt.load(found, state)
    job.progress.update(state["progress"])
    job.stats.restore(state["stats"])
    job.stats.resumed = True


def evaluate(job: Job, split: str) -> dict[str, float | None]:
    import torch

    job.model.eval()
    scores = Scores(job.num_classes, job.rt.device)
    with torch.no_grad(), job.rt.autocast():
        for batch in job.loaders[split]:
            batch = job.rt.to_device(batch)
            scores.update(job.model(**batch).logits.float(), batch["labels"])
    job.model.train()
    return scores.compute()


def _step(job: Job, batch: dict[str, Any], index: int, last: int) -> tuple[float, bool]:
    """Forward + backward on one batch; an optimizer step every grad_accum batches."""
    accum = job.spec.train.grad_accum
    accumulating = (index + 1) % accum != 0 and index + 1 < last
    with job.rt.no_sync(job.model, accumulating), job.rt.autocast():
        loss = job.model(**batch).loss
    job.rt.backward(loss / accum, job.model)
    if not accumulating:
        job.rt.optimizer_step(job.optimizer)
        job.scheduler.step()
        job.optimizer.zero_grad(set_to_none=True)
        job.progress["global_step"] += 1
    return float(loss.detach()), not accumulating


def _count(job: Job, batch: dict[str, Any], seconds: float, stepped: bool, compiled: bool) -> None:
    """Warm-up steps, and any later step that compiled a graph (a new length bucket), are timed as
    warmup_compile and left out of the throughput counters."""
    t, s = job.spec.train, job.stats
    real, slots = token_counts(batch)
    job.local[2] += real
    job.local[3] += slots
    in_warmup = t.compile and (job.steps_this_attempt < t.warmup_compile_steps or compiled)
    if in_warmup:
        s.times_s["warmup_compile"] += seconds
    else:
        s.times_s["train"] += seconds
        job.local[0] += batch["labels"].shape[0]
        job.local[1] += real
    job.steps_this_attempt += int(stepped)


def train_epoch(job: Job, epoch: int) -> str:
    """One epoch from progress['batch']; returns "done", "max_steps" or "interrupted"."""
    t, loader = job.spec.train, job.loaders["train"]
    sampler = getattr(loader, "_dataloader", loader).sampler  # Fabric wraps the DataLoader
    sampler.set_epoch(epoch, job.progress["batch"])
    last = sampler.num_batches()
    index, job.progress["epoch"] = job.progress["batch"], epoch
    job.model.train()
    tick = time.perf_counter()
    for batch in _progress(loader, job, epoch, last - index):
        batch = job.rt.to_device(batch)
        graphs = graphs_compiled() if t.compile else 0
        loss, stepped = _step(job, batch, index, last)
        now = time.perf_counter()
        _count(job, batch, now - tick, stepped, t.compile and graphs_compiled() != graphs)
        index, job.progress["batch"] = index + 1, index + 1
        job.log.progress(epoch=epoch, epochs=t.epochs, batch=index, batches=last, step=job.progress["global_step"],
                         force=index == last)
        if stepped and job.progress["global_step"] % t.log_every_n_steps == 0:
            job.log.add(epoch=epoch, step=job.progress["global_step"], split="train", loss=loss,
                        lr=job.scheduler.get_last_lr()[0])
        if t.max_steps and job.progress["global_step"] >= t.max_steps:
            return "max_steps"
        if job.watcher is not None and _agreed(job, job.watcher.requested):
            return "interrupted"
        tick = time.perf_counter()
    return "done"


def _progress(loader: Any, job: Job, epoch: int, total: int) -> Any:
    """A progress bar on rank 0; in a batch log (no terminal) it redraws rarely instead of per step."""
    import sys

    from tqdm.auto import tqdm

    interactive = sys.stderr.isatty()
    return tqdm(loader, desc=f"epoch {epoch}", total=total, disable=job.rt.rank != 0,
                mininterval=0.5 if interactive else 30, dynamic_ncols=interactive)


def _agreed(job: Job, flag: bool) -> bool:
    # The signal may reach one rank (or reach ranks at different steps): stop together or not at all.
    return job.rt.reduce_sum([float(flag)])[0] > 0


def fit(job: Job) -> None:
    """Train the remaining epochs (after a resume, only those), validating and checkpointing each."""
    t, stats = job.spec.train, job.stats
    resume(job)
    # Epochs whose validation ran are done; a mid-epoch checkpoint resumes at progress["batch"].
    for epoch in range(len(stats.val_acc_per_epoch), t.epochs):
        if t.max_steps and job.progress["global_step"] >= t.max_steps:
            break
        outcome = train_epoch(job, epoch)
        if outcome == "interrupted":
            checkpoint(job)
            stats.interrupted = True
            return
        with Clock(stats, "eval"):
            val = evaluate(job, "validation")
        stats.val_acc_per_epoch.append(val["acc"])
        job.log.add(epoch=epoch, step=job.progress["global_step"], split="validation", acc=val["acc"],
                    f1=val["f1"])
        job.progress.update(epoch=epoch + 1, batch=0)
        checkpoint(job)
        job.log.flush()
        if outcome == "max_steps":
            break
    stats.epochs_done = len(stats.val_acc_per_epoch)
    stats.optimizer_steps = job.progress["global_step"]


def test(job: Job) -> None:
    with Clock(job.stats, "eval"):
        scores = evaluate(job, "test")
    job.stats.test_acc, job.stats.test_f1 = scores["acc"], scores["f1"]
    job.log.add(epoch=job.stats.epochs_done, step=job.progress["global_step"], split="test",
                acc=scores["acc"], f1=scores["f1"])
    job.log.flush()
