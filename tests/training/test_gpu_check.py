"""bench/gpu_check.sh, the check for a machine with one GPU and no internet, in its CI-sized form on
the CPU: the plan comes first, every cell runs through the real entrypoint, the table is printed, and
what it leaves in $OUT is two files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.conftest import REPO, subprocess_env

pytestmark = [pytest.mark.training, pytest.mark.slow, pytest.mark.timeout(600)]

sys.path.insert(0, str(REPO / "bench"))


def test_the_cpu_form_prints_its_plan_runs_every_cell_and_the_table(tmp_path: Path) -> None:
    env = {**subprocess_env(), "OUT": str(tmp_path / "out"), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_check.sh"), "--cpu"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=580,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    plan = out.index("== plan ==")
    assert plan < out.index("== smoke matrix") < out.index("pass  torch-16-mixed-resume")
    assert "model builtin:tiny on cpu" in out and "smoke: 1 cells" in out and "table: 2 configurations" in out
    assert "expected on one H100" in out and "(limit 8)" in out and "MiB (limit 60 MiB)" in out
    table = [
        line.split()
        for line in out.splitlines()
        if line.strip().startswith(("plain-pytorch ", "lightning-bf16-mixed "))
    ]
    assert [row[0] for row in table] == ["plain-pytorch", "lightning-bf16-mixed"], out[-3000:]
    assert table[0][-1] == "1.00x" and all(float(row[2]) > 0 for row in table)  # speed-up base, samples/s
    assert all(row[3] == "-" for row in table)  # no MFU on a CPU, never a made-up peak
    assert "smoke: 1 passed, 0 failed; table: 2 of 2 ran" in out
    assert sorted(os.listdir(tmp_path / "out")) == ["gpu_check.json", "gpu_check.log"]  # at most 8 files
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert [c["name"] for c in report["smoke"]] == ["torch-16-mixed-resume"] and report["smoke"][0]["ok"]
    assert all(r["result"]["optimizer_steps"] == 6 for r in report["table"])
    assert report["plan"]["brought_mib"] < 60


def test_children_keep_the_carried_wheels_on_their_path(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpu_check

    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    env = gpu_check.child_env(29611)
    assert env["PYTHONPATH"] == f"{REPO}:/tmp/site" and env["MASTER_PORT"] == "29611" and "MASTER_ADDR" not in env
    monkeypatch.delenv("PYTHONPATH")
    assert gpu_check.child_env(1)["PYTHONPATH"] == str(REPO)


def test_the_matrix_has_no_duplicate_cells_and_the_offload_stages_under_each_engine() -> None:
    import gpu_check

    from training.contract import Train, shape_problems

    keys = [tuple(sorted(c.train.items())) + (c.resume,) for c in gpu_check.SMOKE]
    assert len(set(keys)) == len(keys) and len({c.name for c in gpu_check.SMOKE}) == len(gpu_check.SMOKE)
    for engine in ("lightning", "fabric", "hf_trainer"):
        stages = {c.train.get("strategy") for c in gpu_check.SMOKE if c.train["engine"] == engine}
        assert {"deepspeed_stage_2_offload", "deepspeed_stage_3_offload"} <= stages, engine
    for cell in gpu_check.SMOKE + gpu_check.TABLE:  # every cell is a job validation accepts on one GPU
        assert not shape_problems(Train(**cell.train, num_nodes=1, devices=1)), cell.name
    assert [c.name for c in gpu_check.TABLE][:5] == [
        "plain-pytorch",
        "lightning-32-true",
        "lightning-16-mixed",
        "lightning-bf16-mixed",
        "lightning-bf16-compile",
    ]


def test_the_gpu_form_uses_distilbert_shape_and_fits_its_limits() -> None:
    """No silent fallback to a tiny model: the GPU form's model is builtin:distilbert-shape."""
    import gpu_check

    args = gpu_check.argparse.Namespace(
        cpu=False, smoke="", table="", steps=0, table_steps=0, warmup=3, eval_rows=0, jobs=0, model="", timeout=240
    )
    s = gpu_check.settings(args, Path("/nonexistent"))
    assert s.model == "builtin:distilbert-shape" and s.accelerator == "gpu"
    smoke = gpu_check.BUILD_S + sum(gpu_check.expected_s(c, s.steps) for c in s.smoke) / s.jobs
    table = gpu_check.BUILD_S + sum(gpu_check.expected_s(c, s.table_steps) for c in s.table)
    assert (smoke + table) / 60 <= gpu_check.LIMIT_MIN


def test_first_error_line_names_the_exception() -> None:
    from gpu_check import first_error

    log = "training: rank 0\nTraceback (most recent call last):\n  File x\nRuntimeError: CUDA error: invalid argument\n"
    assert first_error(log) == "RuntimeError: CUDA error: invalid argument"
    assert first_error("training: Slurm gave this job GPUs (SLURM_JOB_GPUS=0) but ...").startswith("training: Slurm")
    assert first_error("") == "no output"


def test_a_slimmed_wheel_leaves_out_what_it_says_and_its_record_matches(tmp_path: Path) -> None:
    import zipfile

    import gpu_check_wheels

    wheel = tmp_path / "pyarrow-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name in ("pyarrow/lib.so", "pyarrow/libarrow_flight.so.1", "pyarrow/tests/t.py", "pyarrow/include/a.h"):
            z.writestr(name, b"x" * 100)
        z.writestr("pyarrow-1.0.dist-info/RECORD", "")
    gpu_check_wheels.slim(wheel, gpu_check_wheels.SLIM["pyarrow"])
    with zipfile.ZipFile(wheel) as z:
        assert sorted(z.namelist()) == ["pyarrow-1.0.dist-info/RECORD", "pyarrow/lib.so"]
        record = z.read("pyarrow-1.0.dist-info/RECORD").decode().splitlines()
    assert record[0].startswith("pyarrow/lib.so,sha256=") and record[0].endswith(",100")
    assert gpu_check_wheels.name_of(wheel) == ("pyarrow", "1.0")
