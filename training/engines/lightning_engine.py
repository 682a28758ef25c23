"""LightningModule + Trainer: ModelCheckpoint on the best primary metric, CSV log, test on the best checkpoint."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DeepSpeedStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException

from training import adapter, console, halving, requeue
from training.contract import PRECISIONS, one_of
from training.data import Prepared
from training.engines import common
from training.hardware import effective_precision, resolve_accelerator
from training.loaders import make_loader, model_inputs
from training.metrics import Scores, better
from training.optim import build_optimizer, build_scheduler, warmup_steps
from training.progress import epoch_line
from training.results import MetricsLog, Stats
from training.sharding import fsdp2_parallelize
from training.spec import Spec, is_fsdp
from training.strategies import cluster_plugins, make_strategy
from training.timing import TrainClock


class Preempted(Exception):
    """Raised by every rank after the requeue checkpoint: ends fit without Lightning's end-of-epoch
    validation and checkpointing (which would save a 'last' checkpoint of a half-done epoch)."""


class Paused(Exception):
    """Raised by every rank of a job that halving paused at a rung (training.halving.goes_on), at the
    start of the epoch after it: the checkpoint of the rung's epoch is written, nothing more is."""


class Classifier(L.LightningModule):
    def __init__(self, spec: Spec, prepared: Prepared, stats: Stats) -> None:
        super().__init__()
        self.spec, self.prepared, self.stats = spec, prepared, stats
        self.model = common.build_model(spec, prepared)
        self.scores: Scores | None = None
        self.test_split = "test"  # the split `trainer.test` scores now (data.extra_test_splits after "test")
        self.last_loss: Any = None  # the last training batch's loss (a tensor), for the progress line
        self.resume_at: tuple[int, int] | None = None  # (epoch, batches done) from a checkpoint
        self.batch_fetched: Any = None  # Bookkeeping.batch_fetched, told of each training batch fetched

    def setup(self, stage: str) -> None:
        console.set_rank(self.global_rank)
        if stage == "fit":
            common.announce(self.global_rank, self.trainer.world_size, self.trainer.strategy)

    def configure_model(self) -> None:
        # Called once per process after the strategy is set up: FSDP2 sharding needs the device mesh.
        if is_fsdp(self.spec.train.strategy) and not getattr(self, "_sharded", False):
            offload = self.spec.train.strategy == "fsdp_offload"
            fsdp2_parallelize(self.model, self.device_mesh, offload, self.stats.precision_effective)
            self._sharded = True
        if self.spec.train.compile and not getattr(self, "_compiled", False):
            self.model = common.maybe_compile(self.model, self.spec)
            self._compiled = True

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Lightning's first hook after it fetched a batch, before the copy to the device.
        if self.trainer.training and self.batch_fetched is not None:
            self.batch_fetched()
        return batch

    def on_train_epoch_start(self) -> None:
        # Lightning restores each submodule's mode as it found it: a model loaded in eval mode
        # would train with dropout off. Training means training mode, whatever came before.
        self.model.train()

    def training_step(self, batch: dict[str, Any], index: int) -> Any:
        loss = self.model(**model_inputs(batch)).loss
        self.log("train_loss", loss)
        self.last_loss = loss.detach()  # Lightning hands callbacks the loss divided by grad_accum
        return loss

    def _eval_step(self, batch: dict[str, Any], split: str) -> None:
        if self.scores is None:
            truth = self.prepared.splits[split]["labels"]
            self.scores = Scores(self.prepared.problem_type, self.prepared.num_labels, self.device, truth)
        self.scores.update(self.model(**model_inputs(batch)).logits.float(), batch["labels"], batch["row"])

    def validation_step(self, batch: dict[str, Any], index: int) -> None:
        self._eval_step(batch, "validation")

    def test_step(self, batch: dict[str, Any], index: int) -> None:
        self._eval_step(batch, self.test_split)

    def on_validation_epoch_end(self) -> None:
        assert self.scores is not None  # made by the epoch's first evaluation step
        result, self.scores = self.scores.compute(), None  # compute() gathered every rank's predictions
        primary = self.stats.primary_metric
        # What ModelCheckpoint maximizes: the primary metric, negated where lower is better.
        self.log("val_primary", better(primary, result["metrics"].get(primary)), sync_dist=False)
        if not self.trainer.sanity_checking:
            self.stats.add_validation(result)
            self.last_validation = result

    def on_test_epoch_end(self) -> None:
        assert self.scores is not None
        result, self.scores = self.scores.compute(), None
        self.stats.add_test(self.test_split, result, self.spec, self.prepared, self.global_rank)
        self.last_test = result
        if result["acc"] is not None:
            self.log("test_acc", result["acc"], sync_dist=False)

    def configure_optimizers(self) -> Any:
        optimizer = build_optimizer(self.model, self.spec.train)
        total = int(self.trainer.estimated_stepping_batches)
        scheduler = build_scheduler(optimizer, total, warmup_steps(total, self.spec.train))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _loader(self, split: str) -> Any:
        loader = make_loader(
            self.prepared.splits[split],
            self.spec,
            self.prepared.tokenizer,
            split == "train",
            self.global_rank,
            self.trainer.world_size,
        )
        if split == "train" and self.resume_at is not None:
            # Lightning restarts an interrupted epoch's data from its first batch unless the data can
            # skip what was done: the batch sampler does (Lightning calls its set_epoch).
            loader.batch_sampler.resume_at(*self.resume_at)
            # With DataLoader workers the first batches are taken when Lightning creates the iterator,
            # before its set_epoch: the sampler must stand at the resumed epoch and batch already.
            epoch, done = self.resume_at
            loader.batch_sampler.set_epoch(epoch if done < len(loader.batch_sampler) else epoch + 1)
        return loader

    def train_dataloader(self) -> Any:
        return self._loader("train")

    def val_dataloader(self) -> Any:
        return self._loader("validation")

    def test_dataloader(self) -> Any:
        return self._loader(self.test_split)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get("jobgen")
        if saved and self.trainer.state.fn == "fit":
            self.stats.restore(saved["stats"])
            self.resume_at = (saved["epoch"], saved["batch"])


class Bookkeeping(Callback):
    """The shared timing window (training/timing.py), metrics.csv rows, progress.json, the resume point
    and counters in every checkpoint, and the checkpoint-and-stop on the requeue signal."""

    def __init__(self, spec: Spec, stats: Stats, watcher: requeue.Watcher | None) -> None:
        self.spec, self.stats, self.watcher = spec, stats, watcher
        self.clock = TrainClock(stats, spec)
        self.batch = 0  # batches done in the current epoch, over every attempt
        self.rows: MetricsLog | None = None
        self.tracker: console.Tracker | None = None
        self.first_pending = False  # the epoch's first batch is not fetched yet: the window opens after it

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.rows = self.rows or MetricsLog(self.spec.job_dir / "metrics.csv", trainer.global_rank == 0)
        if trainer.world_size > 1:
            self.clock.any_rank = lambda flag: bool(trainer.strategy.reduce_boolean_decision(flag, all=False))

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        # Lightning fetches the epoch's first batch after this hook (its fetcher prefetches nothing from
        # a loader with a length): the window opens once it is fetched (batch_fetched), as in the loops.
        self.batch = trainer.train_dataloader.batch_sampler.skip_for(trainer.current_epoch)
        if self.tracker is not None:
            self.tracker.at(trainer.current_epoch, self.batch, trainer.global_step)
            console.training(self.tracker)
        self.first_pending = True

    def batch_fetched(self) -> None:
        """Called by the module's on_before_batch_transfer for every training batch Lightning fetched."""
        if self.first_pending:
            self.first_pending = False
            self.clock.open()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.tracker = console.Tracker(
            self.stats,
            self.clock,
            epochs=self.spec.train.epochs,
            batches=int(trainer.num_training_batches),
            steps=int(trainer.estimated_stepping_batches),
            world=trainer.world_size,
        )
        self.on_train_epoch_start(trainer, pl_module)  # an epoch resumed mid-way gets no epoch start

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, index: int) -> None:
        self.clock.close(batch, trainer.current_epoch)
        t = self.spec.train
        self.batch += 1
        batches = trainer.num_training_batches
        assert self.rows is not None and self.tracker is not None  # made in setup, on_train_start
        self.tracker.batch_done(trainer.current_epoch, self.batch, trainer.global_step, float(pl_module.last_loss))
        self.rows.progress(
            epoch=trainer.current_epoch,
            epochs=t.epochs,
            batch=self.batch,
            batches=batches,
            step=trainer.global_step,
            force=self.batch == batches,
        )
        if trainer.global_step % t.log_every_n_steps == 0:
            self.rows.add(
                epoch=trainer.current_epoch,
                step=trainer.global_step,
                split="train",
                loss=float(outputs["loss"]),
                lr=trainer.optimizers[0].param_groups[0]["lr"],
            )
        if self.watcher is not None and trainer.strategy.reduce_boolean_decision(self.watcher.requested, all=False):
            console.phase("checkpointing for the requeue")
            self._checkpoint_and_stop(trainer)
        self.clock.open()

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        # Every rank saves (and so reaches this), so the counters can be summed here.
        self.clock.flush(lambda values: _reduce_sum(trainer, pl_module, values))
        checkpoint["jobgen"] = {"epoch": trainer.current_epoch, "batch": self.batch, "stats": self.stats.state()}

    def _checkpoint_and_stop(self, trainer: Any) -> None:
        directory = self.spec.checkpoint_dir
        final = directory / f"requeue-step-{trainer.global_step:07d}.ckpt"
        tmp = directory / f".tmp-{final.name}"
        trainer.save_checkpoint(tmp)
        trainer.strategy.barrier()
        if trainer.global_rank == 0:
            os.replace(tmp, final)
        trainer.strategy.barrier()
        raise Preempted(f"checkpointed at step {trainer.global_step}")

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        console.phase(f"validating epoch {trainer.current_epoch + 1}/{self.spec.train.epochs}")
        self.eval_tick = time.perf_counter()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.stats.times_s["eval"] += time.perf_counter() - self.eval_tick
        if self.stats.val_metrics_per_epoch and not trainer.sanity_checking:
            result = pl_module.last_validation
            console.say(
                epoch_line(
                    "validation",
                    result,
                    epoch=trainer.current_epoch,
                    epochs=self.spec.train.epochs,
                    primary=self.stats.primary_metric,
                )
            )
            console.phase("checkpointing")
            assert self.rows is not None
            self.rows.add(
                epoch=trainer.current_epoch,
                step=trainer.global_step,
                split="validation",
                acc=result["acc"],
            )
            self.rows.flush()

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        console.phase("testing")
        self.eval_tick = time.perf_counter()

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self.stats.times_s["eval"] += time.perf_counter() - self.eval_tick
        tested = self.stats.tested_epoch
        console.say(
            epoch_line(
                pl_module.test_split,
                pl_module.last_test,
                note=f"weights of epoch {tested + 1}" if tested is not None else "",
                primary=self.stats.primary_metric,
            )
        )
        if pl_module.test_split != "test":
            return
        assert self.rows is not None
        self.rows.add(
            epoch=trainer.current_epoch,
            step=trainer.global_step,
            split="test",
            acc=self.stats.test_acc,
            f1=self.stats.test_f1,
        )
        self.rows.flush()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        def reduce_sum(values: list[float]) -> list[float]:
            return _reduce_sum(trainer, pl_module, values)

        self.clock.flush(reduce_sum)
        self.stats.parameters = common.parameter_shards(
            pl_module.model, trainer.global_rank, trainer.world_size, reduce_sum
        )


class RungCheck(Callback):
    """Successive halving (training/halving.py) at each epoch's start, as the loop of the torch and Fabric
    engines does it: there the previous epoch is validated and its checkpoint written (ModelCheckpoint
    saves at the end of the training epoch, after validation). A job that pauses raises Paused; a resumed
    job passes its rung again at its start and keeps the decision it had."""

    def __init__(self, spec: Spec, stats: Stats) -> None:
        self.spec, self.stats = spec, stats
        self.checked = -1  # the epochs validated at the last check: once per epoch boundary

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.on_train_epoch_start(trainer, pl_module)  # a resumed epoch may get no epoch start

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        done = self.stats.epochs_validated()
        if done == self.checked:
            return
        self.checked = done
        rank = trainer.global_rank
        if not halving.goes_on(self.spec, self.stats, done, rank, lambda v: _reduce_sum(trainer, pl_module, v)):
            raise Paused(f"paused at rung {done}")


def _reduce_sum(trainer: Any, pl_module: Any, values: list[float]) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=pl_module.device)
    return cast(list[float], trainer.strategy.reduce(tensor, reduce_op="sum").tolist())


def _trainer(spec: Spec, stats: Stats, callbacks: list[Any]) -> L.Trainer:
    t = spec.train
    stats.accelerator = resolve_accelerator(t)
    stats.precision_effective = effective_precision(t.precision, stats.accelerator)
    return L.Trainer(
        accelerator=stats.accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=make_strategy(t, stats.accelerator, fabric=False),
        precision=one_of(stats.precision_effective, PRECISIONS),
        plugins=cluster_plugins(fabric=False),
        max_epochs=t.epochs,
        max_steps=t.max_steps or -1,
        accumulate_grad_batches=t.grad_accum,
        log_every_n_steps=t.log_every_n_steps,
        deterministic=t.deterministic or None,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        enable_model_summary=False,
        enable_progress_bar=False,  # training.console prints the one progress line of every engine
        default_root_dir=str(spec.job_dir),
        callbacks=callbacks,
        logger=CSVLogger(str(spec.job_dir), name="lightning_logs"),
    )


def _keep_our_signal_handlers(trainer: L.Trainer) -> None:
    """With requeue on, Lightning's SignalConnector must not take SIGTERM over at each fit: its handler
    broadcasts from inside the handler (a collective at an arbitrary point, which can pair with another
    rank's all-reduce), and at the next batch its loops end fit with SIGTERMException, a SystemExit
    without a code: exit 0 and no checkpoint. Ours (training.requeue) stay instead. Without requeue,
    Lightning keeps its own (it passes SIGTERM on to the ranks it started itself) and its exit becomes
    143 in `run`. Its auto-requeue (SIGUSR1) is off already: SLURMEnvironment(auto_requeue=False)."""
    connector = getattr(trainer, "_signal_connector", None)
    if connector is not None:
        connector.register_signal_handlers = lambda: None


def _test_best(trainer: L.Trainer, module: Classifier, best: ModelCheckpoint, spec: Spec, stats: Stats) -> None:
    found = re.search(r"best-epoch=(\d+)", Path(best.best_model_path).name) if best.best_model_path else None
    stats.tested_epoch = int(found.group(1)) if found else None
    for split in module.prepared.test_splits():
        module.test_split = split
        if "stage_3" not in spec.train.strategy or not best.best_model_path:
            # Named: there are two ModelCheckpoints. verbose=False: the test line is ours (on_test_end).
            trainer.test(module, ckpt_path=best.best_model_path or None, verbose=False)
            continue
        # DeepSpeed cannot load a ZeRO-3 checkpoint into its inference engine (the fp32 partitions live in
        # optimizer state it does not have there). Restore the best weights into the training engine,
        # then test the module as it is in memory.
        cast(DeepSpeedStrategy, trainer.strategy).deepspeed_engine.load_checkpoint(
            best.best_model_path, load_lr_scheduler_states=False
        )
        trainer.test(module, verbose=False)


def run(spec: Spec, prepared: Prepared, stats: Stats, watcher: requeue.Watcher | None) -> int:
    L.seed_everything(spec.train.seed, verbose=False)
    best = ModelCheckpoint(
        dirpath=str(spec.checkpoint_dir), filename="best-{epoch}", monitor="val_primary", mode="max", save_top_k=1
    )
    # Every epoch's end, for a resume: save_last=True on `best` writes only when the best improves.
    last = ModelCheckpoint(
        dirpath=str(spec.checkpoint_dir), filename="last", save_top_k=1, enable_version_counter=False
    )
    book = Bookkeeping(spec, stats, watcher)
    trainer = _trainer(spec, stats, [best, last, book, RungCheck(spec, stats)])
    if watcher is not None:
        _keep_our_signal_handlers(trainer)
    module = Classifier(spec, prepared, stats)
    module.batch_fetched = book.batch_fetched
    common.record_sizes(stats, prepared)
    resume_from = requeue.newest_checkpoint(spec.checkpoint_dir, ".ckpt")
    stats.resumed = resume_from is not None
    try:
        trainer.fit(module, ckpt_path=str(resume_from) if resume_from else None)
    except (Preempted, Paused):
        stats.interrupted = True  # and stats.paused_at for a pause
    except SIGTERMException:
        # Lightning's own SIGTERM stop is a SystemExit without a code (exit 0, "COMPLETED"); the job
        # was killed before its result: say so.
        raise SystemExit(128 + signal.SIGTERM) from None
    stats.world_size = trainer.world_size
    stats.epochs_done = trainer.current_epoch if not stats.interrupted else stats.epochs_validated()
    stats.optimizer_steps = trainer.global_step
    if not stats.interrupted:
        _test_best(trainer, module, best, spec, stats)
        adapter.save(module.model, spec.job_dir, trainer.global_rank)  # the weights just tested
    return trainer.global_rank  # training.run writes the result, then tears the group down
