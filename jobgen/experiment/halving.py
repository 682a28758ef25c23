"""[sweep.halving]: stop a sweep's losers at rungs (asynchronous successive halving, docs/guides/halving.md).

[sweep.halving]
metric = "accuracy"     # a validation metric the task scores (val_metrics' names); default: the primary
mode = "max"            # default: the metric's own direction (min for mse)
rungs = [1, 3]          # epochs at which jobs are compared, each below train.epochs
# or: min_epochs = 1    # rungs = min_epochs * eta**k below train.epochs (the default, with 1)
eta = 3                 # keep the top 1/eta at each rung (at least 2)
"""

from __future__ import annotations

import itertools
from typing import Any

from training import contract, halving
from training.contract import AUTO, TASKS, Data, show

KEYS = ("metric", "mode", "rungs", "min_epochs", "eta")
MODES = ("max", "min")
MAX_ETA = 1000


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def task_metrics(data: Data) -> tuple[str, tuple[str, ...], str]:
    """(problem type, the validation metrics its jobs score, its primary metric) as the experiment's
    [data] says them (its preset applied); the problem type and primary may be "auto": known only once
    a job reads its data, when every metric of any problem type may be scored."""
    d = contract.with_preset(data)
    if d.problem_type == AUTO:
        return AUTO, contract.METRICS, d.primary_metric
    return d.problem_type, TASKS[d.problem_type].metrics, contract.primary_metric(d.problem_type, d.primary_metric)


def problems(
    table: dict[str, Any],
    epochs: int,
    *,
    has_sweep: bool,
    swept: set[str],
    data: Data | None = None,
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
    for key in ("train.epochs", "train.engine", "data.preset", "data.problem_type"):
        if key in swept:
            out.append(("", f"the sweep varies {key}; halving compares jobs that train alike: set it once"))
    if "metric" not in table and "data.primary_metric" in swept:
        out.append(("metric", "the sweep varies data.primary_metric, the default metric of the rungs: name one here"))
    problem_type, scored, _ = task_metrics(data or Data())
    metric = table.get("metric")
    if metric is not None and (not isinstance(metric, str) or halving.canonical(metric) not in scored):
        of = "" if problem_type == AUTO else f" of {problem_type} jobs"
        out.append(("metric", f"{show(metric)} is not a validation metric{of}; use one of {', '.join(scored)}"))
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


def settings(table: dict[str, Any], epochs: int, data: Data | None = None) -> halving.Settings | None:
    """The resolved settings of a valid table; None without halving. The metric defaults to the primary
    metric of the jobs' task (halving.PRIMARY while the problem type is "auto": each job names it once
    it has read its data), the mode to the metric's direction."""
    if not table:
        return None
    _, _, primary = task_metrics(data or Data())
    metric = halving.canonical(str(table["metric"])) if "metric" in table else primary
    metric = halving.PRIMARY if metric == AUTO else metric
    mode = str(table.get("mode", halving.mode_of(metric)))
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
