"""The one mapping of [container] onto a job's launch: what every runtime's template partial is given.

A partial (jobgen/templates/_container_RUNTIME.j2, or one of that name beside launch.template) defines
three macros, each rendering shell text from `container` (the dict below):
    environment()  lines for the batch shell, on the host, before the launch (exports, mkdir)
    srun_flags()   flags on the srun step that starts the tasks (pyxis: --container-image, ...)
    command()      words before each task's python command (apptainer exec ... IMAGE)
Everything that talks to Slurm (scontrol, the requeue logic, the signal relay's parent) stays in the
batch shell on the host; only the tasks' python runs in the container.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobgen.experiment import container as checks

if TYPE_CHECKING:
    from jobgen.plan.plan import Job

# The Hugging Face cache when the submitting shell sets no HF_HOME; ~ is the node's $HOME.
DEFAULT_HF_HOME = "~/.cache/huggingface"


# The variables jobgen's scripts export for the tasks: an image's own must not win over them.
_JOBGEN_ENV = ["PYTHONUNBUFFERED", "PYTHONPATH", "JOBGEN_RUN_DIR", "JOBGEN_JOB_NAME", "JOBGEN_GIT_SHA", "HF_HOME"]
_OFFLINE = ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"]


def context(job: Job, run_dir: Path, job_dir: Path, cache_dir: Path, hf_home: str) -> dict[str, Any] | None:
    """The `container` a partial renders from; None without [container]."""
    exp = job.exp
    c = exp.container
    if not c.runtime:
        return None
    path = checks.image_path(exp)
    user = [checks.mount(item, exp.base_dir) for item in c.mounts]
    # The job's own folders, at the same path inside: the spec, code snapshot, checkpoints and
    # result.json are where the host's batch shell looks for them. The output root (which holds the
    # run folder) rather than the run folder itself: a read-only image (charliecloud) needs a mount
    # point for each, made once for a fixed folder, not for every new run.
    own: list[tuple[str, str]] = []
    root = str(run_dir.parent.parent)
    for folder in (root, str(cache_dir), hf_home):
        if not _covered(folder, own + user):
            own.append((folder, folder))
    mounts = own + user
    return {
        "runtime": c.runtime,
        "binary": checks.BINARIES.get(c.runtime, c.runtime),
        "partial": checks.partial_name(c.runtime),
        "image": str(path) if path else c.image,
        "mounts": mounts,
        "created": [src for src, _ in own if src != root],  # may not exist yet; a bind needs its source
        "env": list(dict.fromkeys(_JOBGEN_ENV + _OFFLINE * exp.env.hf_offline + sorted(exp.env.vars) + c.env)),
        "workdir": str(job_dir),
        "gpus": c.gpu_flags and (exp.slurm.gpus_per_node > 0 or exp.train.accelerator == "gpu"),
    }


def missing_mount_points(job: Job, run_dir: Path, cache_dir: Path, hf_home: str) -> list[str]:
    """The folders jobgen mounts itself that a read-only image has no mount point for (charliecloud)."""
    box = context(job, run_dir, run_dir, cache_dir, hf_home)
    if box is None:
        return []
    user = {dst for _, dst in (checks.mount(item, job.exp.base_dir) for item in job.exp.container.mounts)}
    own = [str(Path(dst).expanduser()) for _, dst in box["mounts"] if dst not in user]
    return checks.mount_point_problems(job.exp, own, "mounted by jobgen: the output root or a cache")


def _covered(path: str, mounts: list[tuple[str, str]]) -> bool:
    """Whether a user's mount already shows `path` at its own place (a parent mounted at itself)."""
    return any(src == dst and (path == src or path.startswith(src.rstrip("/") + "/")) for src, dst in mounts)


def record(job: Job) -> dict[str, str] | None:
    """What the run's records say about the container (manifest, status, diff): runtime and image."""
    c = job.exp.container
    if not c.runtime:
        return None
    path = checks.image_path(job.exp)
    return {"runtime": c.runtime, "image": str(path) if path else c.image}
