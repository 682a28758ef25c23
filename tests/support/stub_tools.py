"""Stand-ins for Slurm's commands in tests that need no cluster: shell scripts put first on PATH."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest


def install_stubs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stubs: dict[str, str]) -> Path:
    """Write each stub (name -> bash body) into tmp_path/bin, put that first on PATH, and return the
    state folder the stubs share (also in $STATE)."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, body in stubs.items():
        tool = bin_dir / name
        tool.write_text("#!/bin/bash\n" + body)
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("STATE", str(state))
    return state
