"""Real training jobs on the real test cluster: multi-node DDP through sbatch and submitit, sharing a
node without port collisions, queueing, a failing job's traceback, and the summary at the end."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import TINY_TRAIN, all_final, jobgen, manifest, only_run, wait_states, write_experiment
from tests.support.golden import experiments

pytestmark = [pytest.mark.slurm, pytest.mark.training]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("experiment", experiments(), ids=[p.stem for p in experiments()])
def test_shipped_experiments_are_accepted_by_sbatch(slurm, root: Path, experiment: Path):
    out = jobgen("submit", str(experiment), "--test-only", "--backend", "sbatch", root=root).stdout
    run_dir = only_run(root, json.loads(json.dumps(experiment.stem)))
    jobs = manifest(run_dir)["jobs"]
    assert manifest(run_dir)["dry_run"] and not any(j["job_id"] for j in jobs)
    answers = out.split("sbatch --test-only:\n", 1)[1].splitlines()
    for job in jobs:
        line = next(line for line in answers if line.startswith(f"  {job['name']}: "))
        assert "accepted" in line and "to start at" in line, out
    assert f"accepts all {len(jobs)}" in out
    # Nothing was queued: --test-only only asks.
    queued = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, check=True).stdout
    assert experiment.stem not in queued


@pytest.mark.timeout(60)
def test_test_only_names_what_slurm_refuses(slurm, root: Path):
    experiment = experiments()[0]
    done = jobgen(
        "submit",
        str(experiment),
        "--test-only",
        "--backend",
        "sbatch",
        "--set",
        "slurm.partition=nope",
        root=root,
        check=False,
    )
    assert done.returncode == 1 and "REFUSED" in done.stdout
    error = done.stderr.strip().splitlines()
    assert len(error) == 1 and "sbatch --test-only refused" in error[0] and "invalid partition" in error[0].lower()


TWO_NODES = """
[slurm]
nodes = 2
gpus_per_node = 2
cpus_per_task = 1
time = "00:10:00"
""" + TINY_TRAIN.replace(
    'model = "builtin:tiny"', 'model = "builtin:tiny"\nengine = "lightning"\nstrategy = "ddp"'
).replace("epochs = 1", "epochs = 3").replace("batch_size = 16", "batch_size = 8").replace(
    "[400, 100, 100]", "[1201, 203, 201]"
)


@pytest.mark.timeout(600)
# Lightning's own reading of Slurm's variables (SLURMEnvironment) under sbatch; through submitit, which
# only changes how the job is submitted and where its output goes, the plain loop (no Lightning import
# in four ranks).
@pytest.mark.parametrize(("backend", "engine"), [("sbatch", "lightning"), ("submitit", "torch")])
def test_two_nodes_two_tasks_each(slurm, root: Path, tmp_path: Path, backend: str, engine: str):
    exp = write_experiment(tmp_path, "ddp2x2", TWO_NODES.replace('engine = "lightning"', f'engine = "{engine}"'))
    # Submitted as from a login shell that sets no OMP_NUM_THREADS (the tests set 1 for their own processes).
    out = jobgen("submit", str(exp), "--backend", backend, root=root, env={"OMP_NUM_THREADS": None}).stdout
    assert "submitted as job" in out
    run_dir = only_run(root, "ddp2x2")
    states = wait_states(run_dir, all_final, timeout=540, poll=5)
    job = manifest(run_dir)["jobs"][0]
    assert states[job["name"]] is State.COMPLETED, jobgen("logs", str(run_dir), "--err", root=root, check=False).stdout
    result = json.loads((run_dir / job["dir"] / "result.json").read_text())
    assert result["world_size"] == 4 and result["nodes"] == 2 and result["devices_per_node"] == 2
    assert result["slurm"]["job_id"] == job["job_id"]
    assert result["test_acc"] >= 0.9
    assert result["scored"] == {"validation": 203, "test": 201}  # 4 ranks, each row once
    summary = jobgen("summary", str(run_dir), "--format", "json", root=root).stdout
    rows = json.loads(summary)["rows"]
    assert (
        rows[0]["state"] == "COMPLETED" and abs(rows[0]["test_acc"] - result["test_acc"]) < 1e-6
    )  # JSON keeps 6 decimals
    # Its output, wherever the backend keeps it (sbatch: slurm-<id>.out; submitit: submitit/<id>_<task>_log.out).
    logs = jobgen("logs", str(run_dir), root=root).stdout
    assert f"training: wrote {run_dir / job['dir'] / 'result.json'}" in logs, logs[-2000:]
    # One CPU a task: each rank computes on one thread, though the test cluster binds no task to its
    # CPUs and torch alone would take both of the machine's cores (training.hardware.cpu_threads).
    # A job whose environment says OMP_NUM_THREADS keeps it: every other cluster test's (1).
    ranks = [line for line in logs.splitlines() if re.search(r"training: rank \d/4 via", line)]
    assert len(ranks) == 4 and all(line.endswith("; 1 CPU thread") for line in ranks), ranks
    # The finished job's checkpoints can go; its result stays.
    checkpoints = run_dir / job["dir"] / "checkpoints"
    assert any(checkpoints.iterdir())
    out = jobgen("clean", str(run_dir), "--yes", root=root).stdout
    assert "freed" in out and not checkpoints.exists() and (run_dir / job["dir"] / "result.json").exists()


SHARED_NODE = """
[slurm]
gpus_per_node = 2
cpus_per_task = 1
time = "00:10:00"
extra = { nodelist = "n1" }

[sweep.grid]
"train.seed" = [1, 2, 3]
""" + TINY_TRAIN.replace('model = "builtin:tiny"', 'model = "builtin:tiny"\nstrategy = "ddp"').replace(
    "[400, 100, 100]", "[96, 32, 32]"
)  # real two-rank jobs (their ports are really bound), with little to train


@pytest.mark.timeout(600)
def test_sweep_shares_a_node_and_queues(slurm, root: Path, tmp_path: Path):
    """Three 2-GPU jobs pinned to one 4-GPU node: two run at once (distinct ports), the third waits."""
    exp = write_experiment(tmp_path, "shared", SHARED_NODE)
    jobgen("submit", str(exp), root=root)
    run_dir = only_run(root, "shared")
    seen_waiting = wait_states(
        run_dir, lambda s: sorted(x.value for x in s.values()) == ["PENDING", "RUNNING", "RUNNING"], timeout=120, poll=1
    )
    assert seen_waiting
    states = wait_states(run_dir, all_final, timeout=540, poll=5)
    assert set(states.values()) == {State.COMPLETED}, states
    jobs = manifest(run_dir)["jobs"]
    ports = set()
    for job in jobs:
        log = "".join(p.read_text() for p in (run_dir / job["dir"]).glob("slurm-*.out"))
        port = next(line.split("rendezvous ")[1].split(";")[0] for line in log.splitlines() if "rendezvous" in line)
        ports.add(port)
        result = json.loads((run_dir / job["dir"] / "result.json").read_text())
        assert result["world_size"] == 2 and result["slurm"]["nodelist"] == "n1"
    assert len(ports) == 3, ports
    starts = sorted(j["started_at"] for j in jobs)
    ends = sorted(j["ended_at"] for j in jobs)
    assert starts[1] < ends[0], "the first two jobs did not overlap"
    assert starts[2] >= ends[0], "the third job started before a GPU was free"


FAILING = """
[slurm]
cpus_per_task = 1
time = "00:05:00"
""" + TINY_TRAIN.replace('dataset = "builtin:synthetic"', 'dataset = ""\nfiles = { train = "broken.csv" }').replace(
    "partition = [400, 100, 100]", "partition = [2, 1, 1]"
)


@pytest.mark.timeout(300)
def test_failing_training_shows_failed_and_the_traceback(slurm, root: Path, tmp_path: Path):
    (tmp_path / "broken.csv").write_text("words,label\nhello,0\nbye,1\nhi,0\nyo,1\n")  # no "text" column
    exp = write_experiment(tmp_path, "broken", FAILING)
    jobgen("submit", str(exp), root=root)
    run_dir = only_run(root, "broken")
    states = wait_states(run_dir, all_final, timeout=240, poll=3)
    assert list(states.values()) == [State.FAILED]
    err = jobgen("logs", str(run_dir), "--err", root=root).stdout
    assert "[rank 0]" in err and "text" in err
    summary = jobgen("summary", str(run_dir), "--format", "json", root=root).stdout
    row = json.loads(summary)["rows"][0]
    assert row["state"] == "FAILED" and "KeyError" in row["problem"] and "traceback" in row["hint"]
