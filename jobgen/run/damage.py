"""Damaged records: which of a run's files cannot be read, each said in one line.

A run outlives full disks, copies that stop halfway, hands that edit and folders deleted by mistake.
Every command that reads a run names what it cannot read (`warning: jobs/a/result.json: truncated
...`) and reports the other jobs as usual; only a damaged manifest stops the commands that need it.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import time
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


def json_problem(path: Path, doc: Any, problem: str | None) -> str | None:
    """What is wrong with a job's JSON record, given what read_json made of it; None when it is fine."""
    if problem or doc is None:
        return problem
    if not isinstance(doc, dict):
        return f"not a JSON object (a {type(doc).__name__})"
    wanted = SCHEMAS.get(path.name)
    if wanted is not None and doc.get("schema") != wanted:
        return f"schema {one_line(repr(doc.get('schema')))[:30]} is not {wanted} (written by another jobgen?)"
    if path.name == "progress.json" and not all(isinstance(doc.get(k), int) for k in PROGRESS_KEYS):
        return f"lacks the integers {', '.join(PROGRESS_KEYS)}"
    return None


def metrics_problem(path: Path) -> str | None:
    try:
        text = path.read_bytes().decode("utf-8")
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


# --- verdicts kept between commands -------------------------------------------------------------------

VERDICTS = ".verdicts.json"  # in the run folder; a cache: deleting it costs one slower command
VERDICTS_SCHEMA = 1
# A file changed less than this long ago is checked again next time: on a file system with coarse
# timestamps (NFS, 1 s) a rewrite within the same tick could keep size and mtime.
SETTLED_NS = 2_000_000_000

Stamp = tuple[int, int, int, int]  # inode, size, mtime, ctime (ns): what os.stat says of one version


def stamp(st: os.stat_result) -> Stamp:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Verdicts:
    """What the damage checks said of each job file of a run, by the file's stat stamp.

    Reading every job's records to check them costs most of `status` at 10,000 jobs; a file whose inode,
    size, mtime and ctime are those of the version checked before gets the same verdict without being
    read. Every writer of a record replaces it (a new inode) or appends to it (a new size), so a changed
    file is never taken for the one checked. Unreadable or damaged cache files are ignored."""

    def __init__(self, run_dir: Path | str) -> None:
        self.path = os.path.join(run_dir, VERDICTS)
        self._known: dict[str, list[Any]] = {}
        self._changed = False
        try:
            with open(self.path, "rb") as fh:
                doc = json.loads(fh.read())
            if isinstance(doc, dict) and doc.get("schema") == VERDICTS_SCHEMA and isinstance(doc.get("files"), dict):
                self._known = doc["files"]
        except (OSError, ValueError):
            pass

    def get(self, rel: str, mark: Stamp) -> tuple[bool, str | None]:
        """(True, the problem or None) when this version of the file was checked before, else (False, None)."""
        known = self._known.get(rel)
        if isinstance(known, list) and len(known) == 5 and tuple(known[:4]) == mark:
            if known[4] is None or isinstance(known[4], str):
                return True, known[4]
        return False, None

    def put(self, rel: str, mark: Stamp, problem: str | None) -> None:
        if time.time_ns() - mark[2] < SETTLED_NS:
            return  # still settling: checked again next time
        if self._known.get(rel) != [*mark, problem]:
            self._known[rel] = [*mark, problem]
            self._changed = True

    def save(self) -> None:
        """Write the verdicts when they changed; a read-only run folder or a full disk keeps none."""
        if not self._changed:
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump({"schema": VERDICTS_SCHEMA, "files": self._known}, fh, separators=(",", ":"))
            os.replace(tmp, self.path)
            self._changed = False
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
