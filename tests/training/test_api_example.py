"""The README's example of jobgen.api (tests/api_example.py, the same text) runs as written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.conftest import REPO, subprocess_env

pytestmark = [pytest.mark.training, pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_readme_api_example_runs(tmp_path: Path):
    env = subprocess_env({"JOBGEN_OUTPUT_ROOT": str(tmp_path / "runs")})
    example = REPO / "tests" / "api_example.py"
    done = subprocess.run(
        [sys.executable, str(example)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "local_demo ['engine-torch', 'engine-lightning', 'engine-fabric', 'engine-hf-trainer']" in done.stdout
    assert done.stdout.count("COMPLETED") >= 4
