"""Helpers for tests that use the real Slurm test clusters (tests/cluster/up.sh).

A cluster keeps everything under its directory (the first one: ``$JOBGEN_CLUSTER_DIR``, default
``/tmp/jobgen-cluster``): ``env.sh`` holds what clients need (``SLURM_CONF``), ``mode`` says
``accounting`` or ``no-accounting``. Every subprocess here takes a list of arguments and a timeout: a
Slurm command that hangs must fail a test, not stall the suite.

Each pytest process (each xdist worker) has clusters of its own, one with accounting and one without,
so that no test waits for another's jobs, switches a cluster's mode or stops a controller under
another test: ``cluster_spec()`` names them after the base name, net and directory this process was
started with (``JOBGEN_CLUSTER_NAME``/``_NET``/``_DIR``, defaults ``jobgen``, ``10.77.77``,
``/tmp/jobgen-cluster``). Worker 0's accounting cluster is the base cluster itself, so a plain
``pytest`` run uses the cluster tests/cluster/up.sh starts by default. ``python -m tests.support.slurm_cluster
up|down --workers N`` starts or stops every cluster of N workers (scripts/test.sh).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
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


# Read once, at import: the fixtures export one cluster's JOBGEN_CLUSTER_DIR into a test's environment,
# and the names must keep deriving from the base this process started with.
BASE_NAME = os.environ.get("JOBGEN_CLUSTER_NAME") or "jobgen"
BASE_NET = os.environ.get("JOBGEN_CLUSTER_NET") or "10.77.77"
BASE_DIR = Path(os.environ.get("JOBGEN_CLUSTER_DIR") or "/tmp/jobgen-cluster")


@dataclass(frozen=True)
class ClusterSpec:
    """One test cluster: what up.sh/down.sh need to find it (its name, /24 and directory) and its mode."""

    name: str
    net: str
    dir: Path
    accounting: bool

    @property
    def mode(self) -> str:
        return "accounting" if self.accounting else "no-accounting"

    def script_env(self) -> dict[str, str]:
        """os.environ plus the variables that point up.sh/down.sh/controller.sh at this cluster."""
        return {
            **os.environ,
            "JOBGEN_CLUSTER_NAME": self.name,
            "JOBGEN_CLUSTER_NET": self.net,
            "JOBGEN_CLUSTER_DIR": str(self.dir),
        }


def worker_index() -> int:
    """This pytest process's xdist worker number (gw3 -> 3); 0 without xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


def cluster_spec(accounting: bool = True, worker: int | None = None) -> ClusterSpec:
    """The cluster of xdist worker ``worker`` (default: this process's) in the given mode.

    Slot 2*worker (+1 without accounting) takes the base net's third octet plus the slot, the base name
    plus a suffix (``w1`` for worker 1's accounting cluster, ``n0`` for worker 0's without) and the base
    directory plus ``-suffix``. Slot 0, worker 0 with accounting, is the base cluster itself.
    """
    index = worker_index() if worker is None else worker
    slot = 2 * index + (0 if accounting else 1)
    suffix = "" if slot == 0 else f"{'w' if accounting else 'n'}{index}"
    if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", BASE_NAME):
        raise ClusterError(
            f"JOBGEN_CLUSTER_NAME must be 1-8 lowercase letters or digits (2 more are added), not {BASE_NAME!r}"
        )
    a, b, c = BASE_NET.split(".")
    if int(c) + slot > 254:
        raise ClusterError(f"no /24 left after {BASE_NET} for test cluster slot {slot}")
    return ClusterSpec(
        name=BASE_NAME + suffix,
        net=f"{a}.{b}.{int(c) + slot}",
        dir=BASE_DIR if slot == 0 else Path(f"{BASE_DIR}-{suffix}"),
        accounting=accounting,
    )


def cluster_dir(spec: ClusterSpec | None = None) -> Path:
    """The cluster's root directory (default: this process's accounting cluster)."""
    return (spec or cluster_spec()).dir


def _read_env_file(path: Path) -> dict[str, str]:
    """Parse the ``export KEY=VALUE`` lines that up.sh writes to env.sh."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, value = words[1].split("=", 1)
            values[key] = value
    return values


def cluster_env(spec: ClusterSpec | None = None) -> dict[str, str]:
    """os.environ plus what clients of the test cluster need (SLURM_CONF, ...); default: this process's
    accounting cluster.

    Inherited ``SLURM_*`` variables are dropped first: a test suite that itself runs inside a Slurm
    job must not hand that job's ids and limits to the jobs it submits.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env_file = cluster_dir(spec) / "env.sh"
    if not env_file.is_file():
        raise ClusterError(f"{env_file} is missing: start the cluster with {UP}")
    env.update(_read_env_file(env_file))
    return env


def current_mode(spec: ClusterSpec | None = None) -> str | None:
    """``"accounting"``, ``"no-accounting"``, or None when the cluster is not up."""
    try:
        return (cluster_dir(spec) / "mode").read_text().strip() or None
    except FileNotFoundError:
        return None


def cluster_available(spec: ClusterSpec | None = None) -> bool:
    """True when env.sh exists and the controller answers ``scontrol ping``."""
    try:
        env = cluster_env(spec)
        proc = subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True, timeout=15, check=False)
    except (ClusterError, OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and "UP" in proc.stdout


def _script(spec: ClusterSpec, args: list[str], timeout: float) -> str:
    """Run a cluster script for `spec`; return its output. Raise ClusterError with it on failure."""
    shown = f"JOBGEN_CLUSTER_NAME={spec.name} {' '.join(args)}"
    try:
        proc = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
            env=spec.script_env(),
        )
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"{shown} did not finish within {timeout:.0f} s") from exc
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise ClusterError(f"{shown} failed with exit code {proc.returncode}:\n{output}")
    return output


def start_cluster(
    accounting: bool = True, restart: bool = False, timeout: float = 600, spec: ClusterSpec | None = None
) -> str:
    """Run up.sh for `spec` (default: this process's cluster in the given mode); return its output.
    Raise ClusterError with the output on failure."""
    spec = spec or cluster_spec(accounting)
    args = [str(UP), "--accounting" if spec.accounting else "--no-accounting"]
    if restart:
        args.append("--restart")
    return _script(spec, args, timeout)


def stop_cluster(spec: ClusterSpec, timeout: float = 120) -> str:
    """Run down.sh for `spec`: its jobs, daemons, namespaces and bridge go; nothing of other clusters."""
    return _script(spec, [str(DOWN)], timeout)


def ensure(spec: ClusterSpec) -> dict[str, str]:
    """Make sure the cluster `spec` runs, in its mode; return cluster_env(spec).

    up.sh runs only when the recorded mode differs or the cluster does not answer (then it restarts
    the cluster: jobs still in it are cancelled and the Slurm state starts empty).
    """
    if current_mode(spec) != spec.mode or not cluster_available(spec):
        start_cluster(spec=spec)
    return cluster_env(spec)


def ensure_mode(accounting: bool) -> dict[str, str]:
    """This process's cluster with or without accounting (each mode has a cluster of its own), running;
    return its client environment."""
    return ensure(cluster_spec(accounting))


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


def suite_specs(workers: int) -> list[ClusterSpec]:
    """Every cluster that `workers` xdist workers may use (each worker: with and without accounting)."""
    return [cluster_spec(accounting, worker) for worker in range(max(workers, 1)) for accounting in (True, False)]


def main(argv: list[str] | None = None) -> int:
    """``up``: start (or keep) every cluster of the suite, the first alone (it may install packages),
    then the others side by side; ``down``: stop them all."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.slurm_cluster", description=main.__doc__)
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers (-n) the suite runs with")
    args = parser.parse_args(argv)
    specs = suite_specs(args.workers)
    failed = False

    def act(spec: ClusterSpec) -> None:
        nonlocal failed
        try:
            output = start_cluster(spec=spec) if args.action == "up" else stop_cluster(spec)
        except ClusterError as exc:
            failed = True
            print(f"{spec.name} ({spec.dir}): {exc}", file=sys.stderr)
            return
        last = output.strip().splitlines()[-2 if args.action == "up" else -1 :][:1]
        print(f"{spec.name} ({spec.net}.0/24, {spec.dir}): {''.join(last)}")

    if args.action == "up":
        act(specs[0])
        specs = specs[1:]
    with ThreadPoolExecutor(max_workers=len(specs) or 1) as pool:
        list(pool.map(act, specs))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
