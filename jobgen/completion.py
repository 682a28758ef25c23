"""Shell completion (Click's own mechanism): experiment files, experiment names and run ids.

Enable it with one line in the shell's start-up file, e.g. `eval "$(_JOBGEN_COMPLETE=bash_source jobgen)"`
(docs/getting-started.md, "Shell completion"). Completion runs on every Tab press: it only lists folders, never parses a
manifest or imports anything heavy.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
from click.shell_completion import CompletionItem

from jobgen.facts import RUN_ID_RE


def _output_root(ctx: click.Context) -> Path:
    value = ctx.find_root().params.get("output_root") or os.environ.get("JOBGEN_OUTPUT_ROOT")
    return Path(value) if value else Path("runs")


def run_refs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Experiment names and run ids under the output root (newest runs first), then matching paths."""
    root = _output_root(ctx)
    try:
        experiments = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        experiments = []
    items = [
        CompletionItem(p.name, help="experiment: its latest run") for p in experiments if p.name.startswith(incomplete)
    ]
    runs = []
    for folder in experiments:
        try:
            runs += [(p.name, folder.name) for p in folder.iterdir() if RUN_ID_RE.fullmatch(p.name)]
        except OSError:
            continue
    items += [
        CompletionItem(run_id, help=f"run of {experiment}")
        for run_id, experiment in sorted(runs, reverse=True)
        if run_id.startswith(incomplete)
    ]
    if not items or os.sep in incomplete:
        items.append(CompletionItem(incomplete, type="dir"))  # a run folder given as a path
    return items


def experiment_files(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """*.toml files (and folders to descend into) matching what was typed."""
    folder, _, prefix = incomplete.rpartition(os.sep)
    base = Path(folder or ".")
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    out = []
    for path in entries:
        if not path.name.startswith(prefix) or (path.name.startswith(".") and not prefix.startswith(".")):
            continue
        text = f"{folder}{os.sep}{path.name}" if folder else path.name
        if path.is_dir():
            out.append(CompletionItem(text + os.sep, type="plain"))
        elif path.suffix == ".toml":
            out.append(CompletionItem(text))
    return out
