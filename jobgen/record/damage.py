"""Damaged records: which of a run's files cannot be read, each said in one line.

A run outlives full disks, copies that stop halfway, hands that edit and folders deleted by mistake.
Every command that reads a run names what it cannot read (`warning: jobs/a/result.json: truncated
...`) and reports the other jobs as usual; only a damaged manifest stops the commands that need it.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from jobgen.errors import one_line
from jobgen.facts import SCHEMAS
from training.progress import PROGRESS_KEYS

METRICS_FIELDS = ("epoch", "step", "split")  # the columns every metrics.csv starts with
# A job's records, in the order it writes them.
JOB_FILES = ("spec.json", "progress.json", "metrics.csv", "result.json", "retries.json")


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


def json_problem(name: str, doc: Any, problem: str | None) -> str | None:
    """What is wrong with a job's JSON record `name`, given what parse_json made of it; None when it is
    fine."""
    if problem or doc is None:
        return problem
    if not isinstance(doc, dict):
        return f"not a JSON object (a {type(doc).__name__})"
    wanted = SCHEMAS.get(name)
    if wanted is not None and doc.get("schema") != wanted:
        return f"schema {one_line(repr(doc.get('schema')))[:30]} is not {wanted} (written by another jobgen?)"
    if name == "progress.json" and not all(isinstance(doc.get(k), int) for k in PROGRESS_KEYS):
        return f"lacks the integers {', '.join(PROGRESS_KEYS)}"
    return None


def metrics_problem(raw: bytes) -> str | None:
    """What is wrong with a metrics.csv's bytes; None when they are fine."""
    try:
        text = raw.decode("utf-8")
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
