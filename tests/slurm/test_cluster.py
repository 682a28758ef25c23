"""The real Slurm test cluster does what jobgen's jobs rely on (tests/cluster/up.sh).

Every wait is bounded: jobs are polled with wait_job(), never `sbatch --wait`.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import slurm_cluster as cluster

# Each wait below is bounded; this is the backstop (it includes starting the cluster, apt included).
pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

JOB_TIMEOUT_S = 90


def _script(path: Path, body: str, *directives: str) -> Path:
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives), "set -euo pipefail", body, ""]
    path.write_text("\n".join(lines))
    return path


def _run_job(tmp_path: Path, env: dict[str, str], body: str, *directives: str) -> tuple[str, str, str]:
    """Submit a batch script, wait for it; return (job id, end state, its output)."""
    out = tmp_path / "job.out"
    script = _script(tmp_path / "job.sbatch", body, f"--output={out}", "--time=5", *directives)
    job_id = cluster.submit([str(script)], env=env, cwd=tmp_path)
    state = cluster.wait_job(job_id, timeout=JOB_TIMEOUT_S, env=env)
    return job_id, state, out.read_text() if out.exists() else ""


def _sacct(env: dict[str, str], *args: str) -> str:
    return subprocess.run(["sacct", *args], env=env, capture_output=True, text=True, timeout=30, check=True).stdout


def test_two_nodes_two_tasks_each(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # $0 is the master address computed once in the batch shell, as a launcher script would.
    body = """master=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
srun bash -c 'echo "rank=$SLURM_PROCID node=$SLURM_NODEID host=$(hostname) master=$0 \
addr=$(getent hosts "$0" | cut -d" " -f1)"' "$master"
"""
    _, state, out = _run_job(tmp_path, slurm_env, body, "--nodes=2", "--ntasks-per-node=2")
    assert state == "COMPLETED", out
    ranks = re.findall(r"rank=(\d+) node=(\d+) host=(\S+) master=(\S+) addr=(\S*)", out)
    assert sorted(int(r[0]) for r in ranks) == [0, 1, 2, 3], out
    assert {r[1] for r in ranks} == {"0", "1"}, out
    hosts = {r[2] for r in ranks}
    assert len(hosts) == 2 and hosts <= {"n1", "n2", "n3"}, out
    masters = {r[3] for r in ranks}
    assert len(masters) == 1 and masters <= hosts, out
    # The master's name resolves on every node, to one address on the private bridge.
    addrs = {r[4] for r in ranks}
    assert len(addrs) == 1 and re.fullmatch(r"\d+\.\d+\.\d+\.\d+", addrs.pop()), out


def test_four_gpus_per_node(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    body = """srun bash -c 'echo "cvd=$CUDA_VISIBLE_DEVICES on_node=$SLURM_GPUS_ON_NODE"'"""
    _, state, out = _run_job(tmp_path, slurm_env, body, "--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=4")
    assert state == "COMPLETED", out
    assert out.split() == ["cvd=0,1,2,3", "on_node=4"] * 2, out


def test_five_gpus_per_node_refused(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    ok = _script(tmp_path / "ok.sbatch", "true", "--gpus-per-node=4")
    too_many = _script(tmp_path / "too_many.sbatch", "true", "--gpus-per-node=5")
    rc, out = cluster.sbatch_test_only(ok, env=slurm_env)
    assert rc == 0, out
    rc, out = cluster.sbatch_test_only(too_many, env=slurm_env)
    assert rc != 0 and "Requested node configuration is not available" in out, out
    with pytest.raises(cluster.ClusterError, match="node configuration is not available"):
        cluster.submit([str(too_many)], env=slurm_env)


def test_node_limits_and_partitions(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    fits = _script(tmp_path / "fits.sbatch", "true", "--partition=gpu", "--cpus-per-task=64", "--mem=512000")
    rc, out = cluster.sbatch_test_only(fits, env=slurm_env)
    assert rc == 0, out
    too_big = _script(tmp_path / "too_big.sbatch", "true", "--cpus-per-task=65")
    rc, out = cluster.sbatch_test_only(too_big, env=slurm_env)
    assert rc != 0, out


def test_max_array_size_is_small(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    show = subprocess.run(
        ["scontrol", "show", "config"], env=slurm_env, capture_output=True, text=True, timeout=30, check=True
    )
    assert re.search(r"^MaxArraySize\s*=\s*11$", show.stdout, re.M), show.stdout
    rc, out = cluster.sbatch_test_only(_script(tmp_path / "a.sbatch", "true", "--array=0-10"), env=slurm_env)
    assert rc == 0, out
    rc, out = cluster.sbatch_test_only(_script(tmp_path / "b.sbatch", "true", "--array=0-11"), env=slurm_env)
    assert rc != 0 and "array" in out.lower(), out


def test_two_jobs_on_one_node_bind_ports_on_its_address(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # Training ranks listen on the node's address (MASTER_ADDR); the venv's Python runs on the nodes
    # because they share this machine's filesystem. Both jobs run on n3 at once, each on its own port.
    listen = (
        f"{sys.executable} -c 'import socket, sys, time; s = socket.socket(); "
        "s.bind((socket.gethostbyname(socket.gethostname()), int(sys.argv[1]))); s.listen(); "
        'print("bound", s.getsockname(), flush=True); time.sleep(5)\' "$PORT"'
    )
    jobs = []
    for port in (29500, 29501):
        run = tmp_path / str(port)
        run.mkdir()
        script = _script(run / "job.sbatch", f"PORT={port}\nsrun {listen}", f"--output={run}/out", "--nodelist=n3")
        jobs.append((cluster.submit([str(script)], env=slurm_env), run / "out"))
    for job_id, out in jobs:
        assert cluster.wait_job(job_id, timeout=JOB_TIMEOUT_S, env=slurm_env) == "COMPLETED", out.read_text()
    outputs = [out.read_text() for _, out in jobs]
    assert all("bound (" in text for text in outputs), outputs
    shown = [
        subprocess.run(
            ["scontrol", "show", "job", job_id], env=slurm_env, capture_output=True, text=True, timeout=30, check=True
        ).stdout
        for job_id, _ in jobs
    ]
    assert all("NodeList=n3" in text for text in shown), shown
    (start0, end0), (start1, end1) = (re.search(r"StartTime=(\S+) EndTime=(\S+)", t).groups() for t in shown)
    assert start1 < end0 and start0 < end1, shown  # ISO times: they overlapped on n3


def test_sacct_with_accounting(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    job_id, state, out = _run_job(tmp_path, slurm_env, "echo hello from $(hostname)")
    assert state == "COMPLETED", out
    # slurmctld sends the end record and the job's script to slurmdbd asynchronously (the script can
    # come last on a busy machine): give sacct some seconds for both.
    deadline = time.monotonic() + 60
    while True:
        rows = _sacct(slurm_env, "-n", "-P", "-o", "JobID,State,ExitCode", "-j", job_id)
        script = _sacct(slurm_env, "-j", job_id, "--batch-script")
        stored = f"{job_id}.batch|COMPLETED|0:0" in rows and "echo hello from" in script
        if stored or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert f"{job_id}|COMPLETED|0:0" in rows, rows
    assert f"{job_id}.batch|COMPLETED|0:0" in rows, rows
    assert "echo hello from" in script, script
    assert '"job_id"' in _sacct(slurm_env, "-j", job_id, "--json")


def test_sacct_without_accounting(tmp_path: Path, slurm_no_accounting: dict[str, str]) -> None:
    env = slurm_no_accounting
    sacct = subprocess.run(["sacct", "-n", "-X"], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert sacct.returncode != 0 and "accounting storage is disabled" in sacct.stderr.lower(), sacct
    # Jobs still run; their end state is there for scontrol.
    _, state, out = _run_job(tmp_path, env, "hostname")
    assert state == "COMPLETED", out


def test_requeue_from_inside_the_job(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # What a checkpoint-and-requeue handler does: requeue itself the first time, finish the second.
    body = """echo "run restarts=${SLURM_RESTART_COUNT:-0}"
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then
    scontrol requeue "$SLURM_JOB_ID"
    sleep 60
fi
echo finished"""
    out = tmp_path / "requeue.out"
    script = _script(tmp_path / "requeue.sbatch", body, f"--output={out}", "--open-mode=append", "--time=5")
    job_id = cluster.submit([str(script)], env=slurm_env)
    assert cluster.wait_job(job_id, timeout=150, env=slurm_env) == "COMPLETED", out.read_text()
    text = out.read_text()
    assert "run restarts=0" in text and "run restarts=1" in text and "finished" in text, text


@pytest.mark.slow
def test_signal_before_time_limit_reaches_the_steps_then_requeue(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # The requeue path jobgen renders: `--signal=USR2@N` (no "B:") goes to the job's srun steps, where
    # the training's handler checkpoints and rank 0 requeues the job; the batch shell is not signalled.
    # The second run finishes. The handler writes its mark to a file of its own: a line on the step's
    # stdout travels through srun, which the requeue kills, and can be lost on the way.
    marks = tmp_path / "marks"
    step = f"""on_signal() {{ echo "step $SLURM_PROCID got USR2" >> {shlex.quote(str(marks))}; scontrol requeue "$SLURM_JOB_ID"; exit 75; }}
trap on_signal USR2
if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then for _ in $(seq 120); do sleep 1; done; fi"""
    body = f"""trap 'echo "batch shell got USR2"' USR2
echo "run restarts=${{SLURM_RESTART_COUNT:-0}}"
srun bash -c {shlex.quote(step)}
echo finished"""
    out = tmp_path / "signal.out"
    script = _script(
        tmp_path / "signal.sbatch", body, f"--output={out}", "--open-mode=append", "--time=1", "--signal=USR2@50"
    )
    job_id = cluster.submit([str(script)], env=slurm_env)
    assert cluster.wait_job(job_id, timeout=180, env=slurm_env) == "COMPLETED", out.read_text()
    text = out.read_text()
    assert "run restarts=1" in text and "finished" in text, text
    assert marks.exists() and marks.read_text() == "step 0 got USR2\n", text
    assert "batch shell got USR2" not in text, text
