"""Each engine, in this process, on the tiny model + synthetic data: it learns, reports, keeps dropout on.

In-process on purpose: Lightning's import (7-9 s) is paid once for all the engines.
"""

from __future__ import annotations

import csv
import json
import socket
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from tests.training.conftest import spec_dict
from training import model as model_lib
from training.run import run
from training.spec import from_dict

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.training, pytest.mark.timeout(240)]


class DropoutWatch:
    """Records, for every dropout call, whether the module was in training mode and grads were on.

    The wrapped `training.model.prepare` (what hands every engine its model) hands the model over in
    eval mode: the engine has to switch it to training mode itself (Lightning alone would keep it in
    eval mode during fit).
    """

    def __init__(self) -> None:
        self.calls: list[tuple[bool, bool]] = []
        self.dtypes: set[str] = set()

    def wrap(self, original: Any) -> Any:
        def load(*args: Any, **kwargs: Any) -> Any:
            import torch

            model = original(*args, **kwargs).eval()
            for module in model.modules():
                if isinstance(module, torch.nn.Dropout):
                    module.register_forward_hook(self.hook)
            return model

        return load

    def hook(self, module: Any, inputs: Any, output: Any) -> None:
        import torch

        self.calls.append((module.training, torch.is_grad_enabled()))
        self.dtypes.add(str(output.dtype).removeprefix("torch."))


@pytest.mark.parametrize(
    ("engine", "precision", "accum"),
    [
        ("torch", "16-mixed", 1),
        ("lightning", "32-true", 2),
        ("fabric", "32-true", 2),
        ("lightning", "bf16-true", 1),
        ("hf_trainer", "16-mixed", 2),
    ],
)
def test_engine_learns_reports_and_trains_with_dropout(
    engine: str, precision: str, accum: int, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watch = DropoutWatch()
    monkeypatch.setattr(model_lib, "prepare", watch.wrap(model_lib.prepare))
    job = tmp_path / engine
    spec = from_dict(spec_dict(job, cache_dir, train={"engine": engine, "precision": precision, "grad_accum": accum}))
    assert run(spec) == 0
    result = json.loads((job / "result.json").read_text())

    assert result["test_acc"] >= 0.90, result
    assert result["test_f1"] is not None and result["test_f1"] >= 0.85
    assert result["epochs_done"] == 2 and len(result["val_acc_per_epoch"]) == 2
    assert result["optimizer_steps"] == 2 * 50 // accum  # 1600 samples / 32 per batch = 50 batches an epoch
    assert result["best_val_acc"] == max(result["val_acc_per_epoch"])
    assert result["engine"] == engine and result["world_size"] == 1 and result["resumed"] is False
    # fp16 autocast does not exist on CPU: the run says what it did instead of pretending.
    expected = "bf16-mixed" if precision == "16-mixed" else precision
    assert result["precision"] == {"requested": precision, "effective": expected}
    # ... and did it: activations are bf16 under bf16 autocast or bf16 weights, float32 otherwise.
    assert ("bfloat16" in watch.dtypes) == expected.startswith("bf16"), watch.dtypes
    assert (watch.dtypes == {"bfloat16"}) == (expected == "bf16-true"), watch.dtypes
    assert result["samples"] == {"train": 1600, "validation": 300, "test": 400}
    assert result["throughput"]["samples_per_s"] > 0 and result["throughput"]["tokens_per_s"] > 0
    assert 0.05 < result["padded_token_fraction"] < 0.6  # dynamic padding of 8-40 word texts
    assert result["times_s"]["train"] > 0 and result["times_s"]["total"] >= result["times_s"]["train"]
    assert result["peak_memory_mb"]["host_rss"] > 100
    ran_on = result["ran_on"]  # what the job ran on, read back from this very environment
    assert f"torch=={metadata.version('torch')}" in ran_on["packages"], ran_on
    assert ran_on["host"] == socket.gethostname() and ran_on["gpus"] == [] and ran_on["nccl"] is None

    progress = json.loads((job / "progress.json").read_text())  # what `jobgen status` shows of a running job
    assert {k: progress[k] for k in ("epoch", "epochs", "batch", "batches")} == {
        "epoch": 1,
        "epochs": 2,
        "batch": 50,
        "batches": 50,
    }
    assert progress["step"] == result["optimizer_steps"]

    rows = list(csv.DictReader((job / "metrics.csv").open()))
    assert {r["split"] for r in rows} == {"train", "validation", "test"}

    training_calls = [mode for mode, grad in watch.calls if grad]
    eval_calls = [mode for mode, grad in watch.calls if not grad]
    assert training_calls and all(training_calls), "dropout was off during fit"
    assert eval_calls and not any(eval_calls), "dropout was on during evaluation"
