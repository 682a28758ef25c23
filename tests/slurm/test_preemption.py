"""Preemption and array requeue on the real cluster (tests/cluster/up.sh: partitions `low` and `high`,
PreemptType=preempt/partition_prio, PreemptMode=REQUEUE, GraceTime=30 on low).

- A job in `high` that needs the node preempts a 1 node x 2 ranks training job in `low` mid-epoch:
  Slurm sends every rank SIGTERM (no USR2), the ranks checkpoint, the batch shell requeues the job,
  and it resumes; over all attempts every training sample of each epoch is trained exactly once.
- `jobgen requeue` of the array task that carries the array's own id requeues that task alone: its
  siblings are not restarted (the training used to run `scontrol requeue $SLURM_JOB_ID`, which for
  that task names the whole array).
"""

from __future__ import annotations

import json
import math
import re
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
    restarts,
    wait_states,
    write_experiment,
)
from tests.training.test_resume import trained_rows

pytestmark = [pytest.mark.slurm, pytest.mark.training, pytest.mark.timeout(900)]


def _training(
    engine: str, n: int, batch: int, epochs: int, slurm: str, trace: Path | None = None, pause_s: float = 0
) -> str:
    """`pause_s`: each batch waits that long (JOBGEN_STEP_PAUSE_S), so that the job is still training when
    the test's signal reaches it, however fast this machine trains the tiny model."""
    body = (
        TINY_TRAIN.replace('model = "builtin:tiny"', f'model = "builtin:tiny"\nengine = "{engine}"')
        .replace("epochs = 1", f"epochs = {epochs}")
        .replace("batch_size = 16", f"batch_size = {batch}")
        .replace("[400, 100, 100]", f"[{n}, 103, 101]")
    )
    env = ([f'JOBGEN_TRACE_ROWS = "{trace}"'] if trace else []) + (
        [f'JOBGEN_STEP_PAUSE_S = "{pause_s}"'] if pause_s else []
    )
    if env:
        body = body.replace(f'python = "{PYTHON}"', f'python = "{PYTHON}"\nvars = {{ {", ".join(env)} }}')
    return slurm + body


def _field(job_id: str, name: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True).stdout
    found = re.search(rf"\b{name}=(\S+)", out)
    assert found, out
    return found.group(1)


# Lightning alone: under Slurm its Trainer installs signal handlers of its own (SLURMEnvironment), which
# must leave the preemption's SIGTERM to the training's; the Slurm side (partition_prio preemption,
# SIGTERM to every rank, the batch shell's requeue, the resume) is the same for every engine, and each
# engine's SIGTERM checkpoint and exactly-once resume on two ranks runs in tests/training/test_preemption.py.
@pytest.mark.parametrize("engine", ["lightning"])
def test_preempted_mid_epoch_resumes_and_trains_each_sample_once(slurm, root: Path, tmp_path: Path, engine: str):
    trace = tmp_path / "trace"
    n, batch, epochs = 3001, 8, 2  # 376 batches an epoch (the last of 1 row): 188 steps a rank
    slurm_toml = '[slurm]\npartition = "low"\ngpus_per_node = 2\ncpus_per_task = 1\ntime = "00:20:00"\n'
    slurm_toml += 'requeue = true\nsignal = "USR2"\nsignal_seconds = 60\n'
    body = _training(engine, n, batch, epochs, slurm_toml, trace).replace("[train]", '[train]\nstrategy = "ddp"')
    exp = write_experiment(tmp_path, f"preempt_{engine}", body)
    jobgen("submit", str(exp), root=root)
    run_dir = only_run(root, f"preempt_{engine}")
    job = manifest(run_dir)["jobs"][0]
    job_id = job["job_id"]
    deadline = time.monotonic() + 300
    while len(trained_rows(trace).get(0, [])) < 10 * batch * 2:
        assert time.monotonic() < deadline, jobgen("logs", str(run_dir), "--err", root=root, check=False).stdout
        time.sleep(0.5)
    node = _field(job_id, "NodeList")
    # The whole node, from a higher tier: Slurm must preempt the training job to start it.
    preemptor = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-p",
            "high",
            "-N",
            "1",
            "-w",
            node,
            "--exclusive",
            "-t",
            "2",
            f"--output={tmp_path}/preemptor.out",
            "--wrap",
            "sleep 5",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # The training leaves on its own (checkpoint, then the batch shell's requeue) well within GraceTime.
    deadline = time.monotonic() + 60
    while _field(job_id, "JobState") == "RUNNING":
        assert time.monotonic() < deadline, "the preempted job did not leave within GraceTime"
        time.sleep(0.5)
    first = trained_rows(trace)
    last = max(first)
    assert 0 < len(first[last]) < n, "the preemption must land inside an epoch"

    states = wait_states(run_dir, all_final, timeout=600, poll=3)
    err = jobgen("logs", str(run_dir), "--err", root=root).stdout
    out = jobgen("logs", str(run_dir), root=root).stdout
    assert states[job["name"]] is State.COMPLETED, err[-4000:]
    assert _field(preemptor, "JobState") == "COMPLETED"
    result = json.loads((run_dir / job["dir"] / "result.json").read_text())
    assert result["world_size"] == 2 and result["resumed"] is True and result["requeue_count"] >= 1
    rows = trained_rows(trace)
    for epoch in range(epochs):
        fresh = sorted(r for r in rows[epoch] if r >= 0)
        assert fresh == list(range(n)), f"epoch {epoch}: {len(fresh)} rows, {len(set(fresh))} distinct"
    batches = math.ceil(n / batch)
    repeats = epochs * (2 * math.ceil(batches / 2) - batches) * batch  # the ranks' top-up, if any
    total = epochs * n + repeats
    assert result["samples_trained"] == {"total": total, "repeats": repeats, "timed": total}
    assert result["optimizer_steps"] == epochs * math.ceil(batches / 2)
    assert err.count("got signal 15") >= 2, err[-3000:]  # SIGTERM reached both ranks
    assert "the ranks checkpointed and left" in out and "restarts 0" in out and "restarts 1" in out, out[-3000:]


ARRAY = """
[[sweep.points]]
name = "a"
"train.seed" = 1

[[sweep.points]]
name = "b"
"train.seed" = 2

[[sweep.points]]
name = "c"
"train.seed" = 3
"""


def test_requeue_of_the_task_with_the_arrays_id_leaves_its_siblings_alone(slurm, root: Path, tmp_path: Path):
    slurm_toml = '[slurm]\ncpus_per_task = 1\ntime = "00:20:00"\nrequeue = true\nsignal = "USR2"\n'
    # The plain loop: the array's requeue is the subject, and its three tasks skip Lightning's import.
    # 63 batches an epoch: the requeued task is signalled at its third, long before its end, and the
    # siblings it must leave alone train no longer than that needs.
    # Each batch waits 0.1 s: progress.json is rewritten every 5 s, and on an idle machine the 126 batches
    # trained in 3.4 s, so the signal came after the training's end (it then only ended a finished job).
    exp = write_experiment(tmp_path, "rqarray", _training("torch", 1001, 16, 2, slurm_toml, pause_s=0.1) + ARRAY)
    jobgen("submit", str(exp), "--array", root=root)
    run_dir = only_run(root, "rqarray")
    doc = manifest(run_dir)
    array_id = doc["arrays"][0]["job_id"]
    jobs = {j["name"]: j for j in doc["jobs"]}
    # Every task started (each task split off the array gets an id of its own; the last keeps the array's).
    wait_states(run_dir, lambda s: all(v is State.RUNNING or v.is_final for v in s.values()), timeout=180, poll=1)
    own = {name: _field(j["job_id"], "JobId") for name, j in jobs.items()}
    (carrier,) = [name for name, job_id in own.items() if job_id == array_id]  # SLURM_JOB_ID == array id
    job_dir = run_dir / jobs[carrier]["dir"]
    deadline = time.monotonic() + 300
    while not (job_dir / "progress.json").exists() or json.loads((job_dir / "progress.json").read_text())["batch"] < 3:
        assert time.monotonic() < deadline, jobgen("logs", str(run_dir), carrier, "--err", root=root).stdout
        time.sleep(0.5)
    out = jobgen("requeue", str(run_dir), carrier, root=root).stdout
    assert "signalled: sent SIGUSR2" in out and jobs[carrier]["job_id"] in out, out

    states = wait_states(run_dir, all_final, timeout=600, poll=3)
    assert set(states.values()) == {State.COMPLETED}, states
    for name, job in jobs.items():
        result = json.loads((run_dir / job["dir"] / "result.json").read_text())
        log = jobgen("logs", str(run_dir), name, root=root).stdout
        if name == carrier:
            assert restarts(job["job_id"]) == 1 and result["requeue_count"] == 1 and result["resumed"] is True
            assert f"scontrol requeue {array_id}_{job['array_index']}" in log, log[-2000:]
        else:  # not requeued, not restarted: one attempt from scratch
            assert restarts(job["job_id"]) == 0, name
            assert result["requeue_count"] == 0 and result["resumed"] is False, name
            assert "restarts 0" in log and "restarts 1" not in log, log[-2000:]
    sacct = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-D", "-o", "JobID,State", "-j", array_id],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    requeued = {line.split("|")[0] for line in sacct.splitlines() if "REQUEUED" in line}
    assert requeued == {jobs[carrier]["job_id"]}, sacct
