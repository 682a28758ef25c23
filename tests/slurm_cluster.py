"""Helpers for tests that use the real Slurm test cluster (tests/cluster/up.sh).

The cluster keeps everything under ``$JOBGEN_CLUSTER_DIR`` (default ``/tmp/jobgen-cluster``):
``env.sh`` holds what clients need (``SLURM_CONF``), ``mode`` says ``accounting`` or
``no-accounting``. Every subprocess here takes a list of arguments and a timeout: a Slurm command
that hangs must fail a test, not stall the suite.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UP = REPO / "tests" / "cluster" / "up.sh"
DOWN = REPO / "tests" / "cluster" / "down.sh"

# Slurm's end states: the job will not run again on its own (REQUEUED, COMPLETING are not here).
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)


class ClusterError(RuntimeError):
    """The test cluster could not be started or did not answer."""


def cluster_dir() -> Path:
    """The cluster's root directory (``$JOBGEN_CLUSTER_DIR`` or ``/tmp/jobgen-cluster``)."""
    return Path(os.environ.get("JOBGEN_CLUSTER_DIR") or "/tmp/jobgen-cluster")


def _read_env_file(path: Path) -> dict[str, str]:
    """Parse the ``export KEY=VALUE`` lines that up.sh writes to env.sh."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, value = words[1].split("=", 1)
            values[key] = value
    return values


def cluster_env() -> dict[str, str]:
    """os.environ plus what clients of the test cluster need (SLURM_CONF, ...).

    Inherited ``SLURM_*`` variables are dropped first: a test suite that itself runs inside a Slurm
    job must not hand that job's ids and limits to the jobs it submits.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env_file = cluster_dir() / "env.sh"
    if not env_file.is_file():
        raise ClusterError(f"{env_file} is missing: start the cluster with {UP}")
    env.update(_read_env_file(env_file))
    return env


def current_mode() -> str | None:
    """``"accounting"``, ``"no-accounting"``, or None when the cluster is not up."""
    try:
        return (cluster_dir() / "mode").read_text().strip() or None
    except FileNotFoundError:
        return None


def cluster_available() -> bool:
    """True when env.sh exists and the controller answers ``scontrol ping``."""
    try:
        env = cluster_env()
        proc = subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True, timeout=15, check=False)
    except (ClusterError, OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and "UP" in proc.stdout


def start_cluster(accounting: bool = True, restart: bool = False, timeout: float = 600) -> str:
    """Run up.sh in the given mode; return its output. Raise ClusterError with the output on failure."""
    args = [str(UP), "--accounting" if accounting else "--no-accounting"]
    if restart:
        args.append("--restart")
    try:
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"{' '.join(args)} did not finish within {timeout:.0f} s") from exc
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise ClusterError(f"{' '.join(args)} failed with exit code {proc.returncode}:\n{output}")
    return output


def ensure_mode(accounting: bool) -> dict[str, str]:
    """Make sure the cluster runs in the requested mode; return cluster_env().

    up.sh runs only when the recorded mode differs or the cluster does not answer. A mode switch
    restarts the cluster: jobs still in it are cancelled and the Slurm state starts empty.
    """
    wanted = "accounting" if accounting else "no-accounting"
    if current_mode() != wanted or not cluster_available():
        start_cluster(accounting=accounting)
    return cluster_env()


def _run(args: list[str], env: dict[str, str] | None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        args,
        env=env if env is not None else cluster_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _scontrol_states(job_id: str, env: dict[str, str]) -> list[str] | None:
    """States of the job (one per array task) from slurmctld, or None once it has forgotten the job."""
    proc = _run(["scontrol", "show", "job", "-o", job_id], env)
    if proc.returncode != 0:
        return None
    return re.findall(r"\bJobState=(\S+)", proc.stdout)


def _sacct_states(job_id: str, env: dict[str, str]) -> list[str]:
    proc = _run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id], env)
    if proc.returncode != 0:
        return []
    # "CANCELLED by 0" -> "CANCELLED"
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _summarize(states: list[str]) -> str:
    for state in states:
        if state != "COMPLETED":
            return state
    return "COMPLETED"


def wait_job(job_id: str | int, timeout: float = 120, env: dict[str, str] | None = None) -> str:
    """Poll until the job (every task of an array) has ended; return its end state.

    For an array, "COMPLETED" when all tasks completed, else the first other end state. Asks
    ``scontrol show job`` and falls back to sacct when slurmctld no longer knows the job. Raises
    TimeoutError naming the last state seen when the job has not ended after ``timeout`` seconds.
    """
    env = env if env is not None else cluster_env()
    job = str(job_id)
    deadline = time.monotonic() + timeout
    last: list[str] = []
    delay = 0.2
    while True:
        states = _scontrol_states(job, env)
        if states is None or not states:
            states = _sacct_states(job, env)
        if states:
            last = states
            if all(s in TERMINAL_STATES for s in states):
                return _summarize(states)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"Slurm job {job} has not ended after {timeout:.0f} s (last state: {last or 'unknown'})")
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)


def submit(args: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None) -> str:
    """``sbatch --parsable ARGS``; return the job id. Raise ClusterError with sbatch's output on failure."""
    proc = subprocess.run(
        ["sbatch", "--parsable", *args],
        env=env if env is not None else cluster_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    job_id = proc.stdout.strip().split(";")[0]
    if proc.returncode != 0 or not job_id.isdigit():
        raise ClusterError(f"sbatch {' '.join(args)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    return job_id


def sbatch_test_only(script_path: str | Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``sbatch --test-only SCRIPT``: Slurm's verdict on the script's requests, nothing submitted.

    Returns (exit code, stdout + stderr); sbatch prints its verdict on stderr.
    """
    proc = _run(["sbatch", "--test-only", str(script_path)], env, timeout=60)
    return proc.returncode, proc.stdout + proc.stderr
