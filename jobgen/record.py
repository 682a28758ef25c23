"""The run directory: the only module that writes manifests, always temp-file-then-rename.

A run is built complete in a hidden `.incomplete-<id>` folder and renamed into place, so a failure
while writing leaves no half run behind; later manifest updates hold a lock and replace the file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobgen import __version__
from jobgen.errors import JobgenError, RunNotFound

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 1
_RUN_ID = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{4}$")


def new_run_id() -> str:
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def git_info(path: Path) -> tuple[str | None, bool, str]:
    """(commit, dirty, patch of uncommitted changes) of the checkout holding `path`, or (None, False, '')."""

    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, timeout=30, check=True)
        return out.stdout

    try:
        sha = git("rev-parse", "HEAD").strip()
        patch = git("diff", "HEAD", "--binary")
    except (OSError, subprocess.SubprocessError):
        return None, False, ""
    return sha, bool(patch), patch


def secret_values() -> dict[str, str]:
    """Secret-looking variables of this environment whose values are long enough to be real secrets."""
    from jobgen.config import SECRET_RE

    return {k: v for k, v in os.environ.items() if SECRET_RE.search(k) and len(v) >= 8}


def check_no_secrets(files: dict[str, str]) -> None:
    """Refuse to write a file that contains the value of a secret from the environment."""
    secrets_ = secret_values()
    for name, text in files.items():
        for key, value in secrets_.items():
            if value in text:
                raise JobgenError(
                    f"{name} would contain the value of ${key}; remove it from the experiment file "
                    "(jobs inherit secrets from your shell)"
                )


def write_run(run_dir: Path, files: dict[str, str | bytes], copy_dirs: dict[str, Path]) -> Path:
    """Write a whole run directory at once: into a hidden folder, then rename into place."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = run_dir.parent / f".incomplete-{run_dir.name}"
    made: set[Path] = set()
    try:
        for rel, content in files.items():
            target = tmp / rel
            if target.parent not in made:
                target.parent.mkdir(parents=True, exist_ok=True)
                made.add(target.parent)
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content, encoding="utf-8")
        for rel, source in copy_dirs.items():
            shutil.copytree(source, tmp / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        os.rename(tmp, run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return run_dir


def manifest_doc(run_id: str, exp_name: str, exp_file: Path, backend: str, dry_run: bool,
                 git_sha: str | None, git_dirty: bool, jobs: list[dict[str, Any]], description: str = "") -> dict:
    return {
        "schema": MANIFEST_SCHEMA,
        "run_id": run_id,
        "experiment": exp_name,
        "experiment_file": str(exp_file),
        "description": description,
        "backend": backend,
        "dry_run": dry_run,
        "created": now_iso(),
        "jobgen_version": __version__,
        "git": {"sha": git_sha, "dirty": git_dirty},
        "jobs": jobs,
    }  # fmt: skip


def dumps(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_manifest(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / MANIFEST
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunNotFound(f"{run_dir}: no {MANIFEST}; not a jobgen run directory") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise JobgenError(f"{path}: unreadable ({exc})") from None
    if doc.get("schema") != MANIFEST_SCHEMA:
        raise JobgenError(f"{path}: manifest schema {doc.get('schema')!r} is not {MANIFEST_SCHEMA}; use a matching jobgen")
    return doc


@contextlib.contextmanager
def locked_manifest(run_dir: Path) -> Iterator[dict[str, Any]]:
    """Read-modify-write the manifest under an exclusive lock (submit and status may race)."""
    lock_path = Path(run_dir) / ".manifest.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        doc = load_manifest(run_dir)
        yield doc
        atomic_write(Path(run_dir) / MANIFEST, dumps(doc))


def update_jobs(run_dir: Path, updates: dict[str, dict[str, Any]], key: str = "jobs") -> dict[str, Any]:
    """Merge fields into the named entries of manifest[key] (jobs, or arrays); returns the new manifest."""
    with locked_manifest(run_dir) as doc:
        for entry in doc.get(key, []):
            if entry["name"] in updates:
                entry.update(updates[entry["name"]])
    return doc


def is_run_dir(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def runs_of(experiment_dir: Path) -> list[Path]:
    """Run directories of one experiment, oldest first (run ids sort by time)."""
    if not experiment_dir.is_dir():
        return []
    return sorted(p for p in experiment_dir.iterdir() if _RUN_ID.match(p.name) and is_run_dir(p))


def find_runs(refs: list[str], output_root: Path) -> list[Path]:
    """Resolve what a user typed to run directories: a run path, an experiment name, path or file.

    An experiment (by name, folder or .toml file) means its latest run; no refs means the latest
    run of any experiment under the output root.
    """
    if not refs:
        latest = [runs[-1] for d in _experiment_dirs(output_root) if (runs := runs_of(d))]
        if not latest:
            raise RunNotFound(f"no runs under {output_root}; submit one, or pass --output-root")
        return [max(latest, key=lambda p: p.name)]
    return [_find_one(ref, output_root) for ref in refs]


def _find_one(ref: str, output_root: Path) -> Path:
    path = Path(ref)
    if is_run_dir(path):
        return path.resolve()
    name, runs = _experiment_runs(ref, output_root)
    if runs:
        return runs[-1].resolve()
    if _RUN_ID.match(ref):  # a bare run id, as `jobgen runs` lists and shell completion offers
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
    """All runs of the experiments these runs belong to (for --all-runs), each once, in order."""
    return list(dict.fromkeys(run for run_dir in run_dirs for run in runs_of(run_dir.parent)))


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
    from jobgen.config import load

    return load(path).name


def _experiment_dirs(output_root: Path) -> list[Path]:
    if not output_root.is_dir():
        return []
    return sorted(p for p in output_root.iterdir() if p.is_dir() and not p.name.startswith("."))
