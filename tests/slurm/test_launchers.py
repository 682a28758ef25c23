"""torchrun and `accelerate launch` on the real test cluster: 2 nodes x 2 processes (world size 4), one
launcher task per node, for each way an engine finds its ranks under each launcher; and a requeue under
torchrun and accelerate, where the warning signal must reach the ranks through the launcher
(training/relay.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import (
    TINY_TRAIN,
    all_final,
    jobgen,
    manifest,
    only_run,
    signal_after_first_epoch,
    wait_states,
    write_experiment,
)

pytestmark = [pytest.mark.slurm, pytest.mark.training]

# Which engine runs where, one 4-rank job per way of finding the ranks (each is about a minute of both
# CPUs of the test machine, so none runs twice), the launchers' two in the requeue test below:
# - Lightning and Fabric read the launcher's variables through Lightning's cluster environments (the
#   same code for both): Lightning under torchrun, Fabric under accelerate (validation refuses
#   Lightning there: its Trainer ignores accelerate's settings), each across a requeue.
# - torch and the HF Trainer read Slurm's through training/ranks.py (the same code for both): the
#   Trainer under srun here; torch and Lightning under srun run 2 x 2 in tests/slurm/test_jobs.py.
#   Under a launcher they take torchrun's variables as torch's env:// rendezvous does, the same ones
#   Lightning's environment reads; the Trainer's own requeue runs on two ranks in
#   tests/training/test_resume.py, torch's under torchrun and accelerate in tests/training/test_preemption.py.
SWEPT = {"srun": ["hf_trainer"]}
REQUEUED = {"torchrun": "lightning", "accelerate": "fabric"}


def _body(launcher: str, engines: list[str], extra_slurm: str = "", epochs: int = 2) -> str:
    grid = ", ".join(f'"{e}"' for e in engines)
    return f"""
[slurm]
nodes = 2
gpus_per_node = 2
cpus_per_task = 2
time = "00:15:00"
{extra_slurm}
[launch]
launcher = "{launcher}"

[sweep.grid]
"train.engine" = [{grid}]
""" + TINY_TRAIN.replace('model = "builtin:tiny"', 'model = "builtin:tiny"\nstrategy = "ddp"').replace(
        "epochs = 1", f"epochs = {epochs}"
    ).replace("[400, 100, 100]", "[800, 200, 200]")


def _result_fields(result: dict) -> None:
    assert result["world_size"] == 4 and result["nodes"] == 2 and result["devices_per_node"] == 2, result
    assert result["test_acc"] >= 0.9, result
    assert result["scored"] == {"validation": 200, "test": 200}
    assert result["samples_trained"]["total"] == result["epochs_done"] * 800 + result["samples_trained"]["repeats"]
    assert result["throughput"]["samples_per_s"] > 0 and result["times_s"]["train"] > 0
    assert result["tested_epoch"] is not None and result["slurm"]["nodelist"]


def _ranks_from_the_launcher(log: str, launcher: str, job_name: str) -> None:
    # Ranks 0-3 spread over both nodes, numbered by the launcher (not by Slurm's 2 tasks under
    # torchrun and accelerate).
    for rank in range(4):
        assert f"rank {rank}/4 via" in log, log[-3000:]
    assert ("via SLURMEnvironment" in log) == (launcher == "srun" and job_name.endswith(("fabric", "lightning")))


@pytest.mark.timeout(900)
def test_two_nodes_two_processes_each_under_srun(slurm, root: Path, tmp_path: Path):
    launcher = "srun"
    name = f"launch_{launcher}"
    exp = write_experiment(tmp_path, name, _body(launcher, SWEPT[launcher]))
    jobgen("submit", str(exp), root=root)
    run_dir = only_run(root, name)
    states = wait_states(run_dir, all_final, timeout=840, poll=5)
    jobs = manifest(run_dir)["jobs"]
    for job in jobs:
        job_dir = run_dir / job["dir"]
        log = "".join(p.read_text() for p in job_dir.glob("slurm-*.out"))
        assert states[job["name"]] is State.COMPLETED, (
            job["name"],
            log[-3000:],
            "".join(p.read_text() for p in job_dir.glob("slurm-*.err"))[-5000:],
        )
        _result_fields(json.loads((job_dir / "result.json").read_text()))
        _ranks_from_the_launcher(log, launcher, job["name"])
    rows = json.loads(jobgen("summary", str(run_dir), "--format", "json", root=root).stdout)["rows"]
    assert sorted(r["engine"] for r in rows) == sorted(SWEPT[launcher])
    assert all(r["state"] == "COMPLETED" for r in rows)


def _first_epoch_done(job_dir: Path) -> bool:
    metrics = job_dir / "metrics.csv"
    return metrics.exists() and ",validation," in metrics.read_text()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_requeue_resumes_under_a_launcher(slurm, root: Path, tmp_path: Path, launcher: str):
    """Lightning under torchrun, Fabric under accelerate, on 2 nodes x 2 processes (the checks of the
    test above), and Slurm's warning signal (here sent now with scancel, to every process of the job's steps) goes
    through the launcher to the ranks: checkpoint, requeue, resume, the configured epochs and no more.
    (Without training.relay, torchrun dies of SIGUSR2 itself: srun reports "task 0: User defined
    signal 2" and the step fails.)"""
    requeue = 'requeue = true\nsignal = "USR2"\nsignal_seconds = 60\n'
    name = f"requeue_{launcher}"
    exp = write_experiment(tmp_path, name, _body(launcher, [REQUEUED[launcher]], requeue, epochs=3))
    jobgen("submit", str(exp), root=root)
    run_dir = only_run(root, name)
    job = manifest(run_dir)["jobs"][0]
    job_dir = run_dir / job["dir"]
    signal_after_first_epoch(run_dir, job, _first_epoch_done, timeout=600)
    states = wait_states(run_dir, all_final, timeout=600, poll=3)
    out = "".join(p.read_text() for p in job_dir.glob("slurm-*.out"))
    err = "".join(p.read_text() for p in job_dir.glob("slurm-*.err"))
    assert states[job["name"]] is State.COMPLETED, err[-5000:]
    assert "training.relay: signal" in err, err[-3000:]
    assert "checkpointing at the next step" in err
    result = json.loads((job_dir / "result.json").read_text())
    _result_fields(result)
    _ranks_from_the_launcher(out, launcher, job["name"])
    assert result["resumed"] is True and result["requeue_count"] >= 1
    assert result["epochs_done"] == 3 and len(result["val_acc_per_epoch"]) == 3
    assert "restarts 0" in out and "restarts 1" in out
