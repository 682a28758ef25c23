"""FSDP2 as jobgen applies it, whichever engine asks: each transformer block sharded, then the root.

Lightning (ModelParallelStrategy) and Fabric call `fsdp2_parallelize` with their device mesh; the
hf_trainer engine calls it on CPU, where accelerate builds no FSDP (training/engines/hf_trainer_engine.py).
No Lightning import here, so the Trainer engine does not pay for one.
"""

from __future__ import annotations

from typing import Any

from training import console
from training.contract import COMPUTE_DTYPES
from training.model import transformer_blocks


def mixed_precision_policy(precision: str) -> Any:
    """FSDP2's MixedPrecisionPolicy for the precision a job runs in, as accelerate gives the HF Trainer's
    FSDP2 (FullyShardedDataParallelPlugin.set_mixed_precision): under bf16-mixed and 16-mixed the
    parameters are all-gathered and the gradients reduce-scattered in the compute dtype
    (training.contract.COMPUTE_DTYPES), fp32 stays the sharded master copy. Other precisions: no cast
    (32-true computes in fp32; bf16-true's module is bf16 already)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if not precision.endswith("-mixed"):
        return MixedPrecisionPolicy()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[COMPUTE_DTYPES[precision]]
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)


def fsdp2_parallelize(model: Any, device_mesh: Any, offload: bool = False, precision: str = "32-true") -> Any:
    """FSDP2: shard each transformer block, then the rest of the model (embeddings, head). With
    `offload`, sharded parameters, gradients and optimizer state live in host memory between uses.
    `precision`: the one the job runs in (its effective precision), which sets the mixed precision policy."""
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    mesh = device_mesh["data_parallel"]
    # Pinned host memory speeds up the copies to a GPU; without an accelerator it cannot be had.
    policy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload else OffloadPolicy()
    mp = mixed_precision_policy(precision)
    blocks = transformer_blocks(model)
    for block in blocks:
        fully_shard(block, mesh=mesh, offload_policy=policy, mp_policy=mp)
    fully_shard(model, mesh=mesh, offload_policy=policy, mp_policy=mp)
    where = "cpu" if isinstance(policy, CPUOffloadPolicy) else "none"
    dtype = str(mp.param_dtype or "fp32").removeprefix("torch.")
    console.line(
        f"training: FSDP2 sharded {len(blocks)} blocks + root over {mesh.size()} ranks, offload={where}, "
        f"gather/reduce in {dtype}"
    )
    return model


def data_parallel_mesh(device_type: str, world_size: int) -> Any:
    """A one-dimensional mesh over all ranks, named as Lightning's ModelParallelStrategy names it."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (world_size,), mesh_dim_names=("data_parallel",))
