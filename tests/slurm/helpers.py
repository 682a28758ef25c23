"""Helpers for tests on the real test cluster (tests/cluster/up.sh): run jobgen, wait for states."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from jobgen.states import State

REPO = Path(__file__).resolve().parents[2]
JOBGEN = str(Path(sys.executable).parent / "jobgen")
PYTHON = sys.executable


def cluster_dir() -> Path:
    return Path(os.environ.get("JOBGEN_CLUSTER_DIR", "/tmp/jobgen-cluster"))


def jobgen(*args: str, root: Path, check: bool = True, timeout: float = 120, env: dict | None = None):
    """Run the installed `jobgen` command as a user would; a variable of `env` given as None is unset."""
    full = {**os.environ, "JOBGEN_OUTPUT_ROOT": str(root), **(env or {})}
    full_env = {key: value for key, value in full.items() if value is not None}
    done = subprocess.run([JOBGEN, *args], capture_output=True, text=True, timeout=timeout, env=full_env)
    if check and done.returncode != 0:
        raise AssertionError(f"jobgen {' '.join(args)} -> {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


@contextmanager
def on_cluster(env: dict[str, str]) -> Iterator[None]:
    """Point this process (in-process status, and the `jobgen` and Slurm commands it starts) at the
    cluster of `env` (a fixture's client environment) until the block ends: a test that drives two
    clusters at once (their waits overlapping) switches between them."""
    saved = {key: os.environ.get(key) for key in ("SLURM_CONF", "JOBGEN_CLUSTER_DIR")}
    try:
        for key in saved:
            os.environ[key] = env[key]
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def only_run(root: Path, experiment: str) -> Path:
    (run_dir,) = [p for p in (root / experiment).iterdir() if not p.name.startswith(".")]
    return run_dir


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def wait_states(run_dir: Path, wanted, timeout: float, poll: float = 2.0) -> dict[str, State]:
    """Poll jobgen's own status logic until `wanted(states)` holds; fail with the last states."""
    from jobgen.results.state_rule import read_runs

    deadline = time.monotonic() + timeout
    while True:
        (run,) = read_runs([run_dir])
        states = {job.name: job.state for job in run.jobs}
        if wanted(states):
            return states
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s; states: {states}")
        time.sleep(poll)


def controller_job(job_id: str) -> dict[str, str]:
    """What slurmctld says of a job now (`scontrol show job -o`), by field; sacct may lag behind it."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True).stdout
    return dict(word.split("=", 1) for word in out.split() if "=" in word)


def restarts(job_id: str) -> int:
    """How many times Slurm has requeued a job (scontrol's Restarts=)."""
    return int(controller_job(job_id)["Restarts"])


def all_final(states: dict[str, State]) -> bool:
    return all(s.is_final for s in states.values())


def behave_sweep(folder: Path, name: str, seeds: int) -> Path:
    """A sweep of `seeds` cheap jobs that only say hello (tests/slurm/behave.sbatch.j2), no training."""
    values = ", ".join(str(i) for i in range(1, seeds + 1))
    return behave_experiment(
        folder, name, f'[env]\nvars = {{ BEHAVIOR = "ok" }}\n[sweep.grid]\n"train.seed" = [{values}]\n'
    )


def behave_experiment(folder: Path, name: str, sweep: str) -> Path:
    """Cheap jobs that do what their BEHAVIOR says (tests/slurm/behave.sbatch.j2), no training; `sweep`
    is the TOML that tells each job's BEHAVIOR (and anything else it changes)."""
    import shutil

    shutil.copy(Path(__file__).parent / "behave.sbatch.j2", folder / "behave.sbatch.j2")
    head = '[launch]\ntemplate = "behave.sbatch.j2"\n[slurm]\ncpus_per_task = 1\n[data]\ndataset = "imdb"\n'
    return write_experiment(folder, name, head + sweep)


def write_experiment(folder: Path, name: str, body: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(f'[experiment]\nname = "{name}"\n' + body)
    return path


TINY_TRAIN = f"""
[env]
python = "{PYTHON}"

[train]
model = "builtin:tiny"
accelerator = "cpu"
epochs = 1
batch_size = 16
eval_batch_size = 64
lr = 3e-3
num_workers = 0
log_every_n_steps = 5
warmup_compile_steps = 0

[data]
dataset = "builtin:synthetic"
partition = [400, 100, 100]
max_length = 32
"""


def signal_after_first_epoch(run_dir: Path, job: dict, first_epoch_done, timeout: float) -> None:
    """Wait until `first_epoch_done(job_dir)` while the job still runs (the test fails if it ends first),
    then send SIGUSR2 to the job's steps: what Slurm's --signal=USR2@N sends before the time limit."""
    job_dir = run_dir / job["dir"]
    deadline = time.monotonic() + timeout
    while not first_epoch_done(job_dir):
        assert time.monotonic() < deadline, "the first epoch never ended"
        assert not all_final(wait_states(run_dir, lambda s: True, timeout=1)), "the job ended before the signal"
        time.sleep(1)
    subprocess.run(["scancel", "--signal=USR2", job["job_id"]], check=True)
