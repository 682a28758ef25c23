"""Lightning and the HF Trainer stop at halving rungs as the torch and Fabric loop does, in this process
(one rank): a job outranked at its rung ends paused (EXIT_PAUSED, its pause marker, its checkpoint, no
result), and once a later report promotes it, it resumes from that checkpoint as after a preemption:
the epochs after the rung only, every sample of each once, one result."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.training.conftest import spec_dict
from training import halving
from training.run import run
from training.spec import from_dict

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.training, pytest.mark.timeout(120)]

N, BATCH = 301, 32  # 10 batches an epoch, the last one short


def _validation_rows(job: Path) -> list[dict[str, str]]:
    return [r for r in csv.DictReader((job / "metrics.csv").open()) if r["split"] == "validation"]


@pytest.mark.parametrize("engine", ["lightning", "hf_trainer"])
def test_engine_pauses_at_its_rung_and_resumes_when_promoted(engine: str, tmp_path: Path, cache_dir: Path) -> None:
    run_dir, job = tmp_path / "run", tmp_path / "run" / "jobs" / "me"
    raw = spec_dict(job, cache_dir, train={"engine": engine, "epochs": 2}, data={"partition": [N, 100, 100]})
    # The metric the rung compares is the one named (MCC), not the accuracy; eta 2.
    raw |= {"run_dir": str(run_dir), "halving": {"rungs": [1], "eta": 2, "metric": "mcc", "mode": "max"}}
    spec = from_dict(raw)
    base = halving.root(run_dir)
    halving.report(base, 1, "better", 2.0)  # out of reach: with this job's report, 2 at the rung, 1 goes on

    with pytest.raises(SystemExit) as paused:
        run(spec)
    assert paused.value.code == halving.EXIT_PAUSED
    assert not (job / "result.json").exists()
    assert halving.promoted(base, 1) == {"better"}
    mine = halving.read_reports(base, 1)["me"]
    assert mine["name"] == "mcc" and -1 <= mine["metric"] <= 1
    assert (job / "checkpoints" / ".paused-local-0").read_text() == "1\n"
    assert len(_validation_rows(job)) == 1  # it stopped before training the second epoch

    for worse in ("w1", "w2"):  # two later reports below it: 4 at the rung, 2 go on, this job is second
        halving.report(base, 1, worse, -1.0)
    assert halving.settle(base, 1, halving.Settings.from_record(raw["halving"])) == ["me"]

    assert run(spec) == 0
    result = json.loads((job / "result.json").read_text())
    assert result["resumed"] is True and result["epochs_done"] == 2
    assert len(result["val_acc_per_epoch"]) == 2 and len(_validation_rows(job)) == 2  # epoch 2 only, once
    assert result["samples_trained"]["total"] - result["samples_trained"]["repeats"] == 2 * N
    assert result["optimizer_steps"] == 2 * -(-N // BATCH)
    assert halving.read_reports(base, 1)["me"]["metric"] == mine["metric"]  # reported once, kept
