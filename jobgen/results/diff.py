"""What differs between two runs, or two jobs: `jobgen diff A B`.

Everything compared is what the runs recorded (docs/contracts.md): experiment.toml (a job: its
resolved spec.json), the git SHA, code.patch and the code/training/ snapshot, the package versions
and hosts in result.json, the site in the manifest, and the results, read through the summary's own
rows. Each group holds only what differs; an empty group means "no differences". Damaged records are
named in `warnings` (one line each) and left out, never raised.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobgen.errors import JobgenError
from jobgen.record.model import Run, RunJob
from jobgen.results.collect import collect_run
from jobgen.results.summary import HEADERS, build_lines, cells, record

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MAX_LINES = 200  # of one file's unified diff; the rest is counted in a note
# spec.json keys that name where a job lives, not what it ran: they differ between any two runs.
PLACES = ("run_dir", "job_dir", "job")
# The results side by side: (record field, table column) for the JSON and the text.
RESULTS = (
    ("train_s", "train time"),
    ("samples_per_s", "samples/s"),
    ("test_acc", "test acc (%)"),
    ("best_val_acc", "best val acc (%)"),
    ("test_f1", "test F1 (%)"),
)
Pair = list[Any]  # [A's value, B's value]; None where one side has none


@dataclass
class Side:
    """One side of a diff: a run, and one of its jobs when two jobs are compared."""

    run: Run
    job: RunJob | None = None

    @property
    def label(self) -> str:
        return f"{self.run.run_dir}" + (f":{self.job.name}" if self.job else "")

    @property
    def jobs(self) -> list[RunJob]:
        return [self.job] if self.job else self.run.jobs


def diff(a: Side, b: Side) -> dict[str, Any]:
    """The groups that differ between the two sides, as a JSON-able dict; `warnings` name damaged records."""
    if a.run.run_dir.resolve() == b.run.run_dir.resolve() and (a.job and a.job.name) == (b.job and b.job.name):
        raise JobgenError(f"{a.label} is both A and B: name two different runs (or jobs) to diff")
    warnings: list[str] = []
    return {
        "a": _head(a),
        "b": _head(b),
        "experiment": _changed(_settings(a, warnings), _settings(b, warnings)),
        "code": _code(a, b, warnings),
        "packages": _changed(_packages(a), _packages(b)),
        "cluster": _changed(_cluster(a), _cluster(b)),
        "results": _results(a, b),
        "warnings": warnings,
    }


def _head(side: Side) -> dict[str, Any]:
    return {"run": str(side.run.run_dir), "run_id": side.run.run_id, "job": side.job.name if side.job else None}


def _changed(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Pair]:
    """Only the keys whose values differ, sorted: key -> [A's, B's]."""
    return {key: [a.get(key), b.get(key)] for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)}


def flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables as dotted keys: {"train": {"epochs": 1}} -> {"train.epochs": 1}."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{dotted}."))
        else:
            out[dotted] = value
    return out


# --- experiment keys --------------------------------------------------------------------------------------


def _settings(side: Side, warnings: list[str]) -> dict[str, Any]:
    """A job: its resolved spec (Slurm resources aside, under cluster); a run: its experiment.toml."""
    if side.job:
        spec = {k: v for k, v in side.job.spec().items() if k not in (*PLACES, "slurm")}
        return flatten(spec)
    path = side.run.run_dir / "experiment.toml"
    try:
        return flatten(tomllib.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        warnings.append(f"{path}: missing; its experiment keys are not compared")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        warnings.append(f"{path}: unreadable or not TOML ({exc}); ignored")
    return {}


# --- code -------------------------------------------------------------------------------------------------


def _code(a: Side, b: Side, warnings: list[str]) -> dict[str, Any]:
    """{"git": SHA and dirty that differ, "patch": "same" or the diff of the two patches, "files": ...}."""
    patch_a, patch_b = (_text(s.run.run_dir / "code.patch", warnings) or "" for s in (a, b))
    return {
        "git": _changed(_git(a.run), _git(b.run)),
        "patch": "same" if patch_a == patch_b else unified(patch_a, patch_b, "A/code.patch", "B/code.patch"),
        "files": _snapshot_diff(a.run.run_dir / "code" / "training", b.run.run_dir / "code" / "training"),
    }


def same_code(code: Mapping[str, Any]) -> bool:
    return not code["git"] and code["patch"] == "same" and not code["files"]


def _git(run: Run) -> dict[str, Any]:
    git = run.manifest.get("git")
    return {f"git.{k}": v for k, v in git.items()} if isinstance(git, dict) else {}


def _text(path: Path, warnings: list[str]) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        warnings.append(f"{path}: unreadable ({exc}); ignored")
        return None


def _snapshot_diff(a: Path, b: Path) -> dict[str, str]:
    """file (relative to code/training/) -> its unified diff, for every file that differs or is one-sided."""
    files_a, files_b = _files(a), _files(b)
    out = {}
    for rel in sorted(set(files_a) | set(files_b)):
        old, new = files_a.get(rel, b""), files_b.get(rel, b"")
        if old == new:
            continue
        try:
            out[rel] = unified(old.decode(), new.decode(), f"A/{rel}", f"B/{rel}")
        except UnicodeDecodeError:
            out[rel] = "binary files differ"
    return out


def _files(root: Path) -> dict[str, bytes]:
    out = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in names:
            if name.endswith(".pyc"):
                continue
            path = Path(folder, name)
            try:
                out[path.relative_to(root).as_posix()] = path.read_bytes()
            except OSError:
                out[path.relative_to(root).as_posix()] = b"(unreadable)\n"
    return out


def unified(old: str, new: str, old_name: str, new_name: str, limit: int = MAX_LINES) -> str:
    """A unified diff of two texts, cut after `limit` lines with a note saying how many were left out."""
    lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), old_name, new_name, lineterm=""))
    if len(lines) > limit:
        lines = [*lines[:limit], f"... {len(lines) - limit} more diff lines not shown"]
    return "\n".join(lines)


# --- packages, cluster ------------------------------------------------------------------------------------


def _results_of(side: Side) -> Iterable[dict[str, Any]]:
    for job in side.jobs:
        doc, _ = job.json("result.json")  # damaged ones are named by Run.problems
        if isinstance(doc, dict):
            yield doc


def _merge(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """key -> its value, or "v1, v2" when the side's jobs disagree (each value once, sorted)."""
    seen: dict[str, set[str]] = {}
    for key, value in pairs:
        if value is not None and value != "":
            seen.setdefault(key, set()).add(value if isinstance(value, str) else json.dumps(value))
    return {key: ", ".join(sorted(values)) for key, values in seen.items()}


def _packages(side: Side) -> dict[str, Any]:
    def pairs() -> Iterable[tuple[str, Any]]:
        for doc in _results_of(side):
            versions = doc.get("versions")
            if isinstance(versions, dict):
                yield from versions.items()
            ran_on = doc.get("ran_on")
            packages = ran_on.get("packages") if isinstance(ran_on, dict) else None
            for item in packages if isinstance(packages, list) else []:
                name, sep, version = str(item).partition("==")
                if sep:
                    yield name, version

    return _merge(pairs())


def _cluster(side: Side) -> dict[str, Any]:
    def pairs() -> Iterable[tuple[str, Any]]:
        site = side.run.manifest.get("site")
        if isinstance(site, dict):
            yield "site", site.get("name")
        for doc in _results_of(side):
            slurm, ran_on = doc.get("slurm"), doc.get("ran_on")
            yield "nodelist", slurm.get("nodelist") if isinstance(slurm, dict) else None
            yield "host", ran_on.get("host") if isinstance(ran_on, dict) else None
        for job in side.jobs:
            slurm = job.spec().get("slurm")
            yield from flatten(slurm, "slurm.").items() if isinstance(slurm, dict) else ()

    return _merge(pairs())


# --- results ----------------------------------------------------------------------------------------------


def _results(a: Side, b: Side) -> list[dict[str, Any]]:
    """Each job present in both (two jobs: the pair), its numbers side by side, from the summary's rows."""
    rows_a, rows_b = _rows(a), _rows(b)
    if a.job and b.job:
        names = [(a.job.name, b.job.name)]
    else:
        names = [(name, name) for name in rows_a if name in rows_b]
    out = []
    for name_a, name_b in names:
        one, two = rows_a[name_a], rows_b[name_b]
        out.append(
            {
                "job": name_a if name_a == name_b else f"{name_a} | {name_b}",
                "state": [one["state"], two["state"]],
                **{field: [one[field], two[field]] for field, _ in RESULTS},
                "text": {header: [one["text"][header], two["text"][header]] for _, header in RESULTS},
            }
        )
    return out


def _rows(side: Side) -> dict[str, dict[str, Any]]:
    wanted = {job.name for job in side.jobs}
    # From the folder: its states are decided from its files (the one state rule), without asking Slurm.
    rows = [row for row in collect_run(side.run.run_dir) if row.name in wanted]
    out = {}
    for line in build_lines(rows, combine=False):
        shown = dict(zip(HEADERS, cells(line), strict=True))
        out[line.jobs[0].name] = {**record(line), "text": {h: shown[h] for _, h in RESULTS}}
    return out


# --- text -------------------------------------------------------------------------------------------------


def render_json(doc: Mapping[str, Any]) -> str:
    shown = {k: v for k, v in doc.items() if k != "warnings"}
    shown["results"] = [{k: v for k, v in r.items() if k != "text"} for r in doc["results"]]
    return json.dumps(shown, indent=2, ensure_ascii=False) + "\n"


def render_text(doc: Mapping[str, Any]) -> str:
    out = [f"A: {_name(doc['a'])}", f"B: {_name(doc['b'])}", ""]
    out += _pairs("experiment keys", doc["experiment"])
    out += _code_text(doc["code"])
    out += _pairs("packages", doc["packages"])
    out += _pairs("cluster and nodes", doc["cluster"])
    out += _results_text(doc["results"])
    return "\n".join(out).rstrip("\n") + "\n"


def _name(head: Mapping[str, Any]) -> str:
    return str(head["run"]) + (f" (job {head['job']})" if head["job"] else "")


def _pairs(title: str, pairs: Mapping[str, Pair]) -> list[str]:
    if not pairs:
        return [f"{title}: no differences", ""]
    return [f"{title}: {len(pairs)} differ{'s' if len(pairs) == 1 else ''}", *_pair_lines(pairs), ""]


def _pair_lines(pairs: Mapping[str, Pair]) -> list[str]:
    width = max(len(k) for k in pairs)
    return [f"  {k:<{width}}  {_show(a)}  ->  {_show(b)}" for k, (a, b) in pairs.items()]


def _code_text(code: Mapping[str, Any]) -> list[str]:
    if same_code(code):
        return ["code: no differences", ""]
    out = ["code:", *(_pair_lines(code["git"]) if code["git"] else [])]
    out.append("  code.patch: same" if code["patch"] == "same" else "  code.patch differs:")
    if code["patch"] != "same":
        out += _indent(code["patch"])
    for rel, text in code["files"].items():
        out += [f"  code/training/{rel} differs:", *_indent(text)]
    return [*out, ""]


def _show(value: Any) -> str:
    return "(none)" if value is None else value if isinstance(value, str) else json.dumps(value)


def _indent(text: str) -> list[str]:
    return [f"    {line}" for line in text.splitlines()]


def _results_text(results: list[dict[str, Any]]) -> list[str]:
    if not results:
        return ["results: no job in both"]
    out = ["results (A -> B):"]
    for result in results:
        out.append(f"  {result['job']}: {result['state'][0]} -> {result['state'][1]}")
        for header, (a, b) in result["text"].items():
            out.append(f"    {header:<17} {a or '-':>10}  ->  {b or '-'}")
    return out
