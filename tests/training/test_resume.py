"""Preemption: USR2 after epoch 1 -> checkpoint + exit; the restart resumes and finishes the same epochs."""

from __future__ import annotations

import csv
import json
import signal
import time
from pathlib import Path

import pytest

from tests.training.conftest import run_entrypoint, start, subprocess_env, write_spec
from training.requeue import EXIT_REQUEUE

pytestmark = [pytest.mark.training, pytest.mark.slow, pytest.mark.timeout(240)]


def _validation_rows(job: Path) -> list[dict]:
    path = job / "metrics.csv"
    if not path.exists():
        return []
    return [r for r in csv.DictReader(path.open()) if r["split"] == "validation"]


@pytest.mark.parametrize("engine", ["torch", "lightning", "fabric"])
def test_signal_checkpoints_then_restart_resumes(engine: str, tmp_path: Path, cache_dir: Path) -> None:
    job = tmp_path / "job"
    spec = write_spec(job, cache_dir, train={"engine": engine, "epochs": 3},
                      data={"partition": [3200, 300, 400]}, requeue={"enabled": True, "signal": "USR2"})
    env = subprocess_env()
    proc = start(spec, env, job / "first.log")
    deadline = time.monotonic() + 180
    while not _validation_rows(job) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR2)  # outside Slurm: checkpoint and exit with the "requeue me" status
    rc = proc.wait(timeout=120)
    assert rc == EXIT_REQUEUE, (job / "first.log").read_text()[-4000:]
    assert not (job / "result.json").exists()
    assert len(_validation_rows(job)) == 1
    assert any("requeue" in p.name or p.name.startswith("step-") for p in (job / "checkpoints").iterdir())

    result = run_entrypoint(spec, env, timeout=180)
    assert result["resumed"] is True
    assert result["epochs_done"] == 3 and len(result["val_acc_per_epoch"]) == 3
    assert len(_validation_rows(job)) == 3  # never a fourth epoch
    assert result["test_acc"] >= 0.90
    assert json.loads(spec.read_text())["requeue"]["enabled"]
