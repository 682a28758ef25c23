"""Which device and which precision a run really gets (no Lightning import: the torch engine uses it)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from training.spec import TrainSpec

# Variables Slurm sets in a job (or step) that was given GPUs: their ids on the node, or their count.
SLURM_GPU_VARIABLES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE")


class DeviceError(RuntimeError):
    """The job cannot have the device it was given or asked for; the message is one line saying why and
    what to do (python -m training prints it, without a traceback, and exits 2)."""


def cpu_threads(environ: Mapping[str, str]) -> int | None:
    """The CPU threads of this process' math (OMP_NUM_THREADS) where nobody chose: the CPUs Slurm gave
    its task. None outside Slurm, and where OMP_NUM_THREADS is set: by the user, or by the launcher of
    several ranks in one task (torchrun: 1 each; accelerate: 1 each on GPUs, the node's cores shared on CPUs).

    torch alone takes every core it may run on: the same number on a cluster that binds tasks to their
    CPUs, but where Slurm does not (TaskPlugin=task/none), jobs sharing a node each run a thread per core
    of the node, and all of them slow down several times over."""
    cpus = environ.get("SLURM_CPUS_PER_TASK", "")
    return int(cpus) if cpus.isdigit() and int(cpus) > 0 and not environ.get("OMP_NUM_THREADS") else None


def use_cpu_threads() -> None:
    """cpu_threads for this rank's math, told to torch and to the libraries that would otherwise choose
    their own where OMP_NUM_THREADS is unset (accelerate's state, Lightning's launchers)."""
    threads = cpu_threads(os.environ)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)


def resolve_accelerator(t: TrainSpec, environ: Mapping[str, str] | None = None) -> str:
    """ "cpu" or "gpu". accelerator="cpu" wins even when Slurm set CUDA_VISIBLE_DEVICES (test switch).
    "auto" without CUDA trains on the CPU, but not in a job Slurm gave GPUs: that is a broken
    environment (a CPU-only torch, a driver mismatch, a container without the host's NVIDIA libraries),
    and GPU-hours would burn on a CPU run. Raises DeviceError then, and for "gpu" without CUDA."""
    import torch

    if t.accelerator == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "gpu"
    if t.accelerator == "gpu":
        raise DeviceError(f"train.accelerator = 'gpu' but {why_no_cuda()}; use 'cpu' to test on the CPU")
    given = slurm_gpus(os.environ if environ is None else environ)
    if given:
        raise DeviceError(
            f"Slurm gave this job GPUs ({given}) but {why_no_cuda()}; mend the environment, or set "
            "train.accelerator = 'cpu' to train on the CPU on purpose"
        )
    return "cpu"


def slurm_gpus(environ: Mapping[str, str]) -> str:
    """'NAME=value' of the first Slurm variable that says this job holds GPUs; '' when none does."""
    for name in SLURM_GPU_VARIABLES:
        value = environ.get(name, "").strip()
        if value and value not in ("0", "(null)"):
            return f"{name}={value}"
    return ""


def why_no_cuda() -> str:
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build (install a CUDA build of torch)"
    return (
        f"torch {torch.__version__} (built for CUDA {torch.version.cuda}) sees no CUDA device: check the driver "
        "(nvidia-smi) and that the container sees the host's NVIDIA libraries"
    )


def cuda_index(local_rank: int, visible: int) -> int:
    """The CUDA device of the rank with this LOCAL_RANK, among the `visible` GPUs its process sees. A task
    that sees exactly one (per-task GPU binding: srun --gpu-bind, or a site default) uses cuda:0; a task
    that sees all of the node's uses cuda:LOCAL_RANK."""
    if visible == 1:
        return 0
    if 0 <= local_rank < visible:
        return local_rank
    raise DeviceError(
        f"the rank with LOCAL_RANK {local_rank} sees {visible} GPUs (CUDA_VISIBLE_DEVICES="
        f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}): give each task one GPU, or every task all of them"
    )


def check_binding(t: TrainSpec, visible: int) -> None:
    """Lightning and Fabric place each rank on cuda:LOCAL_RANK of the GPUs it sees: when Slurm binds one
    GPU to each task, ranks 1.. name a device that does not exist. Stop with one line. (The plain loop
    uses cuda_index; the HF Trainer's accelerate takes LOCAL_RANK modulo the GPUs it sees.)"""
    if t.engine in ("lightning", "fabric") and t.devices > 1 and visible == 1:
        raise DeviceError(
            f"each task sees one GPU but train.devices = {t.devices}: Slurm binds GPUs to tasks here "
            f"(srun --gpu-bind, or the site's default), which engine {t.engine!r} cannot use; ask for "
            "--gpu-bind=none, or use engine 'torch'"
        )


def check_device(t: TrainSpec) -> str:
    """resolve_accelerator, and on a GPU the binding check: what every process runs before any data work."""
    accelerator = resolve_accelerator(t)
    if accelerator == "gpu":
        import torch

        check_binding(t, torch.cuda.device_count())
    return accelerator


def set_deterministic(on: bool) -> None:
    """train.deterministic, the same for every engine and as Lightning's Trainer(deterministic=True) does
    it: deterministic algorithms only (an op without one raises), cuBLAS's fixed workspace (it must be
    set before the first cuBLAS handle, so before any training), no cuDNN autotuning."""
    if not on:
        return
    import torch

    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def effective_precision(requested: str, accelerator: str) -> str:
    """fp16 autocast is a GPU feature: on CPU, 16-mixed runs as bf16-mixed and result.json says so."""
    if requested == "16-mixed" and accelerator == "cpu":
        return "bf16-mixed"
    return requested
