"""Strategy, precision and cluster objects for Lightning's Trainer and Fabric.

Two things here are not stock Lightning:
- FSDP means FSDP2 (`fully_shard` per transformer block, then the whole model, training/sharding.py)
  through ModelParallelStrategy, because FSDP1 refuses CPUs and FSDP2 runs the same code on CPU and GPU.
- DeepSpeed on CPU: Lightning refuses it outright, but DeepSpeed itself runs ZeRO-2/3 with gloo. The
  Cpu* subclasses below skip only the CUDA checks, so the tests exercise the real DeepSpeed path.
"""

from __future__ import annotations

import functools
from typing import Any

from lightning.fabric.strategies import DDPStrategy as FabricDDP
from lightning.fabric.strategies import DeepSpeedStrategy as FabricDeepSpeed
from lightning.fabric.strategies import ModelParallelStrategy as FabricModelParallel
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, ModelParallelStrategy
from lightning.pytorch.strategies.ddp import DDPStrategy as _TrainerDDPBase

from training.contract import STRATEGIES, is_deepspeed
from training.hardware import effective_precision
from training.sharding import fsdp2_parallelize
from training.spec import SpecError, TrainSpec, is_fsdp


def describe(strategy: Any) -> str:
    """What the strategy object will really do, for the job log (e.g. DeepSpeed's ZeRO offload targets)."""
    zero = getattr(strategy, "config", None) or {}
    zero = zero.get("zero_optimization") if isinstance(zero, dict) else None
    if zero:
        where = {part: zero.get(f"offload_{part}", {}).get("device", "none") for part in ("optimizer", "param")}
        return (
            f"DeepSpeed ZeRO stage {zero.get('stage')}, offload optimizer={where['optimizer']} param={where['param']}"
        )
    return type(strategy).__name__


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
    cls = (
        (CpuFabricDeepSpeedStrategy if cpu else FabricDeepSpeed)
        if fabric
        else (CpuDeepSpeedStrategy if cpu else DeepSpeedStrategy)
    )
    strategy = cls(
        stage=stage,
        offload_optimizer=offload,
        offload_parameters=offload and stage == 3,
        process_group_backend="gloo" if cpu else None,
    )
    # We pass torch's AdamW (shared by all engines); DeepSpeed would otherwise insist on its own
    # compiled CPU Adam when offloading.
    assert strategy.config is not None  # built from the arguments above
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
    if is_fsdp(name):
        if fabric:
            shard = functools.partial(
                fsdp2_parallelize,
                offload=name == "fsdp_offload",
                precision=effective_precision(t.precision, accelerator),
            )
            return FabricModelParallel(
                shard, data_parallel_size=t.world_size, tensor_parallel_size=1, process_group_backend=backend
            )
        return ModelParallelStrategy(
            data_parallel_size=t.world_size, tensor_parallel_size=1, process_group_backend=backend
        )
    if is_deepspeed(name):
        return _deepspeed(t, accelerator, fabric)
    raise SpecError(f"train.strategy: {name!r} is not one of {', '.join(STRATEGIES)}")


def cluster_plugins(fabric: bool) -> list[Any]:
    """Where ranks come from. Under torchrun or `accelerate launch` (RANK, LOCAL_RANK, GROUP_RANK, ...)
    TorchElasticEnvironment, checked first: inside a Slurm job SLURMEnvironment would also match and
    read SLURM_PROCID, which there numbers the node's one launcher task, not the rank. Under srun,
    SLURMEnvironment; Lightning's own requeue handler stays off (we have ours)."""
    if fabric:
        from lightning.fabric.plugins.environments import SLURMEnvironment as FabricSLURM
        from lightning.fabric.plugins.environments import TorchElasticEnvironment as FabricElastic

        if FabricElastic.detect():
            return [FabricElastic()]
        return [FabricSLURM()] if FabricSLURM.detect() else []
    from lightning.pytorch.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    if TorchElasticEnvironment.detect():
        return [TorchElasticEnvironment()]
    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []
