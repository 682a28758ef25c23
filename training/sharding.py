"""FSDP2 as jobgen applies it, whichever engine asks: each transformer block sharded, then the root.

Lightning (ModelParallelStrategy) and Fabric call `fsdp2_parallelize` with their device mesh; the
hf_trainer engine calls it on CPU, where accelerate builds no FSDP (training/engines/hf_trainer_engine.py).
No Lightning import here, so the Trainer engine does not pay for one.
"""

from __future__ import annotations

from typing import Any

from training.model import transformer_blocks


def fsdp2_parallelize(model: Any, device_mesh: Any, offload: bool = False) -> Any:
    """FSDP2: shard each transformer block, then the rest of the model (embeddings, head). With
    `offload`, sharded parameters, gradients and optimizer state live in host memory between uses."""
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    mesh = device_mesh["data_parallel"]
    # Pinned host memory speeds up the copies to a GPU; without an accelerator it cannot be had.
    policy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload else OffloadPolicy()
    blocks = transformer_blocks(model)
    for block in blocks:
        fully_shard(block, mesh=mesh, offload_policy=policy)
    fully_shard(model, mesh=mesh, offload_policy=policy)
    where = "cpu" if isinstance(policy, CPUOffloadPolicy) else "none"
    print(f"training: FSDP2 sharded {len(blocks)} blocks + root over {mesh.size()} ranks, offload={where}", flush=True)
    return model


def data_parallel_mesh(device_type: str, world_size: int) -> Any:
    """A one-dimensional mesh over all ranks, named as Lightning's ModelParallelStrategy names it."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (world_size,), mesh_dim_names=("data_parallel",))
