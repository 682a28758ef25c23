"""What the test accuracy means: the best validation epoch's weights, every test row scored once.

Each test re-scores the saved weights in this process, in order, without any engine, and compares
with result.json: a score from one rank's shard, from repeated rows, or from the last epoch's weights
instead of the best one's gives a different number (accuracies are float32: compared to 1e-6, far
below one row in 601).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from tests.training.conftest import run_entrypoint, run_here, subprocess_env, write_spec
from training import data, synthetic
from training.spec import from_dict

pytestmark = [pytest.mark.training, pytest.mark.slow, pytest.mark.timeout(300)]


def rescore(spec_path: Path, state_dict: dict[str, Any], split: str) -> tuple[float, int]:
    """(accuracy, rows) of `state_dict` on `split`, computed here without any engine."""
    import json

    import torch

    from training.loaders import Collator
    from training.model import load_model

    spec = from_dict(json.loads(spec_path.read_text()))
    prepared = data.prepare(spec)
    model = load_model(prepared.model_source, prepared.label_names).eval()
    model.load_state_dict(state_dict)
    rows = prepared.splits[split]
    collate = Collator(prepared.tokenizer, "dynamic", spec.data.max_length)
    right = 0
    with torch.no_grad():
        for start in range(0, len(rows), 50):
            batch = collate([rows[i] for i in range(start, min(start + 50, len(rows)))])
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            right += int((model(**inputs).logits.argmax(-1) == batch["labels"]).sum())
    return right / len(rows), len(rows)


def weights(path: Path) -> dict[str, Any]:
    """Model weights from any engine's checkpoint file (Lightning prefixes them with `model.`)."""
    import torch

    saved = torch.load(path, map_location="cpu", weights_only=False)
    state = saved.get("model") or saved["state_dict"]
    return {k.removeprefix("model."): v for k, v in state.items()}


def _write(path: Path, rows: dict[str, list], flip: bool) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        for text, label in zip(rows["text"], rows["label"], strict=True):
            if flip:
                label = synthetic.LABELS[1 - synthetic.LABELS.index(label)]
            writer.writerow([text, label])


@pytest.mark.parametrize("engine", ["torch", "lightning", "fabric"])
def test_the_best_validation_epoch_is_the_one_tested(engine: str, tmp_path: Path, cache_dir: Path) -> None:
    """Validation labels are flipped, so validation accuracy falls as the model learns and peaks at
    epoch 0; the test split (true labels) must be scored with epoch 0's weights, not the last ones."""
    rows = synthetic.make_rows(1201, seed=11)
    files = {}
    for split, (lo, hi), flip in (
        ("train", (0, 801), False),
        ("validation", (801, 1001), True),
        ("test", (1001, 1201), False),
    ):
        files[split] = str(tmp_path / f"{split}.csv")
        _write(Path(files[split]), {k: v[lo:hi] for k, v in rows.items()}, flip)
    job = tmp_path / "job"
    spec = write_spec(
        job,
        cache_dir,
        train={"engine": engine, "epochs": 3, "lr": 1e-3},
        data={"dataset": "", "files": files, "partition": [], "validation_split": "validation"},
    )
    result = run_here(spec)  # one rank: in this process, the libraries imported once for the three
    val = result["val_acc_per_epoch"]
    assert result["tested_epoch"] == val.index(max(val)) == 0 and val[0] > val[-1], val
    checkpoints = job / "checkpoints"
    best = checkpoints / ("best-epoch=0.ckpt" if engine == "lightning" else "best-model.pt")
    last = checkpoints / "last.ckpt" if engine == "lightning" else next(checkpoints.glob("step-*.ckpt"))
    best_acc, scored = rescore(spec, weights(best), "test")
    last_acc, _ = rescore(spec, weights(last), "test")
    assert best_acc != last_acc, "the two epochs score alike: this test could not tell them apart"
    assert result["test_acc"] == pytest.approx(best_acc, abs=1e-6) and scored == result["scored"]["test"] == 200


@pytest.mark.parametrize("engine", ["fabric", "lightning"])
def test_three_ranks_score_each_test_row_once(engine: str, tmp_path: Path, cache_dir: Path) -> None:
    """601 test rows on 3 ranks, eval batch 64 (201, 200, 200 rows a rank, the last steps padded): the
    accuracy is the split's, which one rank's rows or repeated rows would not give."""
    job = tmp_path / "job"
    spec = write_spec(
        job,
        cache_dir,
        train={"engine": engine, "strategy": "ddp", "devices": 3, "epochs": 1, "batch_size": 16, "eval_batch_size": 64},
        data={"partition": [1201, 301, 601]},
    )
    result = run_entrypoint(spec, subprocess_env(), timeout=280)
    assert result["world_size"] == 3 and result["scored"] == {"validation": 301, "test": 601}
    best = job / "checkpoints" / ("best-epoch=0.ckpt" if engine == "lightning" else "best-model.pt")
    accuracy, rows = rescore(spec, weights(best), "test")
    assert rows == 601 and result["test_acc"] == pytest.approx(accuracy, abs=1e-6)
    # 1201 rows, batch 16: 76 batches, 26 steps on each of 3 ranks, 2 top-up batches of repeats.
    assert result["samples_trained"] == {"total": 1201 + 32, "repeats": 32, "timed": 1201 + 32}
