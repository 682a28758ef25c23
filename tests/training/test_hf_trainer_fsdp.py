"""transformers.Trainer with FSDP on 2 CPU ranks (gloo): the engine shards the model itself with FSDP2.

One uninterrupted run is checked for what FSDP must give (each rank holds about half of the weights,
the run learns, every row is scored once, the shards on disk add up to the tested model) and is then
the reference a requeued run must reproduce: a resume that lost the sharded weights or optimizer
state would train on differently from there.
"""

from __future__ import annotations

import csv
import json
import math
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.training.conftest import TINY_TRAIN, run_entrypoint, spec_dict, start, subprocess_env, write_spec
from tests.training.test_resume import trained_rows
from training.requeue import EXIT_REQUEUE

pytestmark = [pytest.mark.training, pytest.mark.slow, pytest.mark.timeout(240)]

# Sizes that divide by nothing in sight: 101 batches of 16 an epoch, 51 per rank (one top-up batch),
# 26 optimizer steps per rank and epoch with two micro-batches each (the last one alone).
N_TRAIN, N_EVAL, BATCH, ACCUM, EPOCHS = 1601, 601, 16, 2, 2
TRAIN = {
    "engine": "hf_trainer",
    "strategy": "fsdp",
    "devices": 2,
    "precision": "bf16-mixed",
    "epochs": EPOCHS,
    "batch_size": BATCH,
    "eval_batch_size": BATCH,
    "grad_accum": ACCUM,
}
DATA = {"partition": [N_TRAIN, N_EVAL, N_EVAL]}
STEPS = EPOCHS * math.ceil(math.ceil(math.ceil(N_TRAIN / BATCH) / 2) / ACCUM)


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[Path, dict[str, Any]]:
    job = tmp_path_factory.mktemp("straight") / "job"
    result = run_entrypoint(write_spec(job, cache_dir, train=TRAIN, data=DATA), subprocess_env(), timeout=200)
    return job, result


def _rows(job: Path) -> list[dict[str, str]]:
    path = job / "metrics.csv"
    return list(csv.DictReader(path.open())) if path.exists() else []


def test_each_rank_holds_half_learns_and_scores_every_row_once(straight: tuple[Path, dict[str, Any]]) -> None:
    job, result = straight
    assert (result["world_size"], result["engine"], result["strategy"]) == (2, "hf_trainer", "fsdp")
    assert result["precision"] == {"requested": "bf16-mixed", "effective": "bf16-mixed"}
    params = result["parameters"]
    assert sum(params["per_rank"]) == params["total"], params  # DTensor shards: together all, once
    assert all(0.45 * params["total"] < n < 0.55 * params["total"] for n in params["per_rank"]), params
    log = (job / "entrypoint.log").read_text()
    assert log.count("FSDP2 sharded 2 blocks + root over 2 ranks, offload=none") == 2, log[-3000:]
    assert log.count("strategy FSDP2 (fully_shard by jobgen") == 2 and "DDP" not in log
    assert result["scored"] == {"validation": N_EVAL, "test": N_EVAL}
    assert result["test_acc"] >= 0.90 and result["val_acc_per_epoch"][-1] >= 0.90, result
    assert result["optimizer_steps"] == STEPS
    topup = (math.ceil(math.ceil(N_TRAIN / BATCH) / 2) * 2 - math.ceil(N_TRAIN / BATCH)) * BATCH
    assert result["samples_trained"] == {
        "total": EPOCHS * (N_TRAIN + topup),
        "repeats": EPOCHS * topup,
        "timed": EPOCHS * (N_TRAIN + topup),
    }


def test_the_saved_shards_make_up_the_tested_model(
    straight: tuple[Path, dict[str, Any]], cache_dir: Path, tmp_path: Path
) -> None:
    """Both ranks wrote their shards; put together on one process, they score the test split as the
    two ranks did."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from training.data import prepare
    from training.engines.hf_trainer_engine import SHARDED_MODEL
    from training.loaders import make_loader, model_inputs
    from training.metrics import Scores
    from training.spec import from_dict

    job, result = straight
    last = max((job / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
    best = Path(json.loads((last / "trainer_state.json").read_text())["best_model_checkpoint"])
    assert {p.name for p in (best / SHARDED_MODEL).glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}
    dcp_to_torch_save(best / SHARDED_MODEL, tmp_path / "whole.pt")
    weights = torch.load(tmp_path / "whole.pt", weights_only=True)["model"]
    model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(best))
    model.load_state_dict(weights, strict=True)
    assert sum(t.numel() for t in weights.values()) == result["parameters"]["total"]

    spec = from_dict(spec_dict(job, cache_dir, train=TRAIN, data=DATA))
    prepared = prepare(spec)
    scores = Scores(prepared.problem_type, prepared.num_labels)
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for batch in make_loader(prepared.splits["test"], spec, prepared.tokenizer, False):
            scores.update(model(**model_inputs(batch)).logits.float(), batch["labels"], batch["row"])
    whole = scores.compute()
    assert whole["scored"] == N_EVAL
    assert abs(whole["acc"] - result["test_acc"]) <= 2 / N_EVAL, (whole, result["test_acc"])


def test_requeued_run_trains_on_as_the_uninterrupted_one(
    straight: tuple[Path, dict[str, Any]], tmp_path: Path, cache_dir: Path
) -> None:
    """USR2 inside epoch 0, restart: every sample trained once per epoch, and from the checkpoint on
    the same losses and scores as the run never stopped (sharded weights and optimizer state restored)."""
    reference_job, reference = straight
    job, trace = tmp_path / "job", tmp_path / "trace"
    spec = write_spec(job, cache_dir, train=TRAIN, data=DATA, requeue={"enabled": True, "signal": "USR2"})
    env = subprocess_env({"JOBGEN_TRACE_ROWS": str(trace)})
    proc = start(spec, env, job / "first.log")
    deadline = time.monotonic() + 180
    while len(trained_rows(trace).get(0, [])) < 12 * BATCH and proc.poll() is None:
        assert time.monotonic() < deadline, (job / "first.log").read_text()[-3000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(timeout=120) == EXIT_REQUEUE, (job / "first.log").read_text()[-4000:]
    (checkpoint,) = (job / "checkpoints").glob("checkpoint-*")
    stopped_at = int(checkpoint.name.rsplit("-", 1)[1])
    assert 0 < stopped_at < STEPS // EPOCHS, "the signal must land inside epoch 0"

    result = run_entrypoint(spec, env, timeout=180)
    assert result["resumed"] is True and result["optimizer_steps"] == STEPS
    for epoch, rows in trained_rows(trace).items():
        assert sorted(r for r in rows if r >= 0) == list(range(N_TRAIN)), f"epoch {epoch}"
    assert result["scored"] == {"validation": N_EVAL, "test": N_EVAL}
    assert result["val_acc_per_epoch"] == reference["val_acc_per_epoch"]
    assert result["test_acc"] == reference["test_acc"]
    every = TINY_TRAIN["log_every_n_steps"]

    def comparable(rows: list[dict[str, str]]) -> list[dict[str, str]]:
        # A loss row averages the steps since the last one logged in this attempt: the window the
        # signal cut through is averaged over fewer steps after the restart.
        return [
            {k: v for k, v in r.items() if k not in ("samples_per_s", "time_s")}
            for r in rows
            if not (r["split"] == "train" and int(r["step"]) - every < stopped_at < int(r["step"]))
        ]

    assert comparable(_rows(job)) == comparable(_rows(reference_job))
