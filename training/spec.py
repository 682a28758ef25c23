"""Typed, read-only view of the job's spec.json (see docs/contracts.md).

Unknown keys are errors that name the dotted key: a typo in a sweep must fail at start, not run the
default silently for hours.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENGINES = ("torch", "lightning", "fabric", "hf_trainer")
STRATEGIES = (
    "auto", "ddp", "fsdp", "fsdp_offload", "deepspeed_stage_2", "deepspeed_stage_2_offload",
    "deepspeed_stage_3", "deepspeed_stage_3_offload",
)
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "bf16-true")
ACCELERATORS = ("auto", "gpu", "cpu")
PADDINGS = ("dynamic", "max_length")
LOGGERS = ("csv", "tensorboard", "wandb", "mlflow")
WANDB_MODES = ("offline", "online", "disabled")


def is_fsdp(strategy: str) -> bool:
    return strategy in ("fsdp", "fsdp_offload")


class SpecError(ValueError):
    """The spec cannot be run as written; the message says which key and what is allowed."""


@dataclass(frozen=True)
class TrainSpec:
    engine: str = "lightning"
    strategy: str = "auto"
    precision: str = "32-true"
    compile: bool = False
    compile_mode: str = "default"
    warmup_compile_steps: int = 3
    accelerator: str = "auto"
    num_nodes: int = 1
    devices: int = 1
    model: str = "builtin:tiny"
    epochs: int = 3
    batch_size: int = 16
    eval_batch_size: int = 64
    grad_accum: int = 1
    lr: float = 5e-5
    weight_decay: float = 0.01
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    seed: int = 42
    deterministic: bool = False
    num_workers: int = 2
    log_every_n_steps: int = 50
    max_steps: int = 0
    loggers: tuple[str, ...] = ("csv",)
    wandb_mode: str = "offline"
    mlflow_uri: str = ""

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.devices


@dataclass(frozen=True)
class DataSpec:
    dataset: str = "builtin:synthetic"
    config: str = ""
    files: dict[str, str] = field(default_factory=dict)
    format: str = "auto"
    encoding: str = "utf-8"
    text_field: str = "text"
    text_pair_field: str = ""
    label_field: str = "label"
    train_split: str = "train"
    validation_split: str = ""
    test_split: str = "test"
    partition: tuple[int | float, ...] = ()  # counts, or fractions of all rows (resolve_partition)
    val_fraction: float = 0.1
    max_samples: int = 0
    max_length: int = 512
    padding: str = "dynamic"
    group_by_length: bool = False


@dataclass(frozen=True)
class RequeueSpec:
    enabled: bool = False
    signal: str = "USR2"
    signal_seconds: int = 120


@dataclass(frozen=True)
class Spec:
    train: TrainSpec
    data: DataSpec
    requeue: RequeueSpec
    job_dir: Path
    cache_dir: Path
    experiment: str = ""
    job: str = ""
    run_dir: str = ""
    sweep: dict[str, Any] = field(default_factory=dict)
    schema: int = 1
    # Resources and environment as jobgen resolved them: recorded, not used by training itself.
    slurm: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)

    @property
    def checkpoint_dir(self) -> Path:
        return self.job_dir / "checkpoints"


def _build(cls: type, raw: dict[str, Any], where: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" Did you mean {where}.{close[0]}?" if close else ""
            raise SpecError(f"unknown key {where}.{key}.{hint} Valid: {', '.join(sorted(names))}")
    values = dict(raw)
    if "partition" in values:
        values["partition"] = tuple(values["partition"])
    if "loggers" in values:
        values["loggers"] = tuple(values["loggers"])
    return cls(**values)


def _check_choice(value: str, choices: tuple[str, ...], key: str) -> None:
    if value not in choices:
        raise SpecError(f"{key}={value!r} is not one of {', '.join(choices)}")


def validate(spec: Spec) -> None:
    """Reject combinations no engine can run, with the fix in the message."""
    t, d = spec.train, spec.data
    _check_choice(t.engine, ENGINES, "train.engine")
    _check_choice(t.strategy, STRATEGIES, "train.strategy")
    _check_choice(t.precision, PRECISIONS, "train.precision")
    _check_choice(t.accelerator, ACCELERATORS, "train.accelerator")
    _check_choice(d.padding, PADDINGS, "data.padding")
    for name in t.loggers:
        _check_choice(name, LOGGERS, "train.loggers")
    _check_choice(t.wandb_mode, WANDB_MODES, "train.wandb_mode")
    if t.engine == "torch" and t.strategy not in ("auto", "ddp"):
        raise SpecError("train.engine='torch' is the plain loop, on one device or DDP: use strategy 'auto' or "
                        "'ddp', or engine 'lightning'/'fabric'/'hf_trainer' for sharded strategies")
    if d.partition:
        _check_partition(d.partition)
    if t.epochs < 1 or t.batch_size < 1 or t.grad_accum < 1:
        raise SpecError("train.epochs, train.batch_size and train.grad_accum must be >= 1")


def _check_partition(sizes: tuple[int | float, ...]) -> None:
    counts = all(isinstance(n, int) or float(n).is_integer() and n >= 1 for n in sizes)
    fractions = all(0 < n < 1 for n in sizes) and sum(sizes) <= 1 + 1e-9
    if len(sizes) != 3 or any(isinstance(n, bool) for n in sizes) or not (counts and min(sizes) >= 1 or fractions):
        raise SpecError(f"data.partition={list(sizes)}: give three counts [train, val, test] (e.g. [35000, "
                        "5000, 10000]) or three fractions that sum to at most 1 (e.g. [0.8, 0.1, 0.1])")


def resolve_partition(sizes: tuple[int | float, ...], rows: int) -> tuple[int, int, int]:
    """Counts from data.partition: counts as given; fractions of `rows` rounded down, and when the
    fractions add up to 1, train takes the rows that rounding left over (no row is dropped)."""
    if all(isinstance(n, int) or float(n).is_integer() and n >= 1 for n in sizes):
        train, val, test = (int(n) for n in sizes)
        return train, val, test
    val, test = (int(f * rows) for f in sizes[1:])
    train = rows - val - test if abs(sum(sizes) - 1) <= 1e-9 else int(sizes[0] * rows)
    return train, val, test


def from_dict(raw: dict[str, Any]) -> Spec:
    raw = dict(raw)
    if raw.get("schema", 1) != 1:
        raise SpecError(f"spec schema {raw.get('schema')!r} is not supported (this code reads schema 1)")
    train = _build(TrainSpec, raw.pop("train", {}), "train")
    data = _build(DataSpec, raw.pop("data", {}), "data")
    requeue = _build(RequeueSpec, raw.pop("requeue", {}), "requeue")
    if "job_dir" not in raw:
        raise SpecError("spec has no job_dir")
    raw["job_dir"] = Path(raw["job_dir"])
    raw["cache_dir"] = Path(raw.get("cache_dir") or Path(raw["job_dir"]) / "cache")
    spec = _build(Spec, {**raw, "train": train, "data": data, "requeue": requeue}, "spec")
    validate(spec)
    return spec


def load(path: str | Path) -> Spec:
    return from_dict(json.loads(Path(path).read_text()))


def to_dict(spec: Spec) -> dict[str, Any]:
    """The spec as JSON-able data (paths as strings), e.g. for tests that write spec.json."""
    out = dataclasses.asdict(spec)
    out["job_dir"], out["cache_dir"] = str(spec.job_dir), str(spec.cache_dir)
    out["data"]["partition"] = list(spec.data.partition)
    return out
