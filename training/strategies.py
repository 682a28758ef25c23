"""Strategy, precision and cluster objects for Lightning's Trainer and Fabric.

Two things here are not stock Lightning:
- FSDP means FSDP2 (`fully_shard` per transformer block, then the whole model) through
  ModelParallelStrategy, because FSDP1 refuses CPUs and FSDP2 runs the same code on CPU and GPU.
- DeepSpeed on CPU: Lightning refuses it outright, but DeepSpeed itself runs ZeRO-2/3 with gloo. The
  Cpu* subclasses below skip only the CUDA checks, so the tests exercise the real DeepSpeed path.
"""

from __future__ import annotations

from typing import Any

from lightning.fabric.strategies import DDPStrategy as FabricDDP
from lightning.fabric.strategies import DeepSpeedStrategy as FabricDeepSpeed
from lightning.fabric.strategies import ModelParallelStrategy as FabricModelParallel
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, ModelParallelStrategy
from lightning.pytorch.strategies.ddp import DDPStrategy as _TrainerDDPBase

from training.model import transformer_blocks
from training.spec import TrainSpec


def fsdp2_parallelize(model: Any, device_mesh: Any) -> Any:
    """FSDP2: shard each transformer block, then the rest of the model (embeddings, head)."""
    from torch.distributed.fsdp import fully_shard

    mesh = device_mesh["data_parallel"]
    for block in transformer_blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _indexed_cpu(local_rank: int) -> Any:
    # deepspeed.initialize reads the device index as this rank's device number; a bare "cpu" has None.
    import torch

    return torch.device("cpu", local_rank)


class CpuDeepSpeedStrategy(DeepSpeedStrategy):
    """Trainer DeepSpeed without the CUDA-only checks (gloo on CPU)."""

    @property
    def root_device(self) -> Any:
        return _indexed_cpu(self.local_rank)

    def setup_environment(self) -> None:
        _TrainerDDPBase.setup_environment(self)

    def setup_distributed(self) -> None:
        from lightning.fabric.utilities.seed import reset_seed

        reset_seed()
        self.set_world_ranks()
        self._init_deepspeed_distributed()


class CpuFabricDeepSpeedStrategy(FabricDeepSpeed):
    """Fabric DeepSpeed without the CUDA-only checks (gloo on CPU)."""

    @property
    def root_device(self) -> Any:
        return _indexed_cpu(self.local_rank)

    def setup_environment(self) -> None:
        FabricDDP.setup_environment(self)

    def _setup_distributed(self) -> None:
        from lightning.fabric.utilities.seed import reset_seed

        reset_seed()
        self._set_world_ranks()
        self._init_deepspeed_distributed()
        if not self._config_initialized:
            self._format_config()
            self._config_initialized = True


def _deepspeed(t: TrainSpec, accelerator: str, fabric: bool) -> Any:
    stage = 3 if "stage_3" in t.strategy else 2
    offload = t.strategy.endswith("_offload")
    cpu = accelerator == "cpu"
    cls = (CpuFabricDeepSpeedStrategy if cpu else FabricDeepSpeed) if fabric else (
        CpuDeepSpeedStrategy if cpu else DeepSpeedStrategy)
    strategy = cls(stage=stage, offload_optimizer=offload, offload_parameters=offload and stage == 3,
                   process_group_backend="gloo" if cpu else None)
    # We pass torch's AdamW (shared by all engines); DeepSpeed would otherwise insist on its own
    # compiled CPU Adam when offloading.
    strategy.config["zero_force_ds_cpu_optimizer"] = False
    return strategy


def make_strategy(t: TrainSpec, accelerator: str, fabric: bool) -> Any:
    backend = "gloo" if accelerator == "cpu" else None
    name = t.strategy
    if name == "auto":
        if t.world_size == 1:
            return "auto"
        name = "ddp"
    if name == "ddp":
        return (FabricDDP if fabric else DDPStrategy)(process_group_backend=backend)
    if name == "fsdp":
        if fabric:
            return FabricModelParallel(fsdp2_parallelize, data_parallel_size=t.world_size,
                                       tensor_parallel_size=1, process_group_backend=backend)
        return ModelParallelStrategy(data_parallel_size=t.world_size, tensor_parallel_size=1,
                                     process_group_backend=backend)
    return _deepspeed(t, accelerator, fabric)


def cluster_plugins(fabric: bool) -> list[Any]:
    """Under srun, ranks come from Slurm; Lightning's own requeue handler stays off (we have ours)."""
    if fabric:
        from lightning.fabric.plugins.environments import SLURMEnvironment as FabricSLURM

        return [FabricSLURM()] if FabricSLURM.detect() else []
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []
