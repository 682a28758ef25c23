"""Expand an experiment's sweep into jobs, resolve derived values and check each job's shape.

Every sweep point is validated as a whole experiment and its distributed shape is checked here,
before anything is written or queued: a wrong shape would otherwise show up hours later as a hang
at "Initializing distributed" or as a run that silently uses fewer GPUs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobgen import backends
from jobgen.errors import PlanError
from jobgen.experiment import random_search
from jobgen.experiment.config import Experiment, with_overrides
from jobgen.facts import MAX_NAME, JobShape
from training import contract

_UNSAFE = re.compile(r"[^A-Za-z0-9.-]+")


@dataclass(frozen=True, slots=True)
class Job:
    """One job: its experiment with the sweep point applied and derived values resolved."""

    index: int
    name: str
    sweep: dict[str, Any]
    exp: Experiment

    @property
    def nodes(self) -> int:
        return self.exp.slurm.nodes

    @property
    def devices(self) -> int:
        return self.exp.train.devices

    @property
    def ntasks_per_node(self) -> int:
        return self.exp.slurm.ntasks_per_node

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices


def cache_dir_for(job: Job, output_root: Path) -> Path:
    """The job's cache of tokenized data and built models (launch.cache_dir, else OUTPUT_ROOT/.cache)."""
    custom = job.exp.launch.cache_dir
    return (job.exp.base_dir / custom if custom else output_root / ".cache").expanduser().resolve()


def plan(exp: Experiment) -> list[Job]:
    """All jobs of an experiment, in sweep order. Raises PlanError naming the failing point."""
    points = sweep_points(exp)
    sampled = set(random_search.dist_keys(exp.sweep.random))
    jobs = []
    for index, (label, overrides) in enumerate(points):
        drawn = " sampled by sweep.random" if sampled.intersection(overrides) else ""
        where = f"sweep point {index}{drawn} ({label})" if overrides else ""
        point_exp = with_overrides(exp, overrides, where) if overrides else exp
        point_exp = resolve(point_exp, where)
        check_shape(point_exp, where)
        jobs.append(Job(index=index, name=label, sweep=overrides, exp=point_exp))
    return _unique_names(jobs, exp.name)


def sweep_points(exp: Experiment) -> list[tuple[str, dict[str, Any]]]:
    """(label, overrides) for every job: explicit points x random points x grid combinations, in that
    order (each explicit point gets every random point, each of those every grid combination)."""
    grid = exp.sweep.grid
    points = exp.sweep.points or [{}]
    table = exp.sweep.random
    count = len(points) * (table["n"] if table else 1) * math.prod(len(v) for v in grid.values())
    if count > exp.sweep.max_jobs:
        raise PlanError(
            f"{exp.label}: sweep: {count} jobs exceeds sweep.max_jobs = {exp.sweep.max_jobs}; "
            "shrink the sweep or raise sweep.max_jobs on purpose"
        )
    keys = list(grid)
    drawn = random_search.sample(table) or [{}]
    out = []
    for point in points:
        fixed = {k: v for k, v in point.items() if k != "name"}
        for random_values in drawn:
            for combo in itertools.product(*(grid[k] for k in keys)):
                values = {**random_values, **dict(zip(keys, combo, strict=True))}
                overrides = {**fixed, **values}
                out.append((_label(point.get("name"), values, exp.name if not overrides else ""), overrides))
    return out


def _label(point_name: str | None, values: dict[str, Any], default: str) -> str:
    parts = [point_name] if point_name else []
    parts += [f"{key.rsplit('.', 1)[-1]}-{_token(value)}" for key, value in values.items()]
    return "_".join(parts) or default


def _token(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    text = _UNSAFE.sub("-", str(value)).strip("-.")
    return text or "x"


def _unique_names(jobs: list[Job], experiment: str) -> list[Job]:
    seen: dict[str, int] = {}
    out = []
    for job in jobs:
        name = job.name or experiment
        if len(name) > MAX_NAME:
            digest = hashlib.sha1(name.encode()).hexdigest()[:8]
            name = f"{name[: MAX_NAME - 9]}-{digest}"
        if name in seen:
            name = f"{name}-{job.index}"
        seen[name] = job.index
        out.append(dataclasses.replace(job, name=name))
    return out


def resolve(exp: Experiment, where: str = "") -> Experiment:
    """Fill derived values: devices from GPUs per node, num_nodes from nodes, tasks from devices."""
    slurm, train = exp.slurm, exp.train
    devices = train.devices or slurm.gpus_per_node or 1
    num_nodes = train.num_nodes or slurm.nodes
    _check_pairs(exp, devices, num_nodes, where)
    # srun starts one task per device; torchrun and accelerate run one task per node, which starts the rest.
    ntasks = slurm.ntasks_per_node or (devices if exp.launch.launcher == "srun" else 1)
    return dataclasses.replace(
        exp,
        train=dataclasses.replace(train, devices=devices, num_nodes=num_nodes),
        slurm=dataclasses.replace(slurm, ntasks_per_node=ntasks),
    )


def _check_pairs(exp: Experiment, devices: int, num_nodes: int, where: str) -> None:
    slurm = exp.slurm
    if num_nodes != slurm.nodes:
        raise _shape(
            exp,
            where,
            f"train.num_nodes = {num_nodes} but slurm.nodes = {slurm.nodes}: the ranks would wait for nodes "
            "that never start; make them equal (or leave train.num_nodes = 0)",
        )
    if slurm.gpus_per_node and devices != slurm.gpus_per_node:
        raise _shape(
            exp,
            where,
            f"train.devices = {devices} but slurm.gpus_per_node = {slurm.gpus_per_node}: the job would use "
            "fewer GPUs than it holds (or wait for ones it lacks); make them equal (or leave train.devices = 0)",
        )


def job_shape(exp: Experiment) -> JobShape:
    """What a scheduler's shape rules read of an experiment."""
    return JobShape(
        nodes=exp.slurm.nodes,
        gpus_per_node=exp.slurm.gpus_per_node,
        accelerator=exp.train.accelerator,
        launcher=exp.launch.launcher,
        requeue=exp.slurm.requeue,
    )


def check_shape(exp: Experiment, where: str = "") -> None:
    """Refuse job shapes that cannot work, with the fix in the message."""
    slurm, train, launch = exp.slurm, exp.train, exp.launch
    # The backend's own rules first: a job it cannot start at all needs no finer advice.
    problems = backends.get(launch.backend).shape_problems(job_shape(exp)) + _launcher_problems(exp)
    if launch.launcher == "srun" and slurm.ntasks_per_node != train.devices:
        problems.append(
            f"slurm.ntasks_per_node = {slurm.ntasks_per_node} but train.devices = {train.devices}: srun-launched "
            f"{train.engine} needs one task per device; set slurm.ntasks_per_node = {train.devices} (or 0)"
        )
    problems += [f"{key} = {problem}" for key, problem in contract.shape_problems(train)]
    problems += [f"{key} = {problem}" for key, problem in contract.data_problems(exp.data)]
    if slurm.gpu_type and not slurm.gpus_per_node:
        problems.append(f"slurm.gpu_type = {slurm.gpu_type!r} needs slurm.gpus_per_node > 0")
    if launch.array and not backends.get(launch.backend).can_array:
        able = " or ".join(repr(n) for n in backends.names() if backends.get(n).can_array)
        problems.append(f"launch.array = true needs launch.backend = {able}, not {launch.backend!r}")
    if launch.array_parallelism and not launch.array:
        problems.append("launch.array_parallelism needs launch.array = true")
    if launch.max_queued and not backends.get(launch.backend).can_wave:
        able = " or ".join(repr(n) for n in backends.names() if backends.get(n).can_wave)
        problems.append(f"launch.max_queued needs launch.backend = {able}, not {launch.backend!r}")
    if problems:
        raise _shape(exp, where, problems[0])


def _launcher_problems(exp: Experiment) -> list[str]:
    """Which engine runs under which launcher, and the shape each launcher needs."""
    slurm, train, launch = exp.slurm, exp.train, exp.launch
    problems = []
    name = launch.launcher
    if name != "srun" and slurm.ntasks_per_node != 1:
        problems.append(
            f"slurm.ntasks_per_node = {slurm.ntasks_per_node} but launch.launcher = {name!r} runs one task "
            f"per node and starts train.devices = {train.devices} processes itself; set "
            "slurm.ntasks_per_node = 1 (or 0)"
        )
    if name == "accelerate" and train.engine == "lightning":
        problems.append(
            "train.engine = 'lightning' under launch.launcher = 'accelerate': the Trainer ignores "
            "accelerate's settings; use launcher 'torchrun' (or 'srun')"
        )
    return problems


def _shape(exp: Experiment, where: str, problem: str) -> PlanError:
    prefix = f"{where}: " if where else ""
    return PlanError(f"{exp.label}: {prefix}{problem}")
