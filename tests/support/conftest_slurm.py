"""pytest fixtures for the real Slurm test cluster; registered in tests/conftest.py (pytest_plugins).

- ``slurm_cluster`` (session): starts this process's accounting cluster once; returns a SlurmCluster.
- ``slurm_env`` (function): that cluster (checked per test, restarted only when needed) and a fresh
  copy of the client environment (SLURM_CONF, ...) for subprocesses.
- ``slurm_no_accounting`` (function): this process's cluster without accounting (a cluster of its own,
  started when first needed: no mode switch, nothing restarted under other tests); returns the client
  environment.

Each xdist worker has its own pair of clusters (tests/support/slurm_cluster.py ``cluster_spec``).

Where the cluster cannot run (not root, or JOBGEN_SKIP_SLURM=1) the tests skip with the reason. With
CI=true they fail instead: CI must never pass by skipping the cluster.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import slurm_cluster as cluster  # not "slurm_cluster": that is the fixture's name


@dataclass(frozen=True)
class SlurmCluster:
    """The running test cluster."""

    dir: Path
    """Root directory of the cluster's files (config, logs, state)."""
    env: dict[str, str] = field(repr=False)
    """os.environ plus SLURM_CONF etc. as read at start; prefer the ``slurm_env`` fixture."""
    nodes: tuple[str, ...] = ("n1", "n2", "n3")
    """Compute node names; each has 64 CPUs, 512000 MB and gpu:4."""

    @property
    def log_dir(self) -> Path:
        return self.dir / "log"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _why_not_runnable() -> str | None:
    if os.environ.get("JOBGEN_SKIP_SLURM") == "1":
        return "JOBGEN_SKIP_SLURM=1"
    if os.geteuid() != 0:
        return "tests/cluster/up.sh needs root (namespaces, daemons); run as root or set JOBGEN_SKIP_SLURM=1"
    if not cluster.UP.is_file():
        return f"{cluster.UP} is missing"
    return None


def _start(accounting: bool) -> dict[str, str]:
    try:
        return cluster.ensure(cluster.cluster_spec(accounting))
    except cluster.ClusterError as exc:
        # A cluster that cannot start is a failure everywhere, not a skip: the scripts are the product.
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    reason = _why_not_runnable()
    if reason:
        if _in_ci():
            pytest.fail(f"Slurm test cluster unavailable in CI (CI=true): {reason}", pytrace=False)
        pytest.skip(f"Slurm test cluster unavailable: {reason}")
    env = _start(accounting=True)
    return SlurmCluster(dir=cluster.cluster_spec(accounting=True).dir, env=env)


@pytest.fixture
def slurm_env(slurm_cluster: SlurmCluster) -> dict[str, str]:
    # Cheap when nothing changed (reads the mode file, pings slurmctld); starts the cluster again if
    # it died.
    return _start(accounting=True)


@pytest.fixture
def slurm_no_accounting(slurm_cluster: SlurmCluster) -> dict[str, str]:
    return _start(accounting=False)
