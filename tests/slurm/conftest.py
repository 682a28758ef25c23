"""Fixtures for the real-cluster tests: the cluster from tests/cluster/up.sh, in a chosen mode.

Outside CI these tests skip when the cluster cannot be started (not root, JOBGEN_SKIP_SLURM=1);
in CI (CI=true) a cluster that does not come up fails them instead.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.slurm.helpers import REPO, cluster_dir

UP = REPO / "tests" / "cluster" / "up.sh"


def _load_env() -> dict[str, str]:
    env = {}
    for line in (cluster_dir() / "env.sh").read_text().splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export "):].split("=", 1)
            env[key] = value.strip("'\"")
    return env


def _mode() -> str:
    path = cluster_dir() / "mode"
    return path.read_text().strip() if path.exists() else ""


def ensure_mode(mode: str) -> None:
    """Start the cluster, or restart it in the other accounting mode; no-op when it already runs so."""
    alive = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, env={**os.environ, **_env_or_empty()})
    if _mode() == mode and alive.returncode == 0 and "UP" in alive.stdout:
        return
    flag = "--accounting" if mode == "accounting" else "--no-accounting"
    done = subprocess.run(["bash", str(UP), flag], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"tests/cluster/up.sh {flag} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def _env_or_empty() -> dict[str, str]:
    try:
        return _load_env()
    except OSError:
        return {}


def _cluster(mode: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    if os.environ.get("JOBGEN_SKIP_SLURM") == "1":
        pytest.skip("JOBGEN_SKIP_SLURM=1")
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("the test cluster needs root (tests/cluster/up.sh)")
    try:
        ensure_mode(mode)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the test cluster did not start: {exc}")
        pytest.skip(f"the test cluster did not start: {exc}")
    env = _load_env()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The cluster with accounting (slurmdbd): sacct works."""
    return _cluster("accounting", monkeypatch)


@pytest.fixture(params=["accounting", "no-accounting"])
def slurm_any(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The cluster with, then without, accounting."""
    return _cluster(request.param, monkeypatch)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    # Job folders must be visible on every node: the nodes share this machine's filesystem.
    return tmp_path / "runs"
