"""Which device and which precision a run really gets (no Lightning import: the torch engine uses it)."""

from __future__ import annotations

from training.spec import TrainSpec


def resolve_accelerator(t: TrainSpec) -> str:
    """ "cpu" or "gpu". accelerator="cpu" wins even when Slurm set CUDA_VISIBLE_DEVICES (test switch)."""
    import torch

    if t.accelerator == "cpu":
        return "cpu"
    if t.accelerator == "gpu" and not torch.cuda.is_available():
        raise RuntimeError("train.accelerator='gpu' but torch sees no CUDA device; use 'cpu' to test on CPU")
    return "gpu" if torch.cuda.is_available() else "cpu"


def effective_precision(requested: str, accelerator: str) -> str:
    """fp16 autocast is a GPU feature: on CPU, 16-mixed runs as bf16-mixed and result.json says so."""
    if requested == "16-mixed" and accelerator == "cpu":
        return "bf16-mixed"
    return requested
