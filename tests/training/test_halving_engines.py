"""Lightning and the HF Trainer stop at halving rungs as the torch and Fabric loop does, in this process
(one rank): a job outranked at its rung ends paused (EXIT_PAUSED, its pause marker, its checkpoint, no
result), and once a later report promotes it, it resumes from that checkpoint as after a preemption:
the epochs after the rung only, every sample of each once, one result. The torch loop does the same on
two ranks, started by the entrypoint."""

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


# Two entrypoint starts of two ranks each: their imports, not the 2 s of training, take the time (74 s on
# a loaded 2-core machine).
@pytest.mark.timeout(300)
def test_two_ranks_pause_together_and_resume_when_promoted(tmp_path: Path, cache_dir: Path) -> None:
    """Two ranks (gloo, the torch loop, started by the entrypoint): rank 0 reports and decides, both ranks
    follow it, and the job ends paused with EXIT_PAUSED; promoted, it resumes on two ranks for the
    epoch after the rung only: every sample once per epoch over both ranks, 2 x ceil(301 / 64) steps."""
    from tests.training.conftest import start, subprocess_env, wait

    run_dir, job = tmp_path / "run", tmp_path / "run" / "jobs" / "me"
    raw = spec_dict(
        job,
        cache_dir,
        train={"engine": "torch", "devices": 2, "epochs": 2},
        data={"partition": [N, 64, 64], "max_length": 16},
    )
    raw |= {"run_dir": str(run_dir), "halving": {"rungs": [1], "eta": 2, "metric": "accuracy", "mode": "max"}}
    job.mkdir(parents=True)
    (job / "spec.json").write_text(json.dumps(raw))
    base = halving.root(run_dir)
    halving.report(base, 1, "better", 2.0)  # out of reach: 2 at the rung, 1 goes on

    env = subprocess_env()
    assert wait(start(job / "spec.json", env, job / "paused.log"), 140) == halving.EXIT_PAUSED
    log = (job / "paused.log").read_text()
    assert not (job / "result.json").exists(), log[-3000:]
    assert set(halving.read_reports(base, 1)) == {"better", "me"}  # rank 0 alone reported
    assert (job / "checkpoints" / ".paused-local-0").read_text() == "1\n"
    assert len(_validation_rows(job)) == 1

    for worse in ("w1", "w2"):
        halving.report(base, 1, worse, -1.0)
    assert halving.settle(base, 1, halving.Settings.from_record(raw["halving"])) == ["me"]
    assert wait(start(job / "spec.json", env, job / "resumed.log"), 140) == 0, (job / "resumed.log").read_text()[-3000:]
    result = json.loads((job / "result.json").read_text())
    assert result["world_size"] == 2 and result["resumed"] is True and result["epochs_done"] == 2
    assert len(result["val_acc_per_epoch"]) == 2 and len(_validation_rows(job)) == 2
    assert result["samples_trained"]["total"] - result["samples_trained"]["repeats"] == 2 * N
    assert result["optimizer_steps"] == 2 * -(-N // (2 * BATCH))
