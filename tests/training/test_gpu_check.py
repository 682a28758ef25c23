"""bench/gpu_check.sh, the script for the first session with a GPU, run here on the CPU with tiny sizes:
it must run every cell it lists through the real entrypoint and print the sweep's table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.conftest import REPO, subprocess_env

pytestmark = [pytest.mark.training, pytest.mark.slow, pytest.mark.timeout(600)]


def test_gpu_check_runs_its_matrix_and_sweep_on_cpu(tmp_path: Path) -> None:
    env = {**subprocess_env(), "OUT": str(tmp_path), "PYTHON": sys.executable}
    args = [
        "--cpu",
        "--steps",
        "2",
        "--engines",
        "torch",
        "--precisions",
        "bf16-mixed",
        "--compile",
        "off",
        "--sweep-steps",
        "3",
        "--points",
        "plain-pytorch,trainer-mixed",
        "--model",
        "builtin:tiny",
        "--eval-rows",
        "40",
        "--timeout",
        "240",
    ]
    done = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_check.sh"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=580,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    cells = [f"torch-{strategy}-bf16-mixed-eager" for strategy in ("auto", "ddp")]
    for cell in cells:
        assert f"pass  {cell}" in out, out[-4000:]
    assert "fsdp" not in out and "deepspeed" not in out  # one device: sharded strategies are not listed
    assert "smoke: 2 passed, 0 failed" in out
    table = [
        line.split()
        for line in out.splitlines()
        if line.strip().startswith(("plain-pytorch", "trainer-mixed")) and "×" in line
    ]
    assert [row[0] for row in table] == ["plain-pytorch", "trainer-mixed"], out[-3000:]
    assert all(float(row[2]) > 0 and 0 <= float(row[4]) <= 1 for row in table)  # samples/s, test accuracy
    report = json.loads((tmp_path / "runs" / "gpu_check.json").read_text())
    assert len(report["smoke"]) == 2 and all(
        r["result"]["optimizer_steps"] == 4 for r in report["sweep"]
    )  # 55 rows of 16
    assert (tmp_path / "gpu_check.log").exists() and os.path.getsize(tmp_path / "gpu_check.log") > 0


def test_first_error_line_names_the_exception() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    from gpu_check import first_error

    log = "training: rank 0\nTraceback (most recent call last):\n  File x\nRuntimeError: CUDA error: invalid argument\n"
    assert first_error(log) == "RuntimeError: CUDA error: invalid argument"
    assert first_error("") == "no output"
