"""[sweep.halving]: stop a sweep's losers at rungs (asynchronous successive halving, docs/guides/halving.md).

[sweep.halving]
metric = "val_acc"      # default: the primary validation metric
mode = "max"            # default: the metric's own direction
rungs = [1, 3]          # epochs at which jobs are compared, each below train.epochs
# or: min_epochs = 1    # rungs = min_epochs * eta**k below train.epochs (the default, with 1)
eta = 3                 # keep the top 1/eta at each rung (at least 2)
"""

from __future__ import annotations

import itertools
from typing import Any

from training import halving
from training.contract import show

KEYS = ("metric", "mode", "rungs", "min_epochs", "eta")
MODES = ("max", "min")
MAX_ETA = 1000


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def problems(
    table: dict[str, Any], epochs: int, *, has_sweep: bool, swept: set[str], engine: str
) -> list[tuple[str, str]]:
    """(key in [sweep.halving], problem) for each thing wrong, in key order; [] for an empty table."""
    if not table:
        return []
    out: list[tuple[str, str]] = []
    for key in table:
        if key not in KEYS:
            out.append((key, f"unknown key; valid keys in [sweep.halving]: {', '.join(KEYS)}"))
    if not has_sweep:
        out.append(("", "halving compares the jobs of a sweep: add [sweep.grid], [[sweep.points]] or [sweep.random]"))
    for key in ("train.epochs", "train.engine"):
        if key in swept:
            out.append(("", f"the sweep varies {key}; halving compares jobs that train alike: set it once"))
    if engine not in ("torch", "fabric"):
        out.append(
            ("", f"train.engine = {engine!r} does not stop at rungs yet; use train.engine = 'torch' or 'fabric'")
        )
    metric = table.get("metric", halving.DEFAULT_METRIC)
    if metric not in halving.METRICS:
        out.append(("metric", f"{show(metric)} is not recorded per epoch; use one of {', '.join(halving.METRICS)}"))
    if "mode" in table and table["mode"] not in MODES:
        out.append(("mode", f"must be max or min, got {show(table['mode'])}"))
    eta = table.get("eta", 3)
    if not _is_int(eta) or not 2 <= eta <= MAX_ETA:
        out.append(("eta", f"must be an integer from 2 to {MAX_ETA} (keep the top 1/eta), got {show(eta)}"))
        eta = 3
    if "rungs" in table and "min_epochs" in table:
        out.append(("min_epochs", "give rungs or min_epochs, not both"))
    if "rungs" in table:
        out += [("rungs", p) for p in _rung_problems(table["rungs"], epochs)]
    else:
        low = table.get("min_epochs", 1)
        if not _is_int(low) or low < 1:
            out.append(("min_epochs", f"must be a positive integer, got {show(low)}"))
        elif low >= epochs:
            out.append(("min_epochs", f"{low} leaves no rung below train.epochs = {epochs}; lower it or train longer"))
    return out


def _rung_problems(rungs: Any, epochs: int) -> list[str]:
    if not isinstance(rungs, list) or not rungs or not all(_is_int(r) for r in rungs):
        return [f"must be a non-empty list of epochs (integers), e.g. [1, 3], got {show(rungs)}"]
    if rungs[0] < 1:
        return [f"{rungs[0]} is not an epoch count; rungs start at 1 or more"]
    for a, b in itertools.pairwise(rungs):
        if b <= a:
            return [f"must increase: {b} follows {a}"]
    if rungs[-1] >= epochs:
        return [f"rung {rungs[-1]} is not below train.epochs = {epochs}; a rung stops jobs before the end"]
    return []


def settings(table: dict[str, Any], epochs: int) -> halving.Settings | None:
    """The resolved settings of a valid table; None without halving."""
    if not table:
        return None
    metric = str(table.get("metric", halving.DEFAULT_METRIC))
    mode = str(table.get("mode", halving.METRICS[metric]))
    eta = int(table.get("eta", 3))
    if "rungs" in table:
        rungs = tuple(int(r) for r in table["rungs"])
    else:
        rung, found = int(table.get("min_epochs", 1)), []
        while rung < epochs:
            found.append(rung)
            rung *= eta
        rungs = tuple(found)
    return halving.Settings(rungs=rungs, eta=eta, metric=metric, mode=mode)
