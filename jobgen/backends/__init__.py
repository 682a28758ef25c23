"""The schedulers jobs can be started with (`launch.backend`): one module per backend in this folder.

A module's file name is the backend's name, and it defines SCHEDULER (a jobgen.backends._base.Scheduler).
Modules whose names start with "_" are shared code. Names are found without importing the modules,
so the CLI stays fast; a scheduler is imported when a run needs it.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jobgen.backends._base import Scheduler
from jobgen.errors import BackendError

__all__ = ["Scheduler", "extra_clashes", "get", "names"]


@functools.cache
def names() -> tuple[str, ...]:
    """Every backend's name, sorted."""
    found = (m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]))
    return tuple(sorted(n for n in found if not n.startswith("_")))


@functools.cache
def get(name: str) -> Scheduler:
    if name not in names():
        raise BackendError(f"unknown backend {name!r}; use {', '.join(names())}")
    scheduler = importlib.import_module(f"jobgen.backends.{name}").SCHEDULER
    assert isinstance(scheduler, Scheduler) and scheduler.name == name, name
    return scheduler


def extra_clashes(slurm: Mapping[str, Any], extra: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The `slurm.extra` flags that ask again for a resource a `[slurm]` key already asks for, each with
    the sbatch option it duplicates (Slurm's own vocabulary, so it lives with the Slurm backends)."""
    from jobgen.backends import _slurm

    return _slurm.extra_clashes(slurm, extra)
