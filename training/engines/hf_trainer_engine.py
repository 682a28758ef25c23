"""transformers.Trainer built from the same spec, doing the same work as the other engines.

What stays the Trainer's own: TrainingArguments (fp16/bf16, DDP, FSDP on GPUs and DeepSpeed through
accelerate), evaluation and checkpoints each epoch, the best validation checkpoint kept
(`load_best_model_at_end`) and `resume_from_checkpoint`.
FSDP on CPU is ours: accelerate builds FSDP only for GPUs (on CPU it silently runs DDP), so there the
engine shards the model itself with the FSDP2 every engine uses (training/sharding.py), hands it to the
Trainer already prepared, and checkpoints it with torch.distributed.checkpoint (`JobTrainer.shard`).
What comes from training/ so that the rows of `jobgen summary` compare like with like: AdamW, its
parameter groups and the schedule (training/optim.py), the loss as a batch mean, the prepared
splits, jobgen's batch samplers (`get_*_dataloader` return `make_loader` loaders for this rank), the
scores (`Scores`, padding rows of evaluation left out), the timing window (training/timing.py, opened
in `get_batch_samples` and closed at `on_step_end`), metrics.csv, progress.json and result.json.

Ranks come from RANK/LOCAL_RANK/WORLD_SIZE (torchrun, `accelerate launch`; under srun copied from
SLURM_PROCID & co.; without a launcher training.run starts them through torchrun: training/ranks.py).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from training import adapter, console, halving, ranks, requeue
from training.data import Prepared
from training.engines import common
from training.hardware import effective_precision, resolve_accelerator
from training.loaders import make_loader, model_inputs
from training.loop import best_epoch
from training.metrics import Scores, better
from training.optim import build_optimizer, build_scheduler, total_steps, warmup_steps
from training.progress import epoch_line
from training.results import MetricsLog, Stats, atomic_write
from training.spec import Spec, is_fsdp
from training.timing import TrainClock

if TYPE_CHECKING:
    from torch.optim.lr_scheduler import LambdaLR
    from transformers import PreTrainedTokenizerBase, TrainingArguments

STATE_FILE = "jobgen-state.json"  # our counters, written last into each Trainer checkpoint: marks it complete
# Where a checkpoint of our CPU FSDP2 keeps its shards (torch.distributed.checkpoint folders).
SHARDED_MODEL, SHARDED_OPTIMIZER = "fsdp2-model", "fsdp2-optimizer"


def shards_itself(spec: Spec, accelerator: str) -> bool:
    """FSDP on CPU with several ranks: the engine applies FSDP2 itself, accelerate would run DDP."""
    return is_fsdp(spec.train.strategy) and accelerator == "cpu" and spec.train.world_size > 1


def deepspeed_config(spec: Spec) -> Path:
    """The DeepSpeed config this job uses, written into the job folder (every rank writes the same bytes,
    atomically, before the Trainer reads it)."""
    t = spec.train
    stage = 3 if "stage_3" in t.strategy else 2
    zero: dict[str, Any] = {"stage": stage}
    if t.strategy.endswith("_offload"):
        zero["offload_optimizer"] = {"device": "cpu"}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu"}
    if stage == 3 and t.peft == "lora":
        # The Trainer saves a LoRA model's checkpoint as its adapter, from the state dict DeepSpeed gathers
        # for it; without this it hands peft an empty one (peft#2892).
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    config = {
        "zero_optimization": zero,
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        # torch's AdamW, as in every engine (DeepSpeed would otherwise want its compiled CPU Adam).
        "zero_force_ds_cpu_optimizer": False,
    }
    path = spec.job_dir / "deepspeed.json"
    atomic_write(path, json.dumps(config, indent=2) + "\n")
    return path


def training_arguments(spec: Spec, stats: Stats, steps_per_epoch: int, model: Any) -> TrainingArguments:
    from transformers import TrainingArguments

    t = spec.train
    cpu = stats.accelerator == "cpu"
    total = total_steps(steps_per_epoch, t)
    extra: dict[str, Any] = {}
    if is_fsdp(t.strategy) and not cpu:
        extra["fsdp"] = "full_shard auto_wrap" + (" offload" if t.strategy == "fsdp_offload" else "")
        extra["fsdp_config"] = {
            "fsdp_version": 2,
            "reshard_after_forward": True,
            "state_dict_type": "SHARDED_STATE_DICT",  # full state dicts of DTensors fail to save
            "transformer_layer_cls_to_wrap": _block_class_names(model),
        }
    elif t.strategy.startswith("deepspeed"):
        extra["deepspeed"] = str(deepspeed_config(spec))
    return TrainingArguments(
        output_dir=str(spec.checkpoint_dir),
        report_to="none",
        num_train_epochs=t.epochs,
        max_steps=t.max_steps or -1,
        per_device_train_batch_size=t.batch_size,
        per_device_eval_batch_size=t.eval_batch_size,
        gradient_accumulation_steps=t.grad_accum,
        learning_rate=t.lr,
        weight_decay=t.weight_decay,
        optim="adamw_torch",
        lr_scheduler_type="linear",
        warmup_steps=warmup_steps(total, t),
        max_grad_norm=0.0,  # the other engines do not clip
        bf16=stats.precision_effective == "bf16-mixed",
        fp16=stats.precision_effective == "16-mixed",
        eval_strategy="epoch",
        save_strategy="epoch",
        save_total_limit=1,
        load_best_model_at_end=True,
        metric_for_best_model="primary",  # the primary metric, negated where lower is better (metrics.better)
        greater_is_better=True,
        logging_strategy="steps",
        logging_steps=t.log_every_n_steps,
        disable_tqdm=True,
        seed=t.seed,
        full_determinism=False,  # train.deterministic: training.run sets it for every engine alike
        dataloader_num_workers=t.num_workers,
        ddp_find_unused_parameters=False,
        remove_unused_columns=False,
        use_cpu=cpu,
        ddp_backend="gloo" if cpu and t.world_size > 1 else None,  # no process group for one rank
        **extra,
    )


def _block_class_names(model: Any) -> list[str]:
    """FSDP wraps each transformer block, as the other engines' FSDP2 does: the blocks' class names."""
    from training.model import transformer_blocks

    return sorted({type(b).__name__ for b in transformer_blocks(model)})


def _trainer_class() -> type:
    """JobTrainer, made on call: it subclasses transformers.Trainer, which is imported only here, inside
    a job that runs this engine, so this module imports without transformers (and without its seconds
    of import time). A test subclasses JobTrainer by patching this function."""
    from transformers import Trainer

    class JobTrainer(Trainer):
        """The Trainer, fed by jobgen's loaders and scored by jobgen's Scores."""

        # The Trainer types these Optional; in this job they are set where the methods below use them:
        # the model and the tokenizer are passed in, the scheduler is made before a checkpoint is saved
        # or loaded. The model may be accelerate's prepared FSDP2 module (`shard`), hence Any.
        model: Any
        processing_class: PreTrainedTokenizerBase
        lr_scheduler: LambdaLR

        def setup_job(self, spec: Spec, prepared: Prepared, stats: Stats, batches: int) -> None:
            self.spec, self.prepared, self.stats = spec, prepared, stats
            self.clock, self.batches = TrainClock(stats, spec), batches  # batches: this rank's per epoch
            if self.args.world_size > 1:
                self.clock.any_rank = lambda flag: _any_rank(flag, self.args.device)
            self.first_of_epoch = True
            self.window: list[dict[str, Any]] = []
            self.sharded = False
            # The classifiers' forward takes **kwargs, so the Trainer would take their loss for a sum over
            # the labels divided by num_items_in_batch, multiply it by the number of ranks and not divide
            # it by grad_accum: loss and gradients world_size x grad_accum times the other engines'. Their
            # loss is the batch's mean, as in every engine.
            self.model_accepts_loss_kwargs = False

        def create_optimizer(self, model: Any = None) -> Any:
            """training.optim's AdamW and parameter groups, as every engine (under DeepSpeed too: no
            optimizer in its config, so the Trainer asks this)."""
            if self.optimizer is None:
                self.optimizer = build_optimizer(self.model if model is None else model, self.spec.train)
            return self.optimizer

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            """training.optim's schedule, as every engine: the Trainer's own warm-up starts at lr 0, so
            its first step would change nothing."""
            if self.lr_scheduler is None:
                warmup = warmup_steps(num_training_steps, self.spec.train)
                self.lr_scheduler = build_scheduler(optimizer or self.optimizer, num_training_steps, warmup)
                self._created_lr_scheduler = True  # the Trainer makes it anew at a later train(), as its own
            return self.lr_scheduler

        def shard(self, offload: bool) -> None:
            """FSDP2 over this job's ranks, on CPU. The sharded model is prepared the way the Trainer
            prepares a model transformers sharded at load time: accelerate adds autocast (the spec's
            precision) and marks it prepared, so its later `prepare(model, optimizer)` wraps no DDP
            around it; the optimizer, created after this, holds the shards."""
            from training.sharding import data_parallel_mesh, fsdp2_parallelize

            mesh = data_parallel_mesh("cpu", self.args.world_size)
            fsdp2_parallelize(self.model, mesh, offload, self.stats.precision_effective)
            self.model = self.model_wrapped = self.accelerator.prepare_model(
                self.model, device_placement=False, evaluation_mode=True
            )
            self.sharded = True

        # Checkpoints of the sharded model: each rank writes and reads its own shards of the weights and
        # of the optimizer state (the Trainer's own code would save rank 0's shard as the whole).

        def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
            if not self.sharded:
                return super().save_model(output_dir, _internal_call)
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            folder = Path(cast(str, output_dir or self.args.output_dir))  # TrainingArguments defaults it
            dcp.save({"model": get_model_state_dict(self.model)}, checkpoint_id=folder / SHARDED_MODEL)
            if self.args.should_save:
                self.model.config.save_pretrained(folder)
                self.processing_class.save_pretrained(folder)

        def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
            if not self.sharded:
                return super()._save_optimizer_and_scheduler(output_dir)
            import torch
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

            state = get_optimizer_state_dict(self.model, self._torch_optimizer())
            dcp.save({"optimizer": state}, checkpoint_id=Path(output_dir) / SHARDED_OPTIMIZER)
            if self.args.should_save:
                torch.save(self.lr_scheduler.state_dict(), Path(output_dir) / "scheduler.pt")

        def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
            if not self.sharded:
                return super()._load_from_checkpoint(resume_from_checkpoint, model)
            self._load_sharded_model(Path(resume_from_checkpoint))

        def _load_best_model(self) -> None:
            if not self.sharded:
                return super()._load_best_model()
            # The Trainer calls this only when there is a best checkpoint.
            self._load_sharded_model(Path(cast(str, self.state.best_model_checkpoint)))

        def _load_sharded_model(self, folder: Path) -> None:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

            state = {"model": get_model_state_dict(self.model)}
            dcp.load(state, checkpoint_id=folder / SHARDED_MODEL)
            set_model_state_dict(self.model, state["model"])

        def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
            if not self.sharded or checkpoint is None:
                return super()._load_optimizer_and_scheduler(checkpoint)
            import torch
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

            optimizer = self._torch_optimizer()
            # The state to load into must exist first: this initializes it (shaped as this rank's shards).
            state = {"optimizer": get_optimizer_state_dict(self.model, optimizer)}
            dcp.load(state, checkpoint_id=Path(checkpoint) / SHARDED_OPTIMIZER)
            set_optimizer_state_dict(self.model, optimizer, state["optimizer"])
            self.lr_scheduler.load_state_dict(torch.load(Path(checkpoint) / "scheduler.pt", weights_only=True))

        def _torch_optimizer(self) -> Any:
            return getattr(self.optimizer, "optimizer", self.optimizer)  # inside accelerate's wrapper

        def _loader(self, split: str) -> Any:
            loader = make_loader(
                self.prepared.splits[split],
                self.spec,
                self.prepared.tokenizer,
                split == "train",
                self.args.process_index,
                self.args.world_size,
            )
            if split == "train":
                # The Trainer calls set_epoch on the loader it iterates (or on a skipping wrapper's sampler).
                loader.set_epoch = loader.batch_sampler.set_epoch
            return loader

        def get_train_dataloader(self) -> Any:
            return self._loader("train")

        def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
            return self._loader("validation")

        def get_test_dataloader(self, test_dataset: Any = None) -> Any:
            return self._loader("test")

        def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
            # The window opens before the fetch, except for an epoch's first batch (training/timing.py).
            if not self.first_of_epoch:
                self.clock.open()
            batches, items = super().get_batch_samples(epoch_iterator, num_batches, device)
            if self.first_of_epoch:
                self.clock.open()
                self.first_of_epoch = False
            self.window = batches
            return batches, items

        def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> Any:
            if self.sharded:
                # accelerate's no_sync knows no FSDP2 module: under gradient accumulation, reduce-scatter
                # the gradients once, with the window's last micro-batch (the one that steps).
                model.set_requires_gradient_sync(self.accelerator.sync_gradients)
            return super().training_step(model, inputs, num_items_in_batch)

        def compute_loss(
            self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
        ) -> Any:
            return super().compute_loss(model, model_inputs(inputs), return_outputs, num_items_in_batch)

        def evaluate(
            self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval"
        ) -> dict[str, float]:
            split = "validation" if metric_key_prefix == "eval" else metric_key_prefix
            epochs, done = self.spec.train.epochs, self.stats.epochs_validated()
            console.phase("testing" if split != "validation" else f"validating epoch {done + 1}/{epochs}")
            tick = time.perf_counter()
            scores = self.score(split)
            self.stats.times_s["eval"] += time.perf_counter() - tick
            primary = self.stats.primary_metric
            if split == "validation":
                console.say(epoch_line(split, scores, epoch=done, epochs=epochs, primary=primary))
                console.phase("checkpointing")
            else:
                tested = self.stats.tested_epoch
                note = f"weights of epoch {tested + 1}" if tested is not None else ""
                console.say(epoch_line(split, scores, note=note, primary=primary))
            metrics = {f"{metric_key_prefix}_primary": better(primary, scores["metrics"].get(primary))}
            if scores["acc"] is not None:
                metrics[f"{metric_key_prefix}_accuracy"] = scores["acc"]
            if scores["f1"] is not None:
                metrics[f"{metric_key_prefix}_f1"] = scores["f1"]
            if split == "validation":
                self.stats.add_validation(scores)
            else:
                self.stats.add_test(split, scores, self.spec, self.prepared, self.args.process_index)
            self.log(metrics)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
            return metrics

        def score(self, split: str) -> dict[str, Any]:
            """Every sample of the split once over all ranks; padding rows (row < 0) never scored."""
            import torch

            model = self.model_wrapped if self.is_deepspeed_enabled else self.model
            model.eval()
            truth = self.prepared.splits[split]["labels"]
            scores = Scores(self.prepared.problem_type, self.prepared.num_labels, self.args.device, truth)
            with torch.no_grad(), self.autocast_smart_context_manager():
                for batch in self._loader(split):
                    batch = self._prepare_inputs(batch)
                    logits = model(**model_inputs(batch)).logits.float()
                    scores.update(logits, batch["labels"], batch["row"])
            model.train()
            return scores.compute()

    return JobTrainer


def _bookkeeping_class() -> type:
    """Bookkeeping, made on call: it subclasses transformers.TrainerCallback, imported only here, inside
    the job, so that this module imports without transformers (as `_trainer_class`)."""
    from transformers import TrainerCallback

    class Bookkeeping(TrainerCallback):
        """Closes the timing window, writes metrics rows and progress.json, keeps our counters in each
        checkpoint, and on the requeue signal saves a checkpoint and stops (every rank together)."""

        def __init__(self, trainer: Any, watcher: requeue.Watcher | None) -> None:
            self.trainer, self.watcher = trainer, watcher
            spec = trainer.spec
            self.rows = MetricsLog(spec.job_dir / "metrics.csv", trainer.args.process_index == 0)
            self.epoch, self.interrupted = 0, False
            self.tracker: console.Tracker | None = None
            self.logged_step = 0  # the step of the Trainer's previous loss log

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            tr = self.trainer
            self.tracker = console.Tracker(
                tr.stats,
                tr.clock,
                epochs=tr.spec.train.epochs,
                batches=tr.batches,
                steps=state.max_steps,
                world=args.world_size,
            )
            self.logged_step = state.global_step

        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.epoch = int(state.epoch or 0)
            self.trainer.first_of_epoch = True
            if self.tracker is not None:
                done = round((state.epoch - self.epoch) * self.trainer.batches)
                self.tracker.at(self.epoch, done, state.global_step)
                console.training(self.tracker)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            tr, t = self.trainer, self.trainer.spec.train
            first, *rest = tr.window
            tr.clock.close(first, self.epoch)
            for batch in rest:  # accumulated micro-batches: counted, their time is in the first's window
                tr.clock.open()
                tr.clock.close(batch, self.epoch)
            batches = tr.batches
            done = round((state.epoch - self.epoch) * batches)
            self.rows.progress(
                epoch=self.epoch,
                epochs=t.epochs,
                batch=done,
                batches=batches,
                step=state.global_step,
                force=done == batches,
            )
            if self.tracker is not None:
                self.tracker.batch_done(self.epoch, done, state.global_step, None)
            if self.watcher is not None and _any_rank(self.watcher.requested, args.device):
                console.phase("checkpointing for the requeue")
                self.interrupted = control.should_save = control.should_training_stop = True

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.interrupted:  # a half-done epoch is neither validated nor saved again
                control.should_evaluate = control.should_save = False

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any) -> None:
            logs = logs or {}
            epoch = self.epoch
            if "loss" in logs and self.tracker is not None:
                # The Trainer's loss is the mean over the batches since its previous log.
                batches = (state.global_step - self.logged_step) * args.gradient_accumulation_steps
                self.tracker.add_loss(logs["loss"], batches)
                self.logged_step = state.global_step
            if "loss" in logs:
                self.rows.add(
                    epoch=epoch, step=state.global_step, split="train", loss=logs["loss"], lr=logs.get("learning_rate")
                )
            for split in ("eval", "test"):
                if f"{split}_primary" in logs:
                    self.rows.add(
                        epoch=epoch if split == "eval" else self.trainer.stats.epochs_validated(),
                        step=state.global_step,
                        split="validation" if split == "eval" else split,
                        acc=logs.get(f"{split}_accuracy"),
                        f1=logs.get(f"{split}_f1"),
                    )
                    self.rows.flush()

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            # Every rank gets here after the checkpoint is written: sum the counters, then rank 0 marks
            # the checkpoint complete with them (a resume takes only checkpoints carrying this file).
            tr = self.trainer
            tr.clock.flush(lambda values: _reduce_sum(values, args.device))
            if args.process_index == 0:
                folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                atomic_write(folder / STATE_FILE, json.dumps({"stats": tr.stats.state()}) + "\n")
            if self.interrupted:
                raise Interrupted(f"checkpointed at step {state.global_step} for the requeue")

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            tr = self.trainer

            def reduce_sum(values: list[float]) -> list[float]:
                return _reduce_sum(values, args.device)

            tr.clock.flush(reduce_sum)
            tr.stats.parameters = common.parameter_shards(tr.model, args.process_index, args.world_size, reduce_sum)

    return Bookkeeping


class Interrupted(Exception):
    """Raised by every rank once the requeue checkpoint is saved: out of `train` at once, as Paused."""


class Paused(Exception):
    """Raised by every rank of a job that halving paused at a rung (training.halving.goes_on), at the
    start of the epoch after it. Out of `train` at once: the Trainer's end of training would load the
    best checkpoint and, with save_total_limit = 1, delete the rung's checkpoint the job resumes from."""


def _rung_check_class() -> type:
    """RungCheck, made on call (a TrainerCallback, as `_bookkeeping_class`)."""
    from transformers import TrainerCallback

    class RungCheck(TrainerCallback):
        """Successive halving (training/halving.py) at each epoch's start, as the loop of the torch and
        Fabric engines does it: the Trainer has validated and saved the previous epoch by then. A resumed
        job starts at the epoch after its checkpoint, so it passes its rung again there and keeps the
        decision it had."""

        def __init__(self, trainer: Any) -> None:
            self.trainer = trainer

        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            tr = self.trainer
            done = tr.stats.epochs_validated()
            if not halving.goes_on(
                tr.spec, tr.stats, done, args.process_index, lambda values: _reduce_sum(values, args.device)
            ):
                raise Paused(f"paused at rung {done}")

    return RungCheck


def _reduce_sum(values: list[float], device: Any) -> list[float]:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def _any_rank(flag: bool, device: Any) -> bool:
    # The signal may reach one rank (or ranks at different steps): stop together or not at all.
    return _reduce_sum([float(flag)], device)[0] > 0


def resumable_checkpoint(directory: Path) -> Path | None:
    """The newest Trainer checkpoint that carries our counters (written after everything else)."""
    if not directory.is_dir():
        return None
    found = [p for p in directory.glob("checkpoint-*") if (p / STATE_FILE).exists()]
    return max(found, key=lambda p: int(p.name.rsplit("-", 1)[1])) if found else None


def run(spec: Spec, prepared: Prepared, stats: Stats, watcher: requeue.Watcher | None) -> int:
    os.environ.update(ranks.from_slurm())
    # The DDP wrapper the Trainer holds must be gone before its process group: a separate function,
    # whose objects are gone once it returns. training.run then writes the result and tears the group
    # down (common.end_process_group).
    return _fit_and_test(spec, prepared, stats, watcher)


def _deepspeed_only_once_imported() -> None:
    """accelerate's extract_model_from_parallel, which the Trainer calls to unwrap its model (at each
    save and evaluation), imports deepspeed wherever it is installed, to ask whether the model is a
    DeepSpeedEngine: 1.7 s of a rank's start (deepspeed brings mlflow in through its autotuner),
    measured, in a job that does not use it. No object is an instance of a class whose module was never
    imported, so it asks only once deepspeed is."""
    import sys

    from accelerate.utils import other

    installed = other.is_deepspeed_available
    if getattr(installed, "jobgen_asks_once_imported", False):
        return  # an earlier job of this process (tests run several) did it
    asks = lambda: "deepspeed" in sys.modules and installed()  # noqa: E731
    asks.jobgen_asks_once_imported = True  # type: ignore[attr-defined]
    other.is_deepspeed_available = asks


def _fit_and_test(spec: Spec, prepared: Prepared, stats: Stats, watcher: requeue.Watcher | None) -> int:
    import torch

    t = spec.train
    if not t.strategy.startswith("deepspeed"):
        _deepspeed_only_once_imported()
    stats.accelerator = resolve_accelerator(t)
    stats.precision_effective = effective_precision(t.precision, stats.accelerator)
    torch.manual_seed(t.seed)
    model = common.build_model(spec, prepared)
    if stats.precision_effective == "bf16-true":
        model = model.to(torch.bfloat16)
    model = common.maybe_compile(model, spec)
    steps_per_epoch = math.ceil(math.ceil(len(prepared.splits["train"]) / t.batch_size) / t.world_size)
    args = training_arguments(spec, stats, steps_per_epoch, model)
    # The datasets are named for the Trainer's checks; batches come from get_*_dataloader.
    trainer = _trainer_class()(
        model=model,
        args=args,
        processing_class=prepared.tokenizer,
        train_dataset=prepared.splits["train"],
        eval_dataset=prepared.splits["validation"],
    )
    trainer.setup_job(spec, prepared, stats, steps_per_epoch)
    if shards_itself(spec, stats.accelerator):
        trainer.shard(offload=t.strategy == "fsdp_offload")
    book = _bookkeeping_class()(trainer, watcher)
    trainer.add_callback(book)
    trainer.add_callback(_rung_check_class()(trainer))
    # With disable_tqdm the Trainer prints every log as a dict (quoted numbers, its own samples/s over
    # its own window): the progress lines and the result line say what is wanted, windows named.
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    console.set_rank(args.process_index)
    common.record_sizes(stats, prepared)
    stats.world_size = args.world_size
    common.say_rank(args.process_index, args.world_size, ranks.launched_by(), _describe(trainer))
    resume_from = resumable_checkpoint(spec.checkpoint_dir)
    if resume_from is not None:
        stats.restore(json.loads((resume_from / STATE_FILE).read_text())["stats"])
        stats.resumed = True
    try:
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    except (Interrupted, Paused):
        book.interrupted = True  # for a pause, stats.paused_at says so
    stats.interrupted = book.interrupted
    stats.epochs_done = stats.epochs_validated()
    stats.optimizer_steps = trainer.state.global_step
    if not stats.interrupted:
        _test_best(trainer, stats, steps_per_epoch)
        adapter.save(trainer.model, spec.job_dir, args.process_index)  # the weights just tested
    trainer.accelerator.wait_for_everyone()
    return cast(int, args.process_index)  # TrainingArguments.process_index is unannotated


def _test_best(trainer: Any, stats: Stats, steps_per_epoch: int) -> None:
    """load_best_model_at_end has put the best validation epoch's weights back: test those."""
    best = trainer.state.best_global_step
    per_epoch = math.ceil(steps_per_epoch / trainer.args.gradient_accumulation_steps)
    loaded = math.ceil(best / per_epoch) - 1 if best else None
    if loaded is not None and loaded != best_epoch(stats.val_primary()):
        raise RuntimeError(f"the Trainer kept epoch {loaded} as best, but validation says {stats.val_primary()}")
    stats.tested_epoch = best_epoch(stats.val_primary())
    for split in trainer.prepared.test_splits():  # "test" first; evaluate() records each
        trainer.evaluate(metric_key_prefix=split)


def _describe(trainer: Any) -> str:
    if trainer.is_deepspeed_enabled:
        zero = trainer.accelerator.state.deepspeed_plugin.deepspeed_config.get("zero_optimization", {})
        where = {part: zero.get(f"offload_{part}", {}).get("device", "none") for part in ("optimizer", "param")}
        return (
            f"DeepSpeed ZeRO stage {zero.get('stage')}, offload optimizer={where['optimizer']} param={where['param']}"
        )
    if trainer.sharded:
        return "FSDP2 (fully_shard by jobgen: accelerate has no FSDP on CPU)"
    if trainer.is_fsdp_enabled:
        return f"FSDP{getattr(trainer.accelerator.state.fsdp_plugin, 'fsdp_version', 1)} {trainer.args.fsdp}"
    return "DDP" if trainer.args.world_size > 1 else "single process"
