"""Damaged records: which of a run's files cannot be read, each said in one line.

A run outlives full disks, copies that stop halfway, hands that edit and folders deleted by mistake.
Every command that reads a run names what it cannot read (`warning: jobs/a/result.json: truncated
...`) and reports the other jobs as usual; only a damaged manifest stops the commands that need it.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from jobgen.errors import one_line
from jobgen.facts import SCHEMAS
from training.progress import PROGRESS_KEYS

METRICS_FIELDS = ("epoch", "step", "split")  # the columns every metrics.csv starts with
# A job's records, in the order it writes them.
JOB_FILES = ("spec.json", "progress.json", "metrics.csv", "result.json", "retries.json")


def read_json(path: Path) -> tuple[Any, str | None]:
    """(document, None), (None, None) when the file does not exist, or (None, what is wrong with it)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    return parse_json(raw)


def parse_json(raw: bytes) -> tuple[Any, str | None]:
    """(document, None), or (None, what is wrong with these bytes as a JSON record)."""
    if not raw.strip():
        return None, "empty"
    try:
        return json.loads(raw), None
    except UnicodeDecodeError:
        return None, "not UTF-8 text (garbage?)"
    except json.JSONDecodeError as exc:
        return None, f"truncated or not JSON ({exc.msg} at line {exc.lineno})"


def json_problem(path: Path | str, doc: Any, problem: str | None) -> str | None:
    """What is wrong with a job's JSON record (its path, or its file name), given what read_json made of
    it; None when it is fine."""
    if problem or doc is None:
        return problem
    if not isinstance(doc, dict):
        return f"not a JSON object (a {type(doc).__name__})"
    name = path if isinstance(path, str) else path.name  # a str: no pathlib per record
    wanted = SCHEMAS.get(name)
    if wanted is not None and doc.get("schema") != wanted:
        return f"schema {one_line(repr(doc.get('schema')))[:30]} is not {wanted} (written by another jobgen?)"
    if name == "progress.json" and not all(isinstance(doc.get(k), int) for k in PROGRESS_KEYS):
        return f"lacks the integers {', '.join(PROGRESS_KEYS)}"
    return None


def metrics_problem(source: Path | bytes) -> str | None:
    """What is wrong with a metrics.csv (its path, or its bytes); None when it is fine or absent."""
    try:
        text = (source if isinstance(source, bytes) else source.read_bytes()).decode("utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    except UnicodeDecodeError:
        return "not UTF-8 text (garbage?)"
    if not text.strip():
        return "empty"
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        return f"not CSV ({exc})"
    header = rows[0]
    if tuple(header[: len(METRICS_FIELDS)]) != METRICS_FIELDS:
        return f"unknown header {one_line(','.join(header))[:40]!r}"
    if not text.endswith("\n") or any(len(row) != len(header) for row in rows[1:]):
        return "truncated (a row is cut short)"
    return None


def job_problems(run_dir: Path, job: dict[str, Any]) -> list[str]:
    """One line per damaged record of a job (its folder gone, or a file that cannot be read)."""
    rel = str(job.get("dir") or f"jobs/{job.get('name')}")
    folder = run_dir / rel
    if not folder.is_dir():
        return [f"{rel}/: the job's folder is missing (deleted?); it is reported from the manifest alone"]
    out = []
    for name in JOB_FILES:
        path = folder / name
        problem = metrics_problem(path) if name == "metrics.csv" else json_problem(path, *read_json(path))
        if problem:
            out.append(f"{rel}/{name}: {problem}; ignored")
    return out


def run_problems(run_dir: Path, jobs: list[dict[str, Any]]) -> list[str]:
    """Every damaged record of these jobs of a run, each line naming the file under the run folder."""
    return [f"{run_dir}/{line}" for job in jobs for line in job_problems(run_dir, job)]
