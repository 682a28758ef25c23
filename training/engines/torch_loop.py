"""Plain PyTorch: the reference the other engines are measured against. One device, or DDP over the
ranks a launcher started (torchrun, `accelerate launch`, srun: training/ranks.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from training import loop, ranks
from training.data import Prepared
from training.engines import common
from training.hardware import cuda_index, effective_precision, resolve_accelerator
from training.optim import build_optimizer, build_scheduler, total_steps, warmup_steps
from training.requeue import Watcher
from training.results import MetricsLog, Stats
from training.spec import Spec


class TorchRuntime:
    def __init__(self, device: Any, precision: str, rank: int = 0, world: int = 1) -> None:
        import torch

        self.device, self.precision, self.rank, self.world = device, precision, rank, world
        self.dtype = torch.float16 if precision == "16-mixed" else torch.bfloat16
        self.scaler = torch.amp.GradScaler("cuda") if precision == "16-mixed" else None

    def to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        import torch

        if not self.precision.endswith("-mixed"):
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def no_sync(self, model: Any, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        # While accumulating, DDP need not all-reduce gradients that the next batch adds to.
        return model.no_sync() if enabled and self.world > 1 else contextlib.nullcontext()

    def backward(self, loss: Any, model: Any) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def optimizer_step(self, optimizer: Any) -> None:
        if self.scaler:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

    def reduce_sum(self, values: list[float]) -> list[float]:
        if self.world == 1:
            return list(values)
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def save(self, path: Path, state: dict[str, Any]) -> None:
        """Rank 0 writes (DDP keeps every rank's copy equal); the model without its DDP wrapper."""
        import torch

        if self.rank == 0:
            torch.save({k: _bare(v).state_dict() if hasattr(v, "state_dict") else v for k, v in state.items()}, path)

    def load(self, path: Path, state: dict[str, Any]) -> None:
        import torch

        saved = torch.load(path, map_location=self.device, weights_only=False)
        for key, obj in state.items():
            obj = _bare(obj)
            if hasattr(obj, "load_state_dict"):
                obj.load_state_dict(saved[key])
            else:
                state[key] = saved[key]


def _bare(obj: Any) -> Any:
    from torch.nn.parallel import DistributedDataParallel

    return obj.module if isinstance(obj, DistributedDataParallel) else obj


def _start_ranks(t: Any, accelerator: str) -> tuple[int, int, Any]:
    """(rank, world, device): one process, or this rank of the process group a launcher set up."""
    import os

    import torch

    if t.world_size == 1:
        return 0, 1, torch.device("cuda" if accelerator == "gpu" else "cpu")
    import torch.distributed as dist

    os.environ.update(ranks.from_slurm())
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    if world != t.world_size:
        raise RuntimeError(
            f"the launcher started {world} ranks but the spec asks for {t.world_size} "
            f"(num_nodes {t.num_nodes} x devices {t.devices})"
        )
    gpu = accelerator == "gpu"
    device = torch.device("cuda", cuda_index(local, torch.cuda.device_count())) if gpu else torch.device("cpu")
    if accelerator == "gpu":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if accelerator == "gpu" else "gloo")
    common.say_rank(rank, world, ranks.launched_by(), "DDP")
    return rank, world, device


def run(spec: Spec, prepared: Prepared, stats: Stats, watcher: Watcher | None) -> int:
    import torch

    t = spec.train
    torch.manual_seed(t.seed)
    stats.accelerator = resolve_accelerator(t)
    stats.precision_effective = effective_precision(t.precision, stats.accelerator)
    rank, world, device = _start_ranks(t, stats.accelerator)
    # A separate function: its model (the DDP wrapper, which holds the process group) is gone once it
    # returns; training.run then writes the result and tears the group down (common.end_process_group).
    return _fit_and_test(spec, prepared, stats, watcher, rank, world, device)


def _fit_and_test(
    spec: Spec, prepared: Prepared, stats: Stats, watcher: Watcher | None, rank: int, world: int, device: Any
) -> int:
    import torch

    t = spec.train
    stats.world_size = world
    model = common.build_model(spec, prepared).to(device)
    if stats.precision_effective == "bf16-true":
        model = model.to(torch.bfloat16)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    model = common.maybe_compile(model, spec)
    loaders = common.loaders(spec, prepared, rank, world)
    common.record_sizes(stats, prepared)
    optimizer = build_optimizer(_bare(model), t)
    total = total_steps(loaders["train"].batch_sampler.num_batches(), t)
    scheduler = build_scheduler(optimizer, total, warmup_steps(total, t))
    job = loop.Job(
        spec,
        TorchRuntime(device, stats.precision_effective, rank, world),
        model,
        optimizer,
        scheduler,
        loaders,
        prepared,
        stats,
        MetricsLog(spec.job_dir / "metrics.csv", rank == 0),
        watcher,
    )
    loop.fit(job)
    if not stats.interrupted:
        loop.test(job)
    return rank
