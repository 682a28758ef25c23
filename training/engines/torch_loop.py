"""Plain PyTorch on one device: the reference the other engines are measured against."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from training import loop
from training.data import Prepared
from training.engines import common
from training.hardware import effective_precision, resolve_accelerator
from training.optim import build_optimizer, build_scheduler, total_steps, warmup_steps
from training.requeue import Watcher
from training.results import MetricsLog, Stats
from training.spec import Spec


class TorchRuntime:
    rank, world = 0, 1

    def __init__(self, device: Any, precision: str) -> None:
        import torch

        self.device, self.precision = device, precision
        self.dtype = torch.float16 if precision == "16-mixed" else torch.bfloat16
        self.scaler = torch.amp.GradScaler("cuda") if precision == "16-mixed" else None

    def to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def autocast(self) -> contextlib.AbstractContextManager:
        import torch

        if not self.precision.endswith("-mixed"):
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def no_sync(self, model: Any, enabled: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def backward(self, loss: Any, model: Any) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def optimizer_step(self, optimizer: Any) -> None:
        if self.scaler:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

    def reduce_sum(self, values: list[float]) -> list[float]:
        return list(values)

    def barrier(self) -> None:
        pass

    def save(self, path: Path, state: dict[str, Any]) -> None:
        import torch

        torch.save({k: v.state_dict() if hasattr(v, "state_dict") else v for k, v in state.items()}, path)

    def load(self, path: Path, state: dict[str, Any]) -> None:
        import torch

        saved = torch.load(path, map_location=self.device, weights_only=False)
        for key, obj in state.items():
            if hasattr(obj, "load_state_dict"):
                obj.load_state_dict(saved[key])
            else:
                state[key] = saved[key]


def run(spec: Spec, prepared: Prepared, stats: Stats, watcher: Watcher | None) -> int:
    import torch

    t = spec.train
    torch.manual_seed(t.seed)
    if t.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    stats.accelerator = resolve_accelerator(t)
    stats.precision_effective = effective_precision(t.precision, stats.accelerator)
    device = torch.device("cuda" if stats.accelerator == "gpu" else "cpu")
    model = common.build_model(spec, prepared).to(device)
    if stats.precision_effective == "bf16-true":
        model = model.to(torch.bfloat16)
    model = common.maybe_compile(model, spec)
    loaders = common.loaders(spec, prepared, 0, 1)
    common.record_sizes(stats, prepared)
    optimizer = build_optimizer(model, t)
    total = total_steps(loaders["train"].batch_sampler.num_batches(), t)
    scheduler = build_scheduler(optimizer, total, warmup_steps(total, t))
    job = loop.Job(spec, TorchRuntime(device, stats.precision_effective), model, optimizer, scheduler,
                   loaders, len(prepared.label_names), stats, MetricsLog(spec.job_dir / "metrics.csv", True),
                   watcher)
    loop.fit(job)
    if not stats.interrupted:
        loop.test(job)
    return 0
