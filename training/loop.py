"""The training loop shared by the plain-PyTorch and Fabric engines.

What differs between them (device placement, backward, gradient sync, collectives, checkpoint I/O)
sits behind the small `Runtime` interface each engine implements; everything else is here once.
"""

from __future__ import annotations

import functools
import os
import shutil
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from training import adapter, console, halving, requeue
from training.engines.common import parameter_shards
from training.loaders import model_inputs
from training.metrics import Scores
from training.optim import total_steps
from training.progress import epoch_line
from training.results import Clock, MetricsLog, Stats
from training.spec import Spec
from training.timing import TrainClock

BEST = "best-model.pt"  # not .ckpt: never taken for a resume


class Runtime(Protocol):
    rank: int
    world: int
    device: Any

    def to_device(self, batch: dict[str, Any]) -> dict[str, Any]: ...
    def autocast(self) -> AbstractContextManager[Any]: ...
    def no_sync(self, model: Any, enabled: bool) -> AbstractContextManager[Any]: ...
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
    prepared: Any  # training.data.Prepared: the problem type, the classes, the test splits' rows
    stats: Stats
    log: MetricsLog
    watcher: requeue.Watcher | None
    progress: dict[str, int] = field(default_factory=lambda: {"epoch": 0, "batch": 0, "global_step": 0})
    clock: TrainClock = field(init=False)
    tracker: console.Tracker = field(init=False)

    def __post_init__(self) -> None:
        self.clock = TrainClock(self.stats, self.spec)
        if self.rt.world > 1:
            # The runtime, not self: no cycle through the clock, so the job goes with its last reference.
            self.clock.any_rank = functools.partial(_agreed, self.rt)
        batches = self.loaders["train"].batch_sampler.num_batches()
        t = self.spec.train
        self.tracker = console.Tracker(
            self.stats, self.clock, epochs=t.epochs, batches=batches, steps=total_steps(batches, t), world=self.rt.world
        )


class RandomState:
    """The random generators of this process (CPU, and each CUDA device once CUDA is up) as a stateful
    object of a checkpoint: after a requeue, dropout goes on with the stream where it stopped instead of
    replaying the seed's. Rank 0's is saved; every rank was seeded alike, so every rank takes it."""

    def state_dict(self) -> dict[str, Any]:
        import torch

        state: dict[str, Any] = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import torch

        torch.set_rng_state(state["cpu"].cpu())  # a checkpoint loaded onto the GPU has it there
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def state_of(job: Job) -> dict[str, Any]:
    """What a checkpoint holds; the fp16 loss scaler too (a resume must not restart at 2**16)."""
    scaler = getattr(job.rt, "scaler", None)
    return {
        "model": job.model,
        "optimizer": job.optimizer,
        "scheduler": job.scheduler,
        "progress": job.progress,
        "stats": job.stats.state(),
        "rng": RandomState(),
        **({"scaler": scaler} if scaler is not None else {}),
    }


def checkpoint(job: Job) -> None:
    """Save to a temporary name, then rank 0 renames it: a half-written checkpoint is never 'newest'."""
    job.clock.flush(job.rt.reduce_sum)
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
    for old in final.parent.iterdir():  # keep only the newest: these are for resuming, not analysis
        if old.name.startswith("step-") and old != final:
            _remove(old)
    os.replace(tmp, final)


def _remove(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()


def save_best(job: Job) -> None:
    """The weights of the best validation epoch so far, the ones `test` scores (as Lightning's
    ModelCheckpoint does: kept when the primary metric is strictly better than every earlier epoch's)."""
    directory = job.spec.checkpoint_dir
    tmp, final = directory / f".tmp-{BEST}", directory / BEST
    if job.rt.rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
    job.rt.barrier()
    job.rt.save(tmp, {"model": job.model})
    job.rt.barrier()
    if job.rt.rank == 0:
        if final.exists():
            _remove(final)
        os.replace(tmp, final)
    job.rt.barrier()


def best_epoch(values: list[float]) -> int | None:
    """The first epoch with the highest value (Stats.val_primary(): the primary metric, higher better)."""
    return max(range(len(values)), key=lambda i: (values[i], -i)) if values else None


def resume(job: Job) -> None:
    found = requeue.newest_checkpoint(job.spec.checkpoint_dir, ".ckpt")
    if found is None:
        return
    state = state_of(job)
    job.rt.load(found, state)
    job.progress.update(state["progress"])
    job.stats.restore(state["stats"])
    job.stats.resumed = True
    # A checkpoint taken on the requeue signal is mid-epoch: that epoch goes on after its done batches.
    job.loaders["train"].batch_sampler.resume_at(job.progress["epoch"], job.progress["batch"])


def evaluate(job: Job, split: str) -> dict[str, Any]:
    import torch

    job.model.eval()
    truth = job.prepared.splits[split]["labels"]
    scores = Scores(job.prepared.problem_type, job.prepared.num_labels, job.rt.device, truth)
    with torch.no_grad(), job.rt.autocast():
        for batch in job.loaders[split]:
            batch = job.rt.to_device(batch)
            scores.update(job.model(**model_inputs(batch)).logits.float(), batch["labels"], batch["row"])
    job.model.train()
    return scores.compute()


def _step(job: Job, batch: dict[str, Any], index: int, last: int) -> tuple[float, bool]:
    """Forward + backward on one batch; an optimizer step every grad_accum batches."""
    accum = job.spec.train.grad_accum
    accumulating = (index + 1) % accum != 0 and index + 1 < last
    with job.rt.no_sync(job.model, accumulating), job.rt.autocast():
        loss = job.model(**model_inputs(batch)).loss
    job.rt.backward(loss / accum, job.model)
    if not accumulating:
        job.rt.optimizer_step(job.optimizer)
        job.scheduler.step()
        job.optimizer.zero_grad(set_to_none=True)
        job.progress["global_step"] += 1
    return float(loss.detach()), not accumulating


def train_epoch(job: Job, epoch: int) -> str:
    """One epoch (after a requeue, its batches not yet done); returns "done", "max_steps" or
    "interrupted". Only fetch, step and optimizer sit inside the clock's window (training/timing.py)."""
    t, loader = job.spec.train, job.loaders["train"]
    batches = loader.batch_sampler
    batches.set_epoch(epoch)
    last, index = batches.num_batches(), batches.skip
    job.progress.update(epoch=epoch, batch=index)
    job.model.train()
    job.tracker.at(epoch, index, job.progress["global_step"])
    console.training(job.tracker)
    fetch = iter(loader)
    pending = next(fetch, None)  # the epoch's first batch comes before the clock opens (every engine)
    job.clock.open()
    while pending is not None:
        batch, pending = job.rt.to_device(pending), next(fetch, None)
        loss, stepped = _step(job, batch, index, last)
        job.clock.close(batch, epoch)
        index, job.progress["batch"] = index + 1, index + 1
        job.tracker.batch_done(epoch, index, job.progress["global_step"], loss)
        job.log.progress(
            epoch=epoch,
            epochs=t.epochs,
            batch=index,
            batches=last,
            step=job.progress["global_step"],
            force=index == last,
        )
        if stepped and job.progress["global_step"] % t.log_every_n_steps == 0:
            job.log.add(
                epoch=epoch,
                step=job.progress["global_step"],
                split="train",
                loss=loss,
                lr=job.scheduler.get_last_lr()[0],
            )
        if t.max_steps and job.progress["global_step"] >= t.max_steps:
            return "max_steps"
        if job.watcher is not None and _agreed(job.rt, job.watcher.requested):
            return "interrupted"
        job.clock.open()
    return "done"


def _agreed(rt: Runtime, flag: bool) -> bool:
    # True on every rank when it is True on any: a signal may reach one rank (or ranks at different
    # steps), a recompile may happen on one; all stop, or warm up, together.
    return rt.reduce_sum([float(flag)])[0] > 0


def fit(job: Job) -> None:
    """Train the remaining epochs (after a resume, only those), validating and checkpointing each."""
    t, stats = job.spec.train, job.stats
    console.set_rank(job.rt.rank)
    resume(job)
    # Epochs whose validation ran are done; a mid-epoch checkpoint resumes at progress["batch"].
    for epoch in range(stats.epochs_validated(), t.epochs):
        if t.max_steps and job.progress["global_step"] >= t.max_steps:
            break
        if not _goes_on(job, epoch):
            return  # paused at a halving rung: stats.paused_at says so
        outcome = train_epoch(job, epoch)
        if outcome == "interrupted":
            console.phase("checkpointing for the requeue")
            checkpoint(job)
            stats.interrupted = True
            return
        console.phase(f"validating epoch {epoch + 1}/{t.epochs}")
        with Clock(stats, "eval"):
            val = evaluate(job, "validation")
        console.say(epoch_line("validation", val, epoch=epoch, epochs=t.epochs, primary=stats.primary_metric))
        console.phase("checkpointing")
        stats.add_validation(val)
        if best_epoch(stats.val_primary()) == epoch:
            save_best(job)
        job.log.add(epoch=epoch, step=job.progress["global_step"], split="validation", acc=val["acc"], f1=val["f1"])
        job.progress.update(epoch=epoch + 1, batch=0)
        checkpoint(job)
        job.log.flush()
        if outcome == "max_steps":
            break
    job.clock.flush(job.rt.reduce_sum)
    stats.parameters = parameter_shards(job.model, job.rt.rank, job.rt.world, job.rt.reduce_sum)
    stats.epochs_done = stats.epochs_validated()
    stats.optimizer_steps = job.progress["global_step"]


def _goes_on(job: Job, done: int) -> bool:
    """After `done` epochs: at a halving rung, rank 0 reports and applies the rule, and every rank
    follows its answer (training.halving.goes_on)."""
    return halving.goes_on(job.spec, job.stats, done, job.rt.rank, job.rt.reduce_sum)


def test(job: Job) -> None:
    """Score the test splits with the best validation epoch's weights."""
    best = best_epoch(job.stats.val_primary())
    if best is not None and best != job.stats.epochs_validated() - 1:
        job.rt.load(job.spec.checkpoint_dir / BEST, {"model": job.model})
    job.stats.tested_epoch = best
    console.phase("testing")
    note = f"weights of epoch {best + 1}" if best is not None else ""
    for split in job.prepared.test_splits():
        with Clock(job.stats, "eval"):
            result = evaluate(job, split)
        console.say(epoch_line(split, result, note=note, primary=job.stats.primary_metric))
        job.stats.add_test(split, result, job.spec, job.prepared, job.rt.rank)
        if split == "test":
            scores = result
    job.log.add(
        epoch=job.stats.epochs_done, step=job.progress["global_step"], split="test", acc=scores["acc"], f1=scores["f1"]
    )
    job.log.flush()
    adapter.save(job.model, job.spec.job_dir, job.rt.rank)  # the weights just tested
