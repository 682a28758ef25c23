"""The shared loop on lightning.Fabric: launch, setup, setup_dataloaders, backward. Any strategy."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, cast

from training import loop
from training.contract import PRECISIONS, one_of
from training.data import Prepared
from training.engines import common
from training.hardware import effective_precision, resolve_accelerator
from training.optim import build_optimizer, build_scheduler, total_steps, warmup_steps
from training.requeue import Watcher
from training.results import MetricsLog, Stats
from training.spec import Spec, is_fsdp


class FabricRuntime:
    def __init__(self, fabric: Any) -> None:
        self.fabric = fabric
        self.rank, self.world, self.device = fabric.global_rank, fabric.world_size, fabric.device

    def to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        return cast(dict[str, Any], self.fabric.to_device(batch))

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return cast(contextlib.AbstractContextManager[Any], self.fabric.autocast())

    def no_sync(self, model: Any, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        # Asked only while accumulating: sharded strategies that cannot skip sync never see it otherwise.
        return self.fabric.no_backward_sync(model) if enabled else contextlib.nullcontext()

    def backward(self, loss: Any, model: Any) -> None:
        self.fabric.backward(loss, model=model)

    def optimizer_step(self, optimizer: Any) -> None:
        optimizer.step()

    def reduce_sum(self, values: list[float]) -> list[float]:
        import torch

        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        return cast(list[float], self.fabric.all_reduce(tensor, reduce_op="sum").tolist())

    def barrier(self) -> None:
        self.fabric.barrier()

    def save(self, path: Path, state: dict[str, Any]) -> None:
        self.fabric.save(path, state)

    def load(self, path: Path, state: dict[str, Any]) -> None:
        self.fabric.load(path, state)


def _make_fabric(spec: Spec, stats: Stats) -> Any:
    from lightning.fabric import Fabric

    from training.strategies import cluster_plugins, make_strategy

    t = spec.train
    stats.accelerator = resolve_accelerator(t)
    stats.precision_effective = effective_precision(t.precision, stats.accelerator)
    return Fabric(
        accelerator=stats.accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=make_strategy(t, stats.accelerator, fabric=True),
        precision=one_of(stats.precision_effective, PRECISIONS),
        plugins=cluster_plugins(fabric=True),
    )


def _setup(fabric: Any, spec: Spec, model: Any, batches: int) -> tuple[Any, Any, Any]:
    """FSDP2 shards the module before the optimizer sees its parameters; DeepSpeed wants both at once."""
    t = spec.train
    if is_fsdp(t.strategy):
        model = fabric.setup_module(model)
        raw = build_optimizer(model, t)
        optimizer = fabric.setup_optimizers(raw)
    else:
        raw = build_optimizer(model, t)
        model, optimizer = fabric.setup(model, raw)
    total = total_steps(batches, t)
    return model, optimizer, build_scheduler(raw, total, warmup_steps(total, t))


def run(spec: Spec, prepared: Prepared, stats: Stats, watcher: Watcher | None) -> int:
    fabric = _make_fabric(spec, stats)
    fabric.launch()
    common.announce(fabric.global_rank, fabric.world_size, fabric.strategy)
    # The DDP wrapper (its Reducer) must die before the process group it holds, or the gloo group's
    # destructor can wait forever at exit: a separate function, whose objects are gone once it returns.
    # training.run then writes the result and tears the group down (common.end_process_group).
    _fit_and_test(fabric, spec, prepared, stats, watcher)
    return cast(int, fabric.global_rank)


def _fit_and_test(fabric: Any, spec: Spec, prepared: Prepared, stats: Stats, watcher: Watcher | None) -> None:
    fabric.seed_everything(spec.train.seed, verbose=False)  # not "Seed set to 7" in every job log
    stats.world_size = fabric.world_size
    model = common.maybe_compile(common.build_model(spec, prepared), spec)
    loaders = common.loaders(spec, prepared, fabric.global_rank, fabric.world_size)
    common.record_sizes(stats, prepared)
    model, optimizer, scheduler = _setup(fabric, spec, model, loaders["train"].batch_sampler.num_batches())
    # The loaders are not passed through fabric.setup_dataloaders: its wrapper calls set_epoch with
    # its own count of iterations, which after a requeue is not the epoch being resumed.
    job = loop.Job(
        spec,
        FabricRuntime(fabric),
        model,
        optimizer,
        scheduler,
        loaders,
        prepared,
        stats,
        MetricsLog(spec.job_dir / "metrics.csv", fabric.global_rank == 0),
        watcher,
    )
    loop.fit(job)
    if not stats.interrupted:
        loop.test(job)
