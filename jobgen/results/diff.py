"""What differs between two runs, or two jobs: `jobgen diff A B`.

Everything compared is what the runs recorded (docs/contracts.md): the resolved experiment (the file
with its site's values and --set items applied; a job: its resolved spec.json), the git SHA,
code.patch and the code/training/ snapshot, the package versions and hosts in result.json, the site
in the manifest, and the results, read through the summary's own rows. Each group holds only what
differs; an empty group means "no differences". A side none of whose jobs has a result (a dry run, a
pending job) is named in `not_run`, and its packages and hosts are not compared. Damaged records are
named in `warnings` (one line each) and left out, never raised; `notes` say what was read instead of
a record a run does not have (a run recorded before runs kept their resolved experiment).
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobgen.errors import JobgenError
from jobgen.experiment import resolved
from jobgen.record.model import Run, RunJob
from jobgen.results.collect import collect_run
from jobgen.results.summary import HEADERS, build_lines, cells, record

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
    notes: list[str] = []
    rows_a, rows_b = _rows(a), _rows(b)
    not_run = {"a": _not_run(a, rows_a), "b": _not_run(b, rows_b)}
    ran = not_run["a"] is None and not_run["b"] is None
    return {
        "a": _head(a),
        "b": _head(b),
        "not_run": not_run,
        **_experiment(_settings(a, "A", warnings, notes), _settings(b, "B", warnings, notes)),
        "code": _code(a, b, warnings),
        "packages": _changed(_packages(a), _packages(b)) if ran else {},
        "cluster": _changed(_cluster(a, ran), _cluster(b, ran)),
        "results": _results(a, b, rows_a, rows_b),
        "warnings": warnings,
        "notes": notes,
    }


def _head(side: Side) -> dict[str, Any]:
    return {"run": str(side.run.run_dir), "run_id": side.run.run_id, "job": side.job.name if side.job else None}


def _changed(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Pair]:
    """Only the keys whose values differ, sorted: key -> [A's, B's]."""
    return {key: [a.get(key), b.get(key)] for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)}


# --- experiment keys --------------------------------------------------------------------------------------


def _experiment(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """The experiment keys whose values differ, a key at its default counted as left out
    (resolved.set_apart_from_defaults), each shown by its value, or its default where a side left it
    out, and per side the keys it left out."""
    from jobgen.experiment.schema import defaults

    known = defaults()
    set_a, set_b = resolved.set_apart_from_defaults(a), resolved.set_apart_from_defaults(b)
    keys = sorted(k for k in set(set_a) | set(set_b) if set_a.get(k) != set_b.get(k))
    changed = {k: [side.get(k, known.get(k)) for side in (a, b)] for k in keys}
    left = {name: [k for k in keys if k not in side and k in known] for name, side in (("a", a), ("b", b))}
    return {"experiment": changed, "experiment_defaults": left}


def _settings(side: Side, name: str, warnings: list[str], notes: list[str]) -> dict[str, Any]:
    """A job: its resolved spec (Slurm resources aside, under cluster); a run: its resolved experiment."""
    if side.job:
        spec = {k: v for k, v in side.job.spec().items() if k not in (*PLACES, "slurm")}
        return resolved.flatten(spec)
    try:
        tree, recorded = resolved.read(side.run.run_dir, side.run.manifest)
    except JobgenError as exc:
        warnings.append(f"{exc.message}; its experiment keys are not compared")
        return {}
    if not recorded:
        notes.append(
            f"{name} was recorded before runs kept {resolved.FILE}: its experiment keys are its experiment.toml "
            "with the --set items and site values its manifest names"
        )
    return resolved.flatten(tree)


def _not_run(side: Side, rows: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Why none of the side's jobs has a result yet (a dry run, jobs that wait or run); None when one has."""
    if any(True for _ in _results_of(side)):
        return None
    if side.run.dry_run:
        return "a dry run, none of its jobs ran"
    states = ", ".join(sorted({str(row["state"]) for row in rows.values()})) or "no state"
    if side.job:
        return f"job {side.job.name} is {states}, with no result yet"
    if len(side.jobs) == 1:
        return f"its one job is {states}, with no result yet"
    return f"none of its {len(side.jobs)} jobs has a result yet: {states}"


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


def _cluster(side: Side, ran: bool) -> dict[str, Any]:
    """Site, the jobs' Slurm resources, and where they ran (only when both sides ran: `ran`)."""

    def pairs() -> Iterable[tuple[str, Any]]:
        site = side.run.manifest.get("site")
        if isinstance(site, dict):
            yield "site", site.get("name")
        for doc in _results_of(side) if ran else ():
            slurm, ran_on = doc.get("slurm"), doc.get("ran_on")
            yield "nodelist", slurm.get("nodelist") if isinstance(slurm, dict) else None
            yield "host", ran_on.get("host") if isinstance(ran_on, dict) else None
        for job in side.jobs:
            slurm = job.spec().get("slurm")
            yield from resolved.flatten(slurm, "slurm.").items() if isinstance(slurm, dict) else ()

    return _merge(pairs())


# --- results ----------------------------------------------------------------------------------------------


def _results(
    a: Side, b: Side, rows_a: Mapping[str, dict[str, Any]], rows_b: Mapping[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each job present in both (two jobs: the pair), its numbers side by side, from the summary's rows."""
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
    shown = {k: v for k, v in doc.items() if k not in ("warnings", "notes")}
    shown["results"] = [{k: v for k, v in r.items() if k != "text"} for r in doc["results"]]
    return json.dumps(shown, indent=2, ensure_ascii=False) + "\n"


def render_text(doc: Mapping[str, Any]) -> str:
    out = [f"A: {_name(doc['a'])}", f"B: {_name(doc['b'])}", ""]
    left = doc.get("experiment_defaults") or {}
    shown = {
        key: [
            f"{_show(value, '(not set)')} (default)" if key in left.get(side, ()) else value
            for side, value in zip("ab", pair, strict=True)
        ]
        for key, pair in doc["experiment"].items()
    }
    out += _pairs("experiment keys", shown, unset="(not set)")
    out += _code_text(doc["code"])
    not_run = [f"{side.upper()} has not run: {why}" for side, why in doc["not_run"].items() if why]
    if not_run:
        out += [f"packages and hosts: not compared ({'; '.join(not_run)})", ""]
    else:
        out += _pairs("packages", doc["packages"])
    out += _pairs("cluster and nodes", doc["cluster"])
    out += _results_text(doc["results"])
    return "\n".join(out).rstrip("\n") + "\n"


def _name(head: Mapping[str, Any]) -> str:
    return str(head["run"]) + (f" (job {head['job']})" if head["job"] else "")


def _pairs(title: str, pairs: Mapping[str, Pair], unset: str = "(none)") -> list[str]:
    if not pairs:
        return [f"{title}: no differences", ""]
    return [f"{title}: {len(pairs)} differ{'s' if len(pairs) == 1 else ''}", *_pair_lines(pairs, unset), ""]


def _pair_lines(pairs: Mapping[str, Pair], unset: str = "(none)") -> list[str]:
    width = max(len(k) for k in pairs)
    return [f"  {k:<{width}}  {_show(a, unset)}  ->  {_show(b, unset)}" for k, (a, b) in pairs.items()]


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


def _show(value: Any, unset: str = "(none)") -> str:
    return unset if value is None else (value or '""') if isinstance(value, str) else json.dumps(value)


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
