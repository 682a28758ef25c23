"""Which device a job gets: a job Slurm gave GPUs that torch cannot see stops in one line, each rank
finds its GPU under per-task binding, and train.deterministic holds for every engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.training.conftest import REPO, spec_dict, subprocess_env, write_spec
from training import hardware
from training.contract import Train
from training.run import run
from training.spec import from_dict

pytestmark = [pytest.mark.training, pytest.mark.timeout(300)]


def _train(**keys: Any) -> Train:
    return Train(**{"num_nodes": 1, "devices": 1, **keys})


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("variable", hardware.SLURM_GPU_VARIABLES)
def test_auto_in_a_job_given_gpus_that_torch_cannot_see_stops(no_cuda: None, variable: str) -> None:
    with pytest.raises(hardware.DeviceError, match=rf"Slurm gave this job GPUs \({variable}=0,1\) but torch"):
        hardware.resolve_accelerator(_train(accelerator="auto"), {variable: "0,1"})
    assert hardware.resolve_accelerator(_train(accelerator="cpu"), {variable: "0,1"}) == "cpu"  # on purpose


@pytest.mark.parametrize("environ", [{}, {"SLURM_GPUS_ON_NODE": "0"}, {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"}])
def test_auto_without_gpus_from_slurm_trains_on_the_cpu(no_cuda: None, environ: dict[str, str]) -> None:
    assert hardware.resolve_accelerator(_train(accelerator="auto"), environ) == "cpu"


def test_gpu_without_cuda_says_why(no_cuda: None) -> None:
    with pytest.raises(hardware.DeviceError, match=r"train.accelerator = 'gpu' but torch .* (CPU-only|sees no CUDA)"):
        hardware.resolve_accelerator(_train(accelerator="gpu"), {})


def test_the_entrypoint_stops_in_one_line_before_any_data_work(tmp_path: Path, cache_dir: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine's torch sees CUDA: the in-process tests above stub it instead")
    spec = write_spec(tmp_path / "job", cache_dir, train={"accelerator": "auto"})
    env = subprocess_env({"SLURM_JOB_GPUS": "0,1", "SLURM_JOB_ID": "12"})
    done = subprocess.run(
        [sys.executable, "-m", "training", "--spec", str(spec)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert line.startswith("training: Slurm gave this job GPUs (SLURM_JOB_GPUS=0,1) but torch"), line
    assert "train.accelerator = 'cpu'" in line and "Traceback" not in done.stderr
    assert "preparing data" not in done.stdout + done.stderr and not (tmp_path / "job" / "result.json").exists()


@pytest.mark.parametrize(
    ("local_rank", "visible", "index"),
    [(0, 1, 0), (3, 1, 0), (0, 4, 0), (3, 4, 3), (1, 2, 1)],
)
def test_a_rank_uses_the_one_gpu_its_task_sees_or_its_local_rank(local_rank: int, visible: int, index: int) -> None:
    """Under per-task binding (srun --gpu-bind=single:1, or a site default) each task sees one GPU: cuda:0."""
    assert hardware.cuda_index(local_rank, visible) == index


def test_a_local_rank_beyond_the_visible_gpus_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with pytest.raises(hardware.DeviceError, match=r"LOCAL_RANK 2 sees 2 GPUs \(CUDA_VISIBLE_DEVICES='2,3'\)"):
        hardware.cuda_index(2, 2)


@pytest.mark.parametrize("engine", ["lightning", "fabric"])
def test_engines_that_place_ranks_themselves_stop_under_per_task_binding(engine: str) -> None:
    with pytest.raises(hardware.DeviceError, match=r"each task sees one GPU but train.devices = 4.*--gpu-bind=none"):
        hardware.check_binding(_train(engine=engine, devices=4), visible=1)
    hardware.check_binding(_train(engine=engine, devices=4), visible=4)
    hardware.check_binding(_train(engine=engine, devices=1), visible=1)
    hardware.check_binding(_train(engine="torch", devices=4), visible=1)  # the plain loop uses cuda:0 there
    hardware.check_binding(_train(engine="hf_trainer", devices=4), visible=1)  # accelerate: LOCAL_RANK % GPUs


def test_set_deterministic_sets_cublas_and_strict_algorithms() -> None:
    code = (
        "import os, torch; from training.hardware import set_deterministic; set_deterministic(True); "
        "print(os.environ['CUBLAS_WORKSPACE_CONFIG'], torch.are_deterministic_algorithms_enabled(), "
        "torch.is_deterministic_algorithms_warn_only_enabled(), torch.backends.cudnn.benchmark)"
    )
    env = {k: v for k, v in subprocess_env().items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [":4096:8", "True", "False", "False"]  # as Lightning's deterministic=True


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("engine", ["torch", "fabric", "hf_trainer"])
def test_train_deterministic_reaches_every_engine(
    engine: str, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from training import model as model_lib

    seen: list[bool] = []
    original = model_lib.prepare  # what hands every engine its model

    def load(*args: Any, **kwargs: Any) -> Any:
        model = original(*args, **kwargs)
        model.register_forward_hook(lambda *_: seen.append(torch.are_deterministic_algorithms_enabled()))
        return model

    monkeypatch.setattr(model_lib, "prepare", load)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    job = tmp_path / engine
    train = {"engine": engine, "deterministic": True, "epochs": 1, "num_workers": 0}
    spec = from_dict(spec_dict(job, cache_dir, train=train, data={"partition": [96, 32, 32]}))
    try:
        assert run(spec) == 0
    finally:
        torch.use_deterministic_algorithms(False)
    assert seen and all(seen), seen
    assert json.loads((job / "result.json").read_text())["optimizer_steps"] == 3
