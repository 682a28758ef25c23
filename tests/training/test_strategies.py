"""Each strategy name as the Lightning and Fabric engines build it, in-process: what the object will do.

The 2-rank runs (test_distributed.py) run every strategy family under every engine for real; the
offload variants differ from their family only in what is built here, so this is where each one is
checked: ZeRO stage and offload targets for DeepSpeed, the offload policy handed to FSDP2's sharding."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.training.conftest import spec_dict
from training.contract import DEEPSPEED_STRATEGIES, FSDP_STRATEGIES
from training.spec import from_dict

pytestmark = pytest.mark.training


def _train(strategy: str, tmp_path: Path, engine: str = "fabric"):
    train = {"engine": engine, "strategy": strategy, "devices": 2}
    return from_dict(spec_dict(tmp_path / "job", tmp_path, train=train)).train


@pytest.mark.parametrize("fabric", [False, True], ids=["lightning", "fabric"])
@pytest.mark.parametrize("strategy", DEEPSPEED_STRATEGIES)
def test_deepspeed_stage_and_offload_targets(strategy: str, fabric: bool, tmp_path: Path) -> None:
    from training.strategies import describe, make_strategy

    built = make_strategy(_train(strategy, tmp_path, "fabric" if fabric else "lightning"), "cpu", fabric)
    stage = 3 if "stage_3" in strategy else 2
    offload = strategy.endswith("_offload")
    optimizer = "cpu" if offload else "none"
    param = "cpu" if offload and stage == 3 else "none"  # ZeRO-2 keeps whole parameters on every rank
    assert describe(built) == f"DeepSpeed ZeRO stage {stage}, offload optimizer={optimizer} param={param}"
    assert built.config["zero_force_ds_cpu_optimizer"] is False  # torch's AdamW, as every engine uses
    assert type(built).__name__.startswith("Cpu")  # the CPU-capable subclass: gloo, no CUDA checks


@pytest.mark.parametrize("strategy", FSDP_STRATEGIES)
def test_fabric_fsdp_hands_the_offload_policy_to_the_sharding(strategy: str, tmp_path: Path) -> None:
    from training.strategies import make_strategy

    built = make_strategy(_train(strategy, tmp_path), "cpu", fabric=True)
    shard = built._parallelize_fn
    assert shard.func.__name__ == "fsdp2_parallelize"
    assert shard.keywords == {"offload": strategy == "fsdp_offload", "precision": "32-true"}


@pytest.mark.parametrize("strategy", FSDP_STRATEGIES)
def test_fsdp2_offload_policy_reaches_every_block(strategy: str, tmp_path: Path) -> None:
    """fsdp2_parallelize on a 1-rank gloo group: the policy each FSDP module got is the one asked for."""
    import os

    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy

    from training import model as model_lib
    from training.sharding import data_parallel_mesh, fsdp2_parallelize

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model_lib.build_tiny(["a good film", "a bad film"] * 20, ["neg", "pos"], tmp_path / "tiny")
        model = model_lib.load_model(str(tmp_path / "tiny"), ["neg", "pos"])
        fsdp2_parallelize(model, data_parallel_mesh("cpu", 1), offload=strategy == "fsdp_offload")
        groups = [m._get_fsdp_state()._fsdp_param_group for m in model.modules() if hasattr(m, "_get_fsdp_state")]
        policies = [group.offload_policy for group in groups if group is not None]
        assert len(policies) >= 2  # the blocks and the root
        assert policies and all(isinstance(p, CPUOffloadPolicy) == (strategy == "fsdp_offload") for p in policies)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("precision", ["32-true", "16-mixed", "bf16-mixed", "bf16-true"])
def test_fsdp2_gathers_and_reduces_in_the_dtype_accelerate_gives_the_hf_trainer(precision: str) -> None:
    """The FSDP2 of Lightning and Fabric (training/sharding.py) casts as accelerate's FSDP2 plugin does
    for the HF Trainer: a like-for-like FSDP comparison across engines."""
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin

    from training.sharding import mixed_precision_policy

    ours = mixed_precision_policy(precision)
    mixed = {"16-mixed": "fp16", "bf16-mixed": "bf16"}.get(precision)
    if mixed is None:  # accelerate sets no policy without mixed precision: FSDP2's default, no cast
        assert (ours.param_dtype, ours.reduce_dtype) == (None, None)
        return
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    plugin.set_mixed_precision(mixed)
    theirs = plugin.mixed_precision_policy
    assert (ours.param_dtype, ours.reduce_dtype) == (theirs.param_dtype, theirs.reduce_dtype)
    assert ours.param_dtype == {"fp16": torch.float16, "bf16": torch.bfloat16}[mixed]


def test_the_mixed_precision_policy_reaches_every_block(tmp_path: Path) -> None:
    import os

    import torch
    import torch.distributed as dist

    from training import model as model_lib
    from training.sharding import data_parallel_mesh, fsdp2_parallelize

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model_lib.build_tiny(["a good film", "a bad film"] * 20, ["neg", "pos"], tmp_path / "tiny")
        model = model_lib.load_model(str(tmp_path / "tiny"), ["neg", "pos"])
        fsdp2_parallelize(model, data_parallel_mesh("cpu", 1), precision="bf16-mixed")
        groups = [m._get_fsdp_state()._fsdp_param_group for m in model.modules() if hasattr(m, "_get_fsdp_state")]
        policies = [group.mp_policy for group in groups if group is not None]
        assert len(policies) >= 2 and all(p.param_dtype == p.reduce_dtype == torch.bfloat16 for p in policies)
    finally:
        dist.destroy_process_group()


def test_one_process_says_who_started_it_not_nonetype(capsys: pytest.CaptureFixture[str]) -> None:
    from training.engines.common import announce

    class Strategy:  # Lightning's SingleDeviceStrategy has no cluster environment
        cluster_environment = None

    announce(0, 1, Strategy())
    line = capsys.readouterr().out
    assert "rank 0/1 via this process; strategy Strategy" in line and "NoneType" not in line, line
