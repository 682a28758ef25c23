"""AdamW with a linear decay schedule and optional linear warm-up, shared by every engine."""

from __future__ import annotations

import math
from typing import Any

from training.spec import TrainSpec

NO_DECAY = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")


def build_optimizer(model: Any, t: TrainSpec) -> Any:
    import torch

    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in params if not n.endswith(NO_DECAY)], "weight_decay": t.weight_decay},
        {"params": [p for n, p in params if n.endswith(NO_DECAY)], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=t.lr)


def total_steps(batches_per_epoch: int, t: TrainSpec) -> int:
    steps = t.epochs * math.ceil(batches_per_epoch / t.grad_accum)
    return min(steps, t.max_steps) if t.max_steps else steps


def warmup_steps(total: int, t: TrainSpec) -> int:
    return t.warmup_steps or int(t.warmup_ratio * total)


def build_scheduler(optimizer: Any, total: int, warmup: int) -> Any:
    """Linear warm-up to lr over `warmup` steps, then linear decay to 0 at `total` (as HF's default)."""
    import torch

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total - step) / max(1, total - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
