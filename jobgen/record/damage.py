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
import threading
import time
from pathlib import Path
from typing import Any

from jobgen import __version__
from jobgen.errors import one_line
from jobgen.facts import SCHEMAS
from jobgen.record.jsonread import dumps, loads
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
        return loads(raw), None
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
    name = path if isinstance(path, str) else path.name  # a str: no pathlib per record at 10,000 jobs
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


# --- verdicts kept between commands -------------------------------------------------------------------

VERDICTS = ".verdicts.json"  # in the run folder; a cache: deleting it costs one slower command
VERDICTS_SCHEMA = 2
# A file changed less than this long ago is checked again next time: on a file system with coarse
# timestamps (NFS, 1 s) a rewrite within the same tick could keep size and mtime.
SETTLED_NS = 2_000_000_000
PROBLEM = "problem"  # the damage check's verdict, among the facts kept of a file
PRESENT = "present"  # of a job's folder: which of JOB_FILES it holds
OTHERS = "others"  # of a job's folder: the names of its other entries (its logs among them)

Stamp = tuple[int, int, int, int]  # inode, size, mtime, ctime (ns): what os.stat says of one version


def stamp(st: os.stat_result) -> Stamp:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Verdicts:
    """What was learnt of each job file of a run, by the file's stat stamp: the damage check's verdict,
    and what the commands read out of it (a result's numbers, a job's progress), each under its key;
    and of each job's folder, by its own stamp, which records it holds (an unchanged folder had no file
    made, removed or renamed in it, so a record absent then needs no stat now).

    Reading and parsing every job's records costs most of `status` and `summary` at 10,000 jobs; a file
    whose inode, size, mtime and ctime are those of the version read before gives the same facts without
    being read. Every writer of a record replaces it (a new inode) or appends to it (a new size), and a
    rewrite in place moves its mtime and ctime, so a changed file is never taken for the one read. A file
    written in the last SETTLED_NS is not kept (its stamp may not show the next write yet). The facts are
    those of this jobgen version: another version starts afresh. The file is replaced whole (a reader
    sees the old one or the new one); an unreadable, damaged or foreign cache file is ignored."""

    def __init__(self, run_dir: Path | str) -> None:
        self.path = os.path.join(run_dir, VERDICTS)
        self._version = __version__
        self._loaded: dict[str, list[Any]] | None = None  # read at the first question (`runs` asks none)
        self._changed = False
        self._kept: set[str] | None = None  # what keep() changed, while `track` has it noted

    def load(self) -> None:
        """Read the kept verdicts now (a reader process forked after this shares them)."""
        _ = self._known

    def track(self) -> None:
        """Note from now on which files keep() changes a fact of (`changed` gives them)."""
        self._kept = set()

    def changed(self) -> dict[str, list[Any]]:
        """What was kept of each file keep() changed a fact of since `track`: what a reader process hands
        back (jobgen.record.readers)."""
        known = self._known
        return {rel: known[rel] for rel in self._kept or ()}

    def take(self, kept: dict[str, list[Any]]) -> None:
        """Take what another process kept (`changed`) of files no other took: to be saved with the rest."""
        if kept:
            self._known.update(kept)
            self._changed = True

    @property
    def _known(self) -> dict[str, list[Any]]:
        if self._loaded is None:
            self._loaded = self._load()
        return self._loaded

    def _load(self) -> dict[str, list[Any]]:
        try:
            with open(self.path, "rb") as fh:
                doc = loads(fh.read())
            if (
                isinstance(doc, dict)
                and doc.get("schema") == VERDICTS_SCHEMA
                and doc.get("jobgen") == __version__
                and isinstance(doc.get("files"), dict)
            ):
                return doc["files"]  # type: ignore[no-any-return]
        except (OSError, ValueError, RecursionError):
            pass
        return {}

    def fact(self, rel: str, mark: Stamp, key: str) -> tuple[bool, Any]:
        """(True, the fact) when this version of the file was read before for `key`, else (False, None)."""
        facts = self.facts(rel, mark)
        if facts is not None and key in facts:
            return True, facts[key]
        return False, None

    def facts(self, rel: str, mark: Stamp) -> dict[str, Any] | None:
        """Every fact kept of this version of the file (a folder's listing is two), None when none is."""
        loaded = self._loaded  # asked 40,000 times at 10,000 jobs: no property on the way
        known = (self._known if loaded is None else loaded).get(rel)
        if type(known) is list and len(known) == 5 and tuple(known[:4]) == mark and type(known[4]) is dict:
            return known[4]
        return None

    def knows(self, rel: str) -> bool:
        """Whether any version of the file was read before (a fact of it may be kept)."""
        loaded = self._loaded
        return rel in (self._known if loaded is None else loaded)

    def keep(self, rel: str, mark: Stamp, key: str, value: Any) -> None:
        """Keep a fact (a JSON value) of this version of the file, unless it changed too recently."""
        if time.time_ns() - mark[2] < SETTLED_NS:
            return  # still settling: read again next time
        known = self._known.get(rel)
        if type(known) is not list or len(known) != 5 or tuple(known[:4]) != mark or type(known[4]) is not dict:
            self._known[rel] = known = [*mark, {}]
        if key not in known[4] or known[4][key] != value:
            known[4][key] = value
            self._changed = True
            if self._kept is not None:
                self._kept.add(rel)

    def save(self) -> None:
        """Write the verdicts when they changed; a read-only run folder or a full disk keeps none."""
        if not self._changed:
            return
        tmp = f"{self.path}.{os.getpid()}-{threading.get_ident()}.tmp"  # each writer its own: then one rename wins
        doc = {"schema": VERDICTS_SCHEMA, "jobgen": self._version, "files": self._known}
        try:
            with open(tmp, "wb") as fh:
                fh.write(dumps(doc))
            os.replace(tmp, self.path)
            self._changed = False
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
