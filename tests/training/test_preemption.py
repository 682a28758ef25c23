"""Preemption by SIGTERM on real local processes, as Slurm delivers it (`PreemptMode=REQUEUE`): to every
process of the job at once (its ranks, their DataLoader workers, a launcher), then SIGKILL after
GraceTime. With requeue on, every rank checkpoints at the next step and exits with the requeue status,
never 0; the restart trains each sample of each epoch exactly once over both attempts. Without
requeue, no engine turns SIGTERM into a clean exit (Lightning's own handler used to: exit 0, no result).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.training.conftest import REPO, run_entrypoint, subprocess_env, write_spec
from tests.training.logcheck import check_two_rank_log
from tests.training.test_resume import saved_stats, trained_rows
from training.requeue import EXIT_REQUEUE

pytestmark = [pytest.mark.training, pytest.mark.slow, pytest.mark.timeout(600)]


# `accelerate launch` through training.relay, as templates/local.sh.j2 and _launch_accelerate.j2 run it.
ACCELERATE = [
    sys.executable,
    "-u",
    "-m",
    "training.relay",
    "--signal=USR2",
    "--",
    sys.executable,
    "-m",
    "accelerate.commands.launch",
    "--multi_gpu",
    "--num_machines=1",
    "--num_processes=2",
    "--mixed_precision=no",
    "--dynamo_backend=no",
    "-m",
    "training",
    "--spec",
]


def start_group(spec: Path, env: dict[str, str], log: Path, launcher: list[str] | None = None) -> subprocess.Popen:
    """The entrypoint in a process group of its own, so that the test can signal all its processes."""
    handle = open(log, "w")  # noqa: SIM115 - closed by the process' end
    return subprocess.Popen(
        [*(launcher or [sys.executable, "-m", "training", "--spec"]), str(spec)],
        cwd=REPO,
        env=env,
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def preempt(proc: subprocess.Popen) -> None:
    """What Slurm does at preemption: SIGCONT and SIGTERM to every process of the job."""
    os.killpg(proc.pid, signal.SIGCONT)
    os.killpg(proc.pid, signal.SIGTERM)


def two_ranks_ran(result: dict, log: str) -> None:
    """What tests/training/test_distributed.py checks of a DDP run on two ranks, for the engines whose
    two-rank DDP run is this one (torch, Lightning, Fabric): two ranks, each with the whole model, each
    saying who it is; progress from rank 0 alone; no backend thread left after the teardown (issue 20)."""
    assert result["world_size"] == 2 and result["devices_per_node"] == 2, result
    params = result["parameters"]
    assert params["per_rank"] == [params["total"]] * 2, params
    check_two_rank_log(log, epochs=2)


@pytest.mark.parametrize(
    ("engine", "devices", "workers", "launcher"),
    # Every engine once: torch, Lightning and Fabric on two ranks (one rank is the same resume with a
    # world of one, and their one-rank USR2 resume runs in test_resume.py), the Trainer on one (its
    # two-rank mid-epoch resume is in test_resume.py); DataLoader workers, which get SIGTERM too,
    # under Lightning and Fabric.
    [
        ("hf_trainer", 1, 1, None),
        ("lightning", 2, 1, None),
        ("fabric", 2, 1, None),
        ("torch", 2, 0, None),  # two ranks under torchrun, started through training.relay
        ("torch", 2, 0, "accelerate"),
    ],
)
def test_sigterm_checkpoints_and_resume_trains_every_sample_once(
    engine: str, devices: int, workers: int, launcher: str | None, tmp_path: Path, cache_dir: Path
) -> None:
    job, trace = tmp_path / "job", tmp_path / "trace"
    n, batch, epochs = 1601, 16, 2  # 101 batches an epoch: on 2 ranks, 51 steps and one top-up batch
    spec = write_spec(
        job,
        cache_dir,
        train={
            "engine": engine,
            "epochs": epochs,
            "batch_size": batch,
            "devices": devices,
            "strategy": "ddp" if devices > 1 else "auto",
            "num_workers": workers,  # workers get SIGTERM too: they must not take their rank down
        },
        data={"partition": [n, 301, 401]},
        requeue={"enabled": True, "signal": "USR2"},
    )
    env = subprocess_env({"JOBGEN_TRACE_ROWS": str(trace)})
    command = ACCELERATE if launcher == "accelerate" else None
    proc = start_group(spec, env, job / "first.log", command)
    deadline = time.monotonic() + 180
    while len(trained_rows(trace).get(0, [])) < 12 * batch and proc.poll() is None:
        assert time.monotonic() < deadline, (job / "first.log").read_text()[-3000:]
        time.sleep(0.02)
    preempt(proc)
    rc = proc.wait(timeout=120)
    log = (job / "first.log").read_text()
    assert rc == EXIT_REQUEUE, f"rc={rc}\n{log[-4000:]}"
    assert "got signal 15" in log and "killed by signal" not in log, log[-4000:]
    assert not (job / "result.json").exists()
    first = trained_rows(trace)
    assert list(first) == [0] and len(first[0]) < n, "the signal must land inside epoch 0"
    saved = saved_stats(job / "checkpoints")
    assert saved["trained_samples"] == len(first[0])  # the checkpoint counts exactly what was trained

    if command:
        resumed = start_group(spec, env, job / "second.log", command)
        assert resumed.wait(timeout=300) == 0, (job / "second.log").read_text()[-4000:]
        result = json.loads((job / "result.json").read_text())
    else:
        result = run_entrypoint(spec, env, timeout=300)
    if devices == 2:
        two_ranks_ran(result, (job / ("second.log" if command else "entrypoint.log")).read_text())
    rows = trained_rows(trace)
    for epoch in range(epochs):
        fresh = sorted(r for r in rows[epoch] if r >= 0)
        assert fresh == list(range(n)), f"epoch {epoch}: {len(fresh)} fresh rows, {len(set(fresh))} distinct"
    batches = math.ceil(n / batch)
    steps = math.ceil(batches / devices)
    topup = steps * devices - batches
    assert result["resumed"] is True and result["epochs_done"] == epochs
    assert result["optimizer_steps"] == epochs * steps
    repeats = sum(1 for epoch in rows.values() for r in epoch if r < 0)
    assert result["samples_trained"]["repeats"] == repeats == epochs * topup * batch
    assert result["samples_trained"]["total"] == epochs * n + repeats == sum(len(v) for v in rows.values())
    assert result["times_s"]["train"] > saved["times_s"]["train"] > 0
    assert result["times_s"]["total"] > saved["times_s"]["total"]
    assert result["scored"] == {"validation": 301, "test": 401}


@pytest.mark.parametrize("engine", ["lightning", "fabric"])
def test_sigterm_without_requeue_never_exits_0(engine: str, tmp_path: Path, cache_dir: Path) -> None:
    """No requeue: SIGTERM ends the job, with a failure status and no result.json (Lightning's own
    SIGTERM handling ends fit with a SystemExit that has no code: that must not become exit 0)."""
    job, trace = tmp_path / "job", tmp_path / "trace"
    spec = write_spec(job, cache_dir, train={"engine": engine, "epochs": 2, "batch_size": 16})
    env = subprocess_env({"JOBGEN_TRACE_ROWS": str(trace)})
    proc = start_group(spec, env, job / "first.log")
    deadline = time.monotonic() + 180
    while len(trained_rows(trace).get(0, [])) < 12 * 16 and proc.poll() is None:
        assert time.monotonic() < deadline, (job / "first.log").read_text()[-3000:]
        time.sleep(0.02)
    preempt(proc)
    rc = proc.wait(timeout=120)
    assert rc not in (0, EXIT_REQUEUE), (job / "first.log").read_text()[-4000:]
    assert rc in (143, -signal.SIGTERM), rc
    assert not (job / "result.json").exists()
    assert not json.loads(spec.read_text())["requeue"]
