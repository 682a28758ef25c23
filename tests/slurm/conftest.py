"""Fixtures for jobgen's tests on the real cluster, built on tests/support/conftest_slurm.py.

`slurm` is the cluster with accounting; `slurm_any` runs a test with, then without, accounting.
Both export the cluster's client variables (SLURM_CONF, ...) so that `jobgen` and the Slurm tools
the tests call reach it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


def _export(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for key in ("SLURM_CONF", "JOBGEN_CLUSTER_DIR"):
        if key in env:
            monkeypatch.setenv(key, env[key])
    return env


@pytest.fixture
def slurm(slurm_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    return _export(slurm_env, monkeypatch)


@pytest.fixture(params=["accounting", "no-accounting"])
def slurm_any(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    name = "slurm_env" if request.param == "accounting" else "slurm_no_accounting"
    yield _export(request.getfixturevalue(name), monkeypatch)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    # Job folders must be visible on every node: the nodes share this machine's filesystem.
    return tmp_path / "runs"
