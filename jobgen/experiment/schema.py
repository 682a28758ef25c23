"""The experiment file's typed tree: every key, its type, default and one-line doc.

Each section is a frozen dataclass; [train] and [data] are training/contract.py's. A field's metadata holds its doc and its checks, so that the
loader (jobgen.experiment.config) validates from this one description and `jobgen schema` prints it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobgen import backends
from training import contract
from training.contract import opt

LAUNCHERS = ("srun", "torchrun", "accelerate")
# The container runtimes jobgen ships a template partial for (jobgen/templates/_container_NAME.j2);
# a partial of that name beside launch.template adds one (docs/guides/containers.md).
CONTAINER_RUNTIMES = ("apptainer", "singularity", "pyxis", "charliecloud")
BACKENDS = backends.names()


@dataclass(frozen=True)
class ExperimentSection:
    name: str = opt("", "Experiment name (default: the file's stem); names the run folder.", kind="name")
    output_root: str = opt("runs", "Where run directories go (relative to the current directory).")
    description: str = opt("", "Free text, copied into the manifest.")


@dataclass(frozen=True)
class SlurmSection:
    partition: str = opt("", "Partition (sbatch --partition); empty = the cluster's default.", kind="word")
    account: str = opt("", "Account to charge (sbatch --account).", kind="word")
    qos: str = opt("", "Quality of service (sbatch --qos).", kind="word")
    nodes: int = opt(1, "Number of nodes (sbatch --nodes).", min=1, max=contract.MAX_NODES)
    gpus_per_node: int = opt(0, "GPUs per node (sbatch --gpus-per-node); 0 = CPU job.", min=0, max=contract.MAX_DEVICES)
    gpu_type: str = opt("", "GPU type for --gpus-per-node=TYPE:N, e.g. a100.", kind="word")
    ntasks_per_node: int = opt(
        0, "Tasks per node; 0 = one per device (what srun-launched ranks need).", min=0, max=1024
    )
    cpus_per_task: int = opt(
        4,
        "CPUs per task (sbatch --cpus-per-task, passed on to srun); a rank srun starts computes on as many "
        "threads unless the job's environment sets OMP_NUM_THREADS (torchrun and accelerate set their own).",
        min=1,
        max=1024,
    )
    mem: str = opt(
        "",
        "Memory per node as sbatch takes it: 64G, 500M, 0 (= all); auto = the newest probe's prediction "
        "times slurm.mem_margin (run `jobgen probe` first).",
        kind="mem",
    )
    time: str = opt(
        "01:00:00",
        "Time limit in any form sbatch takes: MM, HH:MM:SS, D-HH, ... (at most 365 days); auto = the newest "
        "probe's prediction times slurm.time_margin, in whole minutes, at most the partition's MaxTime.",
        kind="time",
    )
    time_margin: float = opt(
        1.3, "slurm.time = auto asks for the predicted wall time times this (at least 1).", min=1.0, max=100.0
    )
    mem_margin: float = opt(
        1.3, "slurm.mem = auto asks for the predicted peak memory times this (at least 1).", min=1.0, max=100.0
    )
    constraint: str = opt("", "Node features (sbatch --constraint), e.g. 'a100&ib'.", kind="constraint")
    exclusive: bool = opt(False, "Ask for whole nodes (sbatch --exclusive).")
    requeue: bool = opt(False, "On the warning signal, checkpoint and requeue the job (resumes there).")
    signal: str = opt("USR2", "Warning signal sent before the time limit (USR2 avoids NCCL's USR1).", kind="signal")
    signal_seconds: int = opt(120, "Seconds before the time limit to send the signal.", min=1, max=65535)
    retries: int = opt(
        0,
        "Requeue a job that fails (not one cancelled or out of time) up to N times, each time away from "
        "the nodes it failed on; it resumes from its newest checkpoint (sbatch backend).",
        min=0,
        max=100,
    )
    chain: int = opt(
        1,
        "Submit each job as N segments, each starting when the previous ends (afterany) and resuming "
        "from its newest checkpoint: training longer than the time limit.",
        min=1,
        max=1000,
    )
    extra: dict[str, str | int | bool] = opt(
        {}, "Extra #SBATCH flags, e.g. {mail-type = 'END', reservation = 'x'}; true = bare flag.", kind="extra"
    )


@dataclass(frozen=True)
class EnvSection:
    modules: list[str] = opt([], "Environment modules to `module load`, in order.", kind="words")
    venv: str = opt("", "Path of a Python venv to activate on the nodes.")
    conda: str = opt("", "Conda environment to activate on the nodes.", kind="word")
    python: str = opt("", "Python interpreter on the nodes (default: python; local: this one).")
    vars: dict[str, str] = opt({}, "Environment variables for the job (no secrets: those come from your shell).")
    setup: list[str] = opt([], "Shell lines run before the launch, as written (trusted, not quoted).")
    hf_offline: bool = opt(
        True, "Set HF_HUB_OFFLINE/HF_DATASETS_OFFLINE on the nodes (download on the login node first)."
    )


# The [train] and [data] sections are the training entrypoint's own contract (training/contract.py):
# the keys, defaults, choices and checks are described once, there.
TrainSection = contract.Train
DataSection = contract.Data


@dataclass(frozen=True)
class LaunchSection:
    backend: str = opt(
        "sbatch",
        "How jobs are started: sbatch, submitit, or local (this machine); see docs/backends.md.",
        choices=BACKENDS,
    )
    launcher: str = opt(
        "srun",
        "Who starts the ranks: srun (one task per device), torchrun or accelerate (one task per node).",
        choices=LAUNCHERS,
    )
    template: str = opt("", "Your own Jinja template (relative to this file); it may extend srun.sbatch.j2.")
    array: bool = opt(False, "Submit a sweep as one Slurm job array.")
    array_parallelism: int = opt(
        0, "Most array tasks running at once (--array=...%N); 0 = no limit.", min=0, max=1_000_000
    )
    max_queued: int = opt(
        0,
        "Most of the sweep's jobs queued at once (array tasks, chain segments one each); the rest WAIT and "
        "are submitted as jobs end. 0 = what the cluster's limits leave at submit (docs/guides/queue-limits.md).",
        min=0,
        max=10_000_000,
    )
    queue_reserve: int = opt(
        1,
        "With max_queued = 0: queue slots the sweep leaves free for your other jobs (at least the one a job "
        "that ends submits the next into).",
        min=0,
        max=10_000_000,
    )
    cache_dir: str = opt("", "Cache for tokenized data and built models; default OUTPUT_ROOT/.cache.")


@dataclass(frozen=True)
class ContainerSection:
    runtime: str = opt(
        "",
        "Run each task in a container: apptainer, singularity, pyxis, charliecloud (or your own "
        "_container_NAME.j2 beside launch.template); empty = no container.",
        kind="name",
    )
    image: str = opt(
        "",
        "The image: a .sif file (apptainer), a registry name or an absolute/./ squashfs path (pyxis), "
        "an image directory (charliecloud); paths are relative to this file.",
    )
    mounts: list[str] = opt(
        [], "Bind mounts, 'SRC' or 'SRC:DST'; the run folder, the cache and the HF cache are always mounted."
    )
    env: list[str] = opt(
        [], "Host variables to pass in, winning over the image's own (jobgen's variables always pass)."
    )
    gpu_flags: bool = opt(True, "Give the runtime its GPU flag (apptainer --nv) when the job asks for GPUs.")


@dataclass(frozen=True)
class SweepSection:
    grid: dict[str, list[Any]] = opt({}, "Dotted key -> list of values; every combination becomes a job.", kind="grid")
    points: list[dict[str, Any]] = opt(
        [], "Explicit jobs: tables of dotted key -> value, optional `name`.", kind="points"
    )
    random: dict[str, Any] = opt(
        {},
        "Random search: n (points), seed (default 0) and dotted key -> one distribution: "
        "{uniform = [low, high]}, {loguniform = [low, high]} (low > 0), {int = [low, high]} (inclusive) "
        "or {choice = [values]}; points x random x grid.",
    )
    halving: dict[str, Any] = opt(
        {},
        "Successive halving: stop the losers at rungs. rungs = [epochs, ...] (each below train.epochs) or "
        "min_epochs (rungs min_epochs * eta**k; default 1), eta (keep the top 1/eta, default 3), metric "
        "(a validation metric of the task: accuracy, mcc, pearson...; default the primary), mode (max or min; "
        "default the metric's direction); docs/guides/halving.md.",
    )
    max_jobs: int = opt(
        10000, "Refuse sweeps larger than this (raise it on purpose for huge sweeps).", min=1, max=10_000_000
    )


SECTIONS: dict[str, type] = {
    "experiment": ExperimentSection,
    "slurm": SlurmSection,
    "env": EnvSection,
    "train": TrainSection,
    "data": DataSection,
    "launch": LaunchSection,
    "container": ContainerSection,
    "sweep": SweepSection,
}

# Sections whose keys a sweep may vary.
SWEEPABLE = ("slurm", "env", "train", "data")


def field_map(section: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(section)}


def type_name(tp: Any) -> str:
    text = tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))
    return text.replace("typing.", "")


def schema_rows() -> list[tuple[str, str, str, str, str]]:
    """(dotted key, type, default, valid values, doc) for every key, in file order. Valid values are a
    numeric key's range ('positive and at most 10000'), a key's choices ('one of auto, ddp, ...'), else
    empty: whatever the checks at validation accept, said where users look it up."""
    rows = []
    values = defaults()
    for section_name, section in SECTIONS.items():
        for f in dataclasses.fields(section):
            key = f"{section_name}.{f.name}"
            valid = contract.bounds(f.metadata)
            if f.metadata.get("choices"):
                valid = "one of " + ", ".join(f.metadata["choices"])
            rows.append((key, type_name(f.type), repr_default(values[key]), valid, f.metadata["doc"]))
    return rows


def defaults() -> dict[str, Any]:
    """Every key's default value, by dotted key (what a file that leaves the key out gets)."""
    return {
        f"{name}.{f.name}": f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        for name, section in SECTIONS.items()
        for f in dataclasses.fields(section)
    }


def repr_default(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


@dataclass(frozen=True)
class SiteDefaults:
    """What a site gave one experiment: the values it did not set itself (dotted key -> value)."""

    name: str
    file: Path
    values: dict[str, Any]

    def record(self) -> dict[str, Any]:
        """The manifest's "site" entry."""
        return {"name": self.name, "file": str(self.file), "values": self.values}


@dataclass(frozen=True)
class Experiment:
    """A validated experiment file: its sections plus where it came from."""

    path: Path
    text: str
    raw: dict[str, Any]
    experiment: ExperimentSection
    slurm: SlurmSection
    env: EnvSection
    train: TrainSection
    data: DataSection
    launch: LaunchSection
    container: ContainerSection
    sweep: SweepSection
    display: str = ""
    site: SiteDefaults | None = None  # the site whose defaults raw holds (set by jobgen.experiment.sites)

    @property
    def label(self) -> str:
        """The file as the user named it, for messages."""
        return self.display or str(self.path)

    @property
    def name(self) -> str:
        return self.experiment.name or self.path.stem

    @property
    def base_dir(self) -> Path:
        """Relative paths in the file (template, data files) are relative to the file itself."""
        return self.path.parent
