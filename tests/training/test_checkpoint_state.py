"""What a checkpoint of the shared loop holds beyond weights and optimizer: the fp16 loss scaler and the
random generators, restored on resume (torch loop and Fabric alike)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from training import loop
from training.results import Stats

pytestmark = [pytest.mark.training, pytest.mark.timeout(120)]


def _job(rt: Any) -> Any:
    import torch

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return SimpleNamespace(
        rt=rt, model=model, optimizer=optimizer, scheduler=scheduler, progress={"epoch": 1}, stats=Stats()
    )


def _scaler(scale: float) -> Any:
    import torch

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    scaler.scale(torch.ones(1))  # the first step makes the scale
    scaler.update(new_scale=scale)  # as after a few steps with overflows
    return scaler


def _round_trip(save: Any, load: Any, path: Path, scaler: Any, fresh: Any) -> tuple[Any, Any]:
    """Save with `scaler` mid-stream, draw, disturb the generator; load into `fresh`, draw again."""
    import torch

    torch.manual_seed(3)
    torch.rand(7)  # some of the stream used before the checkpoint
    save(path, loop.state_of(_job(SimpleNamespace(scaler=scaler))))
    after_save = torch.rand(5)
    torch.manual_seed(3)  # what a restarted job does: seeds again
    state = loop.state_of(_job(SimpleNamespace(scaler=fresh)))
    load(path, state)
    return after_save, torch.rand(5)


def test_the_torch_loop_checkpoint_holds_the_loss_scale_and_the_generators(tmp_path: Path) -> None:
    import torch

    from training.engines.torch_loop import TorchRuntime

    rt = TorchRuntime(torch.device("cpu"), "32-true")
    fresh = _scaler(2.0**16)
    before, after = _round_trip(rt.save, rt.load, tmp_path / "step.ckpt", _scaler(512.0), fresh)
    assert fresh.get_scale() == 512.0  # not 2**16 again
    assert torch.equal(before, after)  # dropout goes on where it stopped
    saved = torch.load(tmp_path / "step.ckpt", weights_only=False)
    assert set(saved) == {"model", "optimizer", "scheduler", "progress", "stats", "rng", "scaler"}


def test_without_a_scaler_the_checkpoint_has_no_scaler_entry() -> None:
    assert "scaler" not in loop.state_of(_job(SimpleNamespace(scaler=None)))
    assert "rng" in loop.state_of(_job(SimpleNamespace()))


def test_the_fabric_checkpoint_holds_them_too(tmp_path: Path) -> None:
    import torch
    from lightning.fabric import Fabric

    from training.engines.fabric_engine import FabricRuntime

    fabric = Fabric(accelerator="cpu", devices=1, precision="32-true")
    rt = FabricRuntime(fabric)
    assert rt.scaler is None  # 32-true: no loss scaler (16-mixed's lives in fabric.strategy.precision)
    fresh = _scaler(2.0**16)
    before, after = _round_trip(rt.save, rt.load, tmp_path / "step.ckpt", _scaler(256.0), fresh)
    assert fresh.get_scale() == 256.0 and torch.equal(before, after)


def test_fabric_runtime_takes_the_scaler_of_its_precision_plugin() -> None:
    from lightning.fabric.plugins.precision.amp import MixedPrecision

    from training.engines.fabric_engine import FabricRuntime

    scaler = _scaler(1024.0)
    plugin = MixedPrecision("16-mixed", device="cpu", scaler=scaler)
    fabric = SimpleNamespace(global_rank=0, world_size=1, device="cpu", strategy=SimpleNamespace(precision=plugin))
    assert FabricRuntime(fabric).scaler is scaler
