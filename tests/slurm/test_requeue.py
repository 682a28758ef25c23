"""Requeue on the real cluster: a running training job sent its warning signal checkpoints, is
requeued by Slurm, resumes, and finishes with the configured epochs and `resumed: true`. The signal
comes from `scancel --signal` (as Slurm sends it before the time limit) or from `jobgen requeue`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import (
    PYTHON,
    TINY_TRAIN,
    all_final,
    jobgen,
    manifest,
    only_run,
    signal_after_first_epoch,
    wait_states,
    write_experiment,
)

pytestmark = [pytest.mark.slurm, pytest.mark.training, pytest.mark.timeout(600)]

BODY = """
[slurm]
cpus_per_task = 1
time = "00:20:00"
requeue = true
signal = "USR2"
signal_seconds = 60
""" + TINY_TRAIN.replace("epochs = 1", "epochs = 3").replace("[400, 100, 100]", "[1500, 100, 100]")


def _first_epoch_done(job_dir: Path) -> bool:
    checkpoints = job_dir / "checkpoints"
    metrics = job_dir / "metrics.csv"
    return (checkpoints.is_dir() and any(checkpoints.iterdir())) or (
        metrics.exists() and ",validation," in metrics.read_text()
    )


# `jobgen requeue` of a Fabric job is the 2 x 2 test below.
@pytest.mark.parametrize(("engine", "how"), [("lightning", "scancel")])
def test_signal_checkpoint_requeue_resume(slurm, root: Path, tmp_path: Path, engine: str, how: str):
    exp = write_experiment(
        tmp_path,
        f"requeue_{engine}",
        BODY.replace('model = "builtin:tiny"', f'model = "builtin:tiny"\nengine = "{engine}"'),
    )
    jobgen("submit", str(exp), root=root)
    run_dir = only_run(root, f"requeue_{engine}")
    job = manifest(run_dir)["jobs"][0]
    job_dir = run_dir / job["dir"]
    deadline = time.monotonic() + 300
    while not _first_epoch_done(job_dir):
        assert time.monotonic() < deadline, "the first epoch never ended"
        states = wait_states(run_dir, lambda s: True, timeout=1)
        assert not all_final(states), f"the job ended before the signal: {states}"
        time.sleep(1)
    # Where the running job is, from the progress.json the training keeps up to date.
    table = jobgen("status", str(run_dir), root=root).stdout
    assert re.search(r"RUNNING .* epoch [1-3]/3 \d+%", table), table
    if how == "scancel":
        # What Slurm does before the time limit (--signal=USR2@60), sent now: to the job's steps.
        subprocess.run(["scancel", "--signal=USR2", job["job_id"]], check=True)
    else:
        out = jobgen("requeue", str(run_dir), job["name"], root=root).stdout
        assert "signalled: sent SIGUSR2" in out, out
    states = wait_states(run_dir, all_final, timeout=420, poll=3)
    assert states[job["name"]] is State.COMPLETED, jobgen("logs", str(run_dir), "--err", root=root).stdout
    result = json.loads((job_dir / "result.json").read_text())
    assert result["resumed"] is True and result["requeue_count"] >= 1
    assert result["epochs_done"] == 3 and len(result["val_acc_per_epoch"]) == 3
    out = jobgen("logs", str(run_dir), root=root).stdout
    assert "restarts 0" in out and "restarts 1" in out  # one log, appended across the requeue
    summary = json.loads(jobgen("summary", str(run_dir), "--format", "json", root=root).stdout)["rows"][0]
    assert summary["requeues"] >= 1 and summary["state"] == "COMPLETED"


def test_rank0_requeues_the_job_itself_under_a_users_own_launch(slurm, root: Path, tmp_path: Path):
    """A user's template without jobgen's batch-shell requeue (submitit's case too): on the signal the
    ranks checkpoint and rank 0 runs `scontrol requeue` itself; the requeue ends the step at once, and
    its line saying the checkpoint is complete is out before that. The job resumes and completes."""
    shutil.copy(Path(__file__).parent / "self_requeue.sbatch.j2", tmp_path / "self_requeue.sbatch.j2")
    exp = write_experiment(tmp_path, "selfrq", '[launch]\ntemplate = "self_requeue.sbatch.j2"\n' + BODY)
    jobgen("submit", str(exp), root=root)
    run_dir = only_run(root, "selfrq")
    job = manifest(run_dir)["jobs"][0]
    job_dir = run_dir / job["dir"]
    signal_after_first_epoch(run_dir, job, _first_epoch_done, timeout=300)
    states = wait_states(run_dir, all_final, timeout=420, poll=3)
    err = jobgen("logs", str(run_dir), "--err", root=root).stdout
    assert states[job["name"]] is State.COMPLETED, err
    result = json.loads((job_dir / "result.json").read_text())
    assert result["resumed"] is True and result["requeue_count"] == 1
    assert result["epochs_done"] == 3 and len(result["val_acc_per_epoch"]) == 3
    assert "training: checkpoint complete; asking Slurm to requeue the job" in err, err
    assert "jobgen: the ranks checkpointed and left" not in err + jobgen("logs", str(run_dir), root=root).stdout


def test_two_nodes_two_ranks_requeue_mid_epoch_trains_each_sample_once(slurm, root: Path, tmp_path: Path):
    """2 nodes × 2 ranks: the warning signal reaches every rank, every rank checkpoints, rank 0 requeues
    (the others wait for it, so srun cannot kill it first), the job resumes in the middle of its epoch,
    and over both attempts each training sample is trained once per epoch."""
    from tests.training.test_resume import trained_rows

    trace = tmp_path / "trace"
    n, batch, ranks = 1489, 8, 4  # 187 batches an epoch (the last of 1 row): 47 steps a rank, 1 top-up
    body = (
        BODY.replace("cpus_per_task = 1", "nodes = 2\ngpus_per_node = 2\ncpus_per_task = 1")
        .replace('model = "builtin:tiny"', 'model = "builtin:tiny"\nengine = "fabric"\nstrategy = "ddp"')
        .replace("epochs = 3", "epochs = 2")
        .replace("batch_size = 16", f"batch_size = {batch}")
        .replace("[1500, 100, 100]", f"[{n}, 103, 101]")
        # Each step waits 0.1 s: on an idle machine the 94 steps trained before `jobgen requeue`'s signal
        # arrived (the job then only ended, finished); JOBGEN_STEP_PAUSE_S counts in no time.
        .replace(
            f'python = "{PYTHON}"',
            f'python = "{PYTHON}"\nvars = {{ JOBGEN_TRACE_ROWS = "{trace}", JOBGEN_STEP_PAUSE_S = "0.1" }}',
        )
    )
    exp = write_experiment(tmp_path, "requeue2x2", body)
    jobgen("submit", str(exp), root=root)
    run_dir = only_run(root, "requeue2x2")
    job = manifest(run_dir)["jobs"][0]
    deadline = time.monotonic() + 300
    while len(trained_rows(trace).get(0, [])) < 20 * batch * ranks:
        assert time.monotonic() < deadline, jobgen("logs", str(run_dir), "--err", root=root, check=False).stdout
        time.sleep(0.5)
    # Where the running job is, from the progress.json the training keeps up to date.
    table = jobgen("status", str(run_dir), root=root).stdout
    assert re.search(r"RUNNING .* epoch [12]/2 \d+%", table), table
    out = jobgen("requeue", str(run_dir), job["name"], root=root).stdout
    assert "signalled: sent SIGUSR2" in out, out
    states = wait_states(run_dir, all_final, timeout=480, poll=3)
    logs = jobgen("logs", str(run_dir), root=root).stdout
    assert states[job["name"]] is State.COMPLETED, jobgen("logs", str(run_dir), "--err", root=root).stdout
    result = json.loads((run_dir / job["dir"] / "result.json").read_text())
    assert result["world_size"] == 4 and result["resumed"] is True and result["requeue_count"] == 1
    rows = trained_rows(trace)
    assert len(list(trace.glob("rank*.txt"))) == 4
    for epoch in range(2):
        fresh = sorted(r for r in rows[epoch] if r >= 0)
        assert fresh == list(range(n)), f"epoch {epoch}: {len(fresh)} rows, {len(set(fresh))} distinct"
    assert result["optimizer_steps"] == 2 * 47
    assert result["samples_trained"] == {"total": 2 * (n + batch), "repeats": 2 * batch, "timed": 2 * (n + batch)}
    assert result["scored"] == {"validation": 103, "test": 101}
    err = jobgen("logs", str(run_dir), "--err", root=root).stdout
    assert err.count("checkpointing at the next step") >= 4, err[-3000:]  # every rank got the signal
    assert "restarts 0" in logs and "restarts 1" in logs
    summary = json.loads(jobgen("summary", str(run_dir), "--format", "json", root=root).stdout)["rows"][0]
    assert summary["requeues"] == 1 and summary["state"] == "COMPLETED"
