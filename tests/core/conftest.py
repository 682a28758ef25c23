"""Stand-in Slurm tools for the core tests: `bin_dir` is a folder put first on PATH, `stub_tool` writes one
executable script into it (sacct, squeue, scontrol answering as a test says)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def stub_tool(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return folder


def fake_squeue(monkeypatch: pytest.MonkeyPatch, answer: Callable[[list[str]], Any]) -> None:
    """Slurm's answer about job states, `answer(ids)` (_slurm.query)."""
    monkeypatch.setattr("jobgen.backends._slurm.query", answer)
