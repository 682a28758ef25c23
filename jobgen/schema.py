"""The experiment file's typed tree: every key, its type, default and one-line doc.

Each section is a frozen dataclass. A field's metadata holds its doc and its checks, so that the
loader (jobgen.config) validates from this one description and `jobgen schema` prints it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

ENGINES = ("torch", "lightning", "fabric", "hf_trainer")
LAUNCHERS = ("srun", "torchrun", "accelerate")
STRATEGIES = (
    "auto",
    "ddp",
    "fsdp",
    "fsdp_offload",
    "deepspeed_stage_2",
    "deepspeed_stage_2_offload",
    "deepspeed_stage_3",
    "deepspeed_stage_3_offload",
)
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "bf16-true")
BACKENDS = ("sbatch", "submitit", "local")
ACCELERATORS = ("auto", "gpu", "cpu")
PADDINGS = ("dynamic", "max_length")
DATA_FORMATS = ("auto", "csv", "json", "parquet")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
LOGGERS = ("csv", "tensorboard", "wandb", "mlflow")
WANDB_MODES = ("offline", "online", "disabled")


def opt(default: Any, doc: str, *, choices: tuple = (), min: float | None = None, kind: str = "") -> Any:
    """A field with its doc and checks. `kind` names a format check in jobgen.config (time, mem, ...)."""
    meta = {"doc": doc, "choices": choices, "min": min, "kind": kind}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


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
    nodes: int = opt(1, "Number of nodes (sbatch --nodes).", min=1)
    gpus_per_node: int = opt(0, "GPUs per node (sbatch --gpus-per-node); 0 = CPU job.", min=0)
    gpu_type: str = opt("", "GPU type for --gpus-per-node=TYPE:N, e.g. a100.", kind="word")
    ntasks_per_node: int = opt(0, "Tasks per node; 0 = one per device (what srun-launched ranks need).", min=0)
    cpus_per_task: int = opt(4, "CPUs per task (sbatch --cpus-per-task, passed on to srun).", min=1)
    mem: str = opt("", "Memory per node as sbatch takes it: 64G, 500M, 0 (= all).", kind="mem")
    time: str = opt("01:00:00", "Time limit in any form sbatch takes: MM, HH:MM:SS, D-HH, ...", kind="time")
    constraint: str = opt("", "Node features (sbatch --constraint), e.g. 'a100&ib'.", kind="constraint")
    exclusive: bool = opt(False, "Ask for whole nodes (sbatch --exclusive).")
    requeue: bool = opt(False, "On the warning signal, checkpoint and requeue the job (resumes there).")
    signal: str = opt("USR2", "Warning signal sent before the time limit (USR2 avoids NCCL's USR1).", kind="signal")
    signal_seconds: int = opt(120, "Seconds before the time limit to send the signal.", min=1)
    chain: int = opt(1, "Submit each job as N segments, each starting when the previous ends (afterany) and resuming "
                     "from its newest checkpoint: training longer than the time limit.", min=1)
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
    hf_offline: bool = opt(True, "Set HF_HUB_OFFLINE/HF_DATASETS_OFFLINE on the nodes (download on the login node first).")


@dataclass(frozen=True)
class TrainSection:
    engine: str = opt("lightning", "Training engine: plain PyTorch loop, Lightning Trainer, Fabric or transformers.Trainer.", choices=ENGINES)
    strategy: str = opt("auto", "Distribution strategy.", choices=STRATEGIES)
    precision: str = opt("32-true", "Numeric precision.", choices=PRECISIONS)
    compile: bool = opt(False, "torch.compile the model (warm-up steps run before the timer).")
    compile_mode: str = opt("default", "torch.compile mode.", choices=COMPILE_MODES)
    warmup_compile_steps: int = opt(3, "Untimed steps that trigger compilation before timing starts.", min=0)
    accelerator: str = opt("auto", "auto|gpu|cpu; cpu runs a GPU-shaped job on CPU with gloo (tests).", choices=ACCELERATORS)
    num_nodes: int = opt(0, "Nodes the engine uses; 0 = slurm.nodes (must equal it).", min=0)
    devices: int = opt(0, "Devices (ranks) per node; 0 = slurm.gpus_per_node, or 1.", min=0)
    model: str = opt("distilbert-base-uncased", "Hugging Face model name, local path, or builtin:tiny.")
    epochs: int = opt(3, "Training epochs.", min=1)
    batch_size: int = opt(16, "Per-device training batch size.", min=1)
    eval_batch_size: int = opt(64, "Per-device evaluation batch size.", min=1)
    grad_accum: int = opt(1, "Gradient accumulation steps.", min=1)
    lr: float = opt(5e-5, "AdamW learning rate.", min=0)
    weight_decay: float = opt(0.01, "AdamW weight decay.", min=0)
    warmup_steps: int = opt(0, "Linear warm-up steps of the learning rate.", min=0)
    warmup_ratio: float = opt(0.0, "Warm-up as a fraction of all steps (used when warmup_steps = 0).", min=0)
    seed: int = opt(42, "Random seed (data partition, init, shuffling).", min=0)
    deterministic: bool = opt(False, "Deterministic algorithms (slower).")
    num_workers: int = opt(2, "DataLoader worker processes per rank.", min=0)
    log_every_n_steps: int = opt(50, "Write a metrics row every N optimizer steps.", min=1)
    max_steps: int = opt(0, "Stop after N optimizer steps; 0 = no limit.", min=0)
    loggers: list[str] = opt(["csv"], "Where metrics go: csv (metrics.csv, always written), tensorboard, wandb, mlflow.",
                             kind="loggers")
    wandb_mode: str = opt("offline", "W&B on the nodes: offline (upload later with `jobgen sync`), online, disabled.",
                          choices=WANDB_MODES)
    mlflow_uri: str = opt("", "MLflow tracking URI; empty = $MLFLOW_TRACKING_URI on the node, else RUN/mlruns (a file store).")


@dataclass(frozen=True)
class DataSection:
    dataset: str = opt("", "Hub dataset (imdb, glue), builtin:synthetic, or empty to use `files`.")
    config: str = opt("", "Hub dataset configuration, e.g. mrpc.")
    files: dict[str, str] = opt({}, "Local files by split: {train = 'a.csv', test = 'b.csv'} (relative to this file).", kind="files")
    format: str = opt("auto", "Format of local files (auto = from the extension).", choices=DATA_FORMATS)
    encoding: str = opt("utf-8", "Text encoding of local files (e.g. latin-1).", kind="encoding")
    text_field: str = opt("text", "Column with the text (first sentence of a pair).")
    text_pair_field: str = opt("", "Column with the second sentence, for sentence-pair tasks.")
    label_field: str = opt("label", "Column with the label (ints, or strings mapped to ids).")
    train_split: str = opt("train", "Source split used for training.")
    validation_split: str = opt("", "Source split for validation; empty = carve val_fraction of train.")
    test_split: str = opt("test", "Source split used for the final test.")
    partition: list[int | float] = opt([], "[train, val, test] sizes (or fractions) cut from all splits pooled.", kind="partition")
    val_fraction: float = opt(0.1, "Share of train kept for validation when there is no validation split.", min=0)
    max_samples: int = opt(0, "Cap every split at N samples (quick runs); 0 = all.", min=0)
    max_length: int = opt(512, "Truncate sequences to this many tokens.", min=8)
    padding: str = opt("dynamic", "dynamic = pad each batch to its longest; max_length = pad all to max_length.", choices=PADDINGS)
    group_by_length: bool = opt(False, "Batch samples of similar length together (less padding).")


@dataclass(frozen=True)
class LaunchSection:
    backend: str = opt("sbatch", "How jobs are started: sbatch, submitit, or local (this machine).", choices=BACKENDS)
    launcher: str = opt("srun", "Who starts the ranks: srun (one task per device), torchrun or accelerate (one task per node).", choices=LAUNCHERS)
    template: str = opt("", "Your own Jinja template (relative to this file); it may extend srun.sbatch.j2.")
    array: bool = opt(False, "Submit a sweep as one Slurm job array.")
    array_parallelism: int = opt(0, "Most array tasks running at once (--array=...%N); 0 = no limit.", min=0)
    cache_dir: str = opt("", "Cache for tokenized data and built models; default OUTPUT_ROOT/.cache.")


@dataclass(frozen=True)
class SweepSection:
    grid: dict[str, list[Any]] = opt({}, "Dotted key -> list of values; every combination becomes a job.", kind="grid")
    points: list[dict[str, Any]] = opt([], "Explicit jobs: tables of dotted key -> value, optional `name`.", kind="points")
    max_jobs: int = opt(10000, "Refuse sweeps larger than this (raise it on purpose for huge sweeps).", min=1)


SECTIONS: dict[str, type] = {
    "experiment": ExperimentSection,
    "slurm": SlurmSection,
    "env": EnvSection,
    "train": TrainSection,
    "data": DataSection,
    "launch": LaunchSection,
    "sweep": SweepSection,
}

# Sections whose keys a sweep may vary.
SWEEPABLE = ("slurm", "env", "train", "data")


def field_map(section: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(section)}


def type_name(tp: Any) -> str:
    text = tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))
    return text.replace("typing.", "")


def schema_rows() -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, doc) for every key, in file order."""
    rows = []
    for section_name, section in SECTIONS.items():
        for f in dataclasses.fields(section):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            rows.append((f"{section_name}.{f.name}", type_name(f.type), repr_default(default), f.metadata["doc"]))
    return rows


def repr_default(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)
