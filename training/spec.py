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
from typing import TYPE_CHECKING, Any, TypeVar

from training import contract
from training.contract import is_fsdp, resolve_partition

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "DataSpec",
    "RequeueSpec",
    "Spec",
    "SpecError",
    "TrainSpec",
    "from_dict",
    "is_fsdp",
    "load",
    "resolve_partition",
    "to_dict",
    "validate",
]

# The train and data keys are the contract's: one description for jobgen and for this code.
TrainSpec = contract.Train
DataSpec = contract.Data


class SpecError(ValueError):
    """The spec cannot be run as written; the message says which key and what is allowed."""


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
    container: dict[str, Any] = field(default_factory=dict)  # runtime and image, when the job ran in one
    probe: dict[str, Any] = field(default_factory=dict)  # a probe's step budget (training/probe.py); {} = the job

    @property
    def checkpoint_dir(self) -> Path:
        return self.job_dir / "checkpoints"


_T = TypeVar("_T", bound="DataclassInstance")


def _build(cls: type[_T], raw: dict[str, Any], where: str) -> _T:
    names = {f.name for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" Did you mean {where}.{close[0]}?" if close else ""
            raise SpecError(f"unknown key {where}.{key}.{hint} Valid: {', '.join(sorted(names))}")
    return cls(**raw)


def validate(spec: Spec) -> None:
    """Reject values and combinations no engine can run, with the fix in the message: the contract's
    checks of every key, then its rules between keys."""
    problems = [
        f"{key}: {problem}"
        for key, problem in contract.section_problems("train", spec.train)
        + contract.section_problems("data", spec.data)
    ]
    problems += [f"{key} = {problem}" for key, problem in contract.shape_problems(spec.train)]
    problems += [f"{key} = {problem}" for key, problem in contract.data_problems(spec.data)]
    if problems:
        raise SpecError(problems[0])


def from_dict(raw: dict[str, Any]) -> Spec:
    raw = dict(raw)
    if raw.get("schema", 1) != 1:
        raise SpecError(f"spec schema {raw.get('schema')!r} is not supported (this code reads schema 1)")
    train = _build(TrainSpec, raw.pop("train", {}), "train")
    # 0 = "as many as the job has": jobgen fills these in; a spec written by hand runs one process.
    train = dataclasses.replace(train, num_nodes=train.num_nodes or 1, devices=train.devices or 1)
    # A preset fills the data keys the spec left at their defaults (jobgen writes them as the user did).
    data = contract.with_preset(_build(DataSpec, raw.pop("data", {}), "data"))
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
    return out
