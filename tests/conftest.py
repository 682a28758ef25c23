"""Test isolation: no test touches the user's real state, Slurm variables or the network."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests/ helpers import as `tests.x`

pytest_plugins = ["tests.conftest_slurm"] if (REPO / "tests" / "conftest_slurm.py").exists() else []


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Clear SLURM_* (unless a test runs inside a real job), point caches and homes at tmp_path."""
    if "slurm" not in request.keywords:
        for name in list(os.environ):
            if name.startswith(("SLURM_", "SBATCH_", "SRUN_")):
                monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("JOBGEN_OUTPUT_ROOT", raising=False)
    monkeypatch.delenv("JOBGEN_DEBUG", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture
def runner():
    from click.testing import CliRunner

    return CliRunner()


@pytest.fixture
def out_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    return root
