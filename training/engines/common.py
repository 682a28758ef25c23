"""Pieces the engines assemble the same way: the model (optionally compiled) and the data loaders."""

from __future__ import annotations

from typing import Any

from training import model as model_lib
from training.data import Prepared
from training.loaders import make_loader
from training.spec import Spec

SPLITS = ("train", "validation", "test")


def build_model(spec: Spec, prepared: Prepared) -> Any:
    # Looked up through the module so tests can wrap the loader (e.g. to watch dropout during fit).
    return model_lib.load_model(prepared.model_source, prepared.label_names)


def maybe_compile(module: Any, spec: Spec) -> Any:
    if not spec.train.compile:
        return module
    import torch

    return torch.compile(module, mode=spec.train.compile_mode)


def loaders(spec: Spec, prepared: Prepared, rank: int, world: int) -> dict[str, Any]:
    return {
        split: make_loader(prepared.splits[split], spec, prepared.tokenizer, split == "train", rank, world)
        for split in SPLITS
    }


def record_sizes(stats: Any, prepared: Prepared) -> None:
    stats.samples = {split: len(prepared.splits[split]) for split in SPLITS}


def parameter_shards(module: Any, rank: int, world: int, reduce_sum: Any) -> dict[str, Any]:
    """How many parameter elements each rank holds, against the whole model's: FSDP2 (DTensor) and
    ZeRO-3 (ds_tensor) ranks hold a shard, the others a full copy. A collective: every rank calls it."""
    local = total = 0
    for p in module.parameters():
        if hasattr(p, "ds_tensor"):  # DeepSpeed ZeRO-3: this rank's partition of a flattened parameter
            local, total = local + p.ds_tensor.numel(), total + p.ds_numel
        elif hasattr(p, "to_local"):  # FSDP2: a DTensor sharded over the ranks
            local, total = local + p.to_local().numel(), total + p.numel()
        else:
            local, total = local + p.numel(), total + p.numel()
    mine = [0.0] * world
    mine[rank] = float(local)
    return {"total": total, "per_rank": [int(v) for v in reduce_sum(mine)]}


def announce(rank: int, world: int, strategy: Any) -> None:
    """One line per rank in the job log: which rank this is, who said so (Slurm, or our launcher), and
    what the strategy really does (for DeepSpeed: its ZeRO stage and offload targets)."""
    from training.strategies import describe

    environment = type(getattr(strategy, "cluster_environment", None)).__name__
    print(f"training: rank {rank}/{world} via {environment}; strategy {describe(strategy)}", flush=True)


def destroy_process_group() -> None:
    """FSDP2 runs abort (rc 134) at exit when the process group outlives the run."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
