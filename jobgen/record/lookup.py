"""Which run folders a user means: a run path (or EXPERIMENT/RUN_ID under the output root, as `jobgen runs`
lists it), a run id, an experiment name, folder or .toml file.

Commands that read runs resolve what was typed here, then load each run once (jobgen.record.model.Run).
"""

from __future__ import annotations

from pathlib import Path

from jobgen.errors import RunNotFound
from jobgen.facts import RUN_ID_RE
from jobgen.record.store import MANIFEST, run_kind


def is_run_dir(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def runs_of(experiment_dir: Path) -> list[Path]:
    """Run directories of one experiment, oldest first (run ids sort by time)."""
    if not experiment_dir.is_dir():
        return []
    return sorted(p for p in experiment_dir.iterdir() if RUN_ID_RE.fullmatch(p.name) and is_run_dir(p))


def latest_real(runs: list[Path]) -> Path | None:
    """The last submitted run of these: dry runs (`--dry-run`, `--test-only`) and probes (`jobgen probe`)
    are listed by `jobgen runs` but never stand for an experiment's results (nor in --all-runs); such a
    run is read only when named by its folder or run id. The newest runs are asked their kind first."""
    return next((run for run in reversed(runs) if not run_kind(run)), None)


def probe_runs(runs: list[Path]) -> list[Path]:
    """The probes among these runs, in order (the newest last)."""
    return [run for run in runs if run_kind(run) == "probe"]


def find_runs(refs: list[str], output_root: Path) -> list[Path]:
    """Resolve what a user typed to run directories: a run path, an experiment name, path or file.

    An experiment (by name, folder or .toml file) means its latest real run; no refs means the
    latest real run of any experiment under the output root (see latest_real).
    """
    if not refs:
        every = [runs_of(d) for d in _experiment_dirs(output_root)]
        latest = [real for runs in every if (real := latest_real(runs)) is not None]
        if not latest:
            dry = " (only dry runs or probes, which hold no results: name one by its folder)" if any(every) else ""
            raise RunNotFound(f"no submitted runs under {output_root}{dry}; submit one, or pass --output-root")
        return [max(latest, key=lambda p: p.name)]
    return [_find_one(ref, output_root) for ref in refs]


def _find_one(ref: str, output_root: Path) -> Path:
    path = Path(ref)
    for run_dir in (path, output_root / path):  # a path, or EXPERIMENT/RUN_ID under the root as `jobgen runs` lists it
        if is_run_dir(run_dir):
            return run_dir.resolve()
    name, runs = _experiment_runs(ref, output_root)
    real = latest_real(runs)
    if real is not None:
        return real.resolve()
    if runs:
        raise RunNotFound(
            f"{name!r} has only dry runs or probes under {output_root}, which hold no results; submit it without "
            f"--dry-run, or name a dry run by its folder (latest: {runs[-1]})"
        )
    if RUN_ID_RE.match(ref):  # a bare run id, as `jobgen runs` lists and shell completion offers
        found = [d / ref for d in _experiment_dirs(output_root) if is_run_dir(d / ref)]
        if len(found) == 1:
            return found[0].resolve()
    raise RunNotFound(f"no run found for {name!r} under {output_root} (experiments with runs: {_known(output_root)})")


def list_runs(refs: list[str], output_root: Path) -> list[Path]:
    """Every run of the experiments named (names, folders or .toml files; none: all), oldest first."""
    runs = []
    for ref in refs:
        _, found = _experiment_runs(ref, output_root)
        if not found:
            raise RunNotFound(f"no runs of {ref!r} under {output_root} (experiments with runs: {_known(output_root)})")
        runs += found
    if not refs:
        runs = [run for folder in _experiment_dirs(output_root) for run in runs_of(folder)]
    return sorted(runs, key=lambda p: p.name)


def every_run_of(run_dirs: list[Path]) -> list[Path]:
    """All real runs of the experiments these runs belong to (for --all-runs), each once, in order,
    and the dry runs among `run_dirs` themselves (named by their folder)."""
    named = set(run_dirs)
    return list(
        dict.fromkeys(
            run for run_dir in run_dirs for run in runs_of(run_dir.parent) if run in named or not run_kind(run)
        )
    )


def _experiment_runs(ref: str, output_root: Path) -> tuple[str, list[Path]]:
    """(experiment name, its runs oldest first) for what a user typed: a name, a folder or a .toml file."""
    path = Path(ref)
    name = _experiment_name(path) if path.suffix == ".toml" and path.is_file() else ref
    for folder in ([path] if path.is_dir() else []) + [output_root / name]:
        runs = runs_of(folder)
        if runs:
            return name, runs
    return name, []


def _known(output_root: Path) -> str:
    return ", ".join(d.name for d in _experiment_dirs(output_root)) or "none"


def _experiment_name(path: Path) -> str:
    from jobgen.experiment.config import load

    return load(path).name


def _experiment_dirs(output_root: Path) -> list[Path]:
    if not output_root.is_dir():
        return []
    return sorted(p for p in output_root.iterdir() if p.is_dir() and not p.name.startswith("."))
