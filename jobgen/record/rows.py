"""Kept rows: what a command derived of each job of a run, kept until one of the files it came from changes.

Once every job of a run has ended and its state is recorded, what `jobgen status` shows of it is a
function of the run's record (manifest.json) and of each job's folder and records alone: Slurm is not
asked again. So the command keeps its rows (and the damage warnings) in the run folder, with what they
came from: the digest of the manifest's bytes, and the stat stamps (inode, size, mtime, ctime) of each
job's folder and of each record it holds, taken before they were read. A later command checks those
(one read and hash of the manifest, one stat per folder and record: no JSON parsed but the kept file)
and prints the kept rows when nothing changed; a changed manifest, a journal holding changes since, a
record made, removed, replaced or rewritten in place, and another jobgen (another version, or its
code edited in place) each make it read the run again. A stamp younger than SETTLED_NS is not kept
(a rewrite within the same tick of a coarse clock may keep size and mtime). The file is a cache: it is replaced whole, and a missing, damaged or
foreign one costs one slower command, never a wrong row.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from pathlib import Path
from typing import Any

from jobgen import __version__
from jobgen.record import store
from jobgen.record.damage import SETTLED_NS, Stamp
from jobgen.record.jsonread import dumps, loads
from jobgen.record.model import Run

ROWS_SCHEMA = 1


@functools.lru_cache(maxsize=1)
def code_stamp() -> str:
    """What tells this jobgen's code from another's, besides its version: the names, sizes and mtimes of
    its modules (and training's, which describe the spec). A checkout edited in place keeps its version
    number; its rows are not taken for the edited code's. Once per command: about a hundred stats."""
    import hashlib

    import jobgen
    import training

    seen = []
    for package in (jobgen, training):
        top = os.path.dirname(os.path.abspath(package.__file__ or ""))
        for folder, _, names in os.walk(top):
            for name in sorted(names):
                if name.endswith((".py", ".j2")):
                    st = os.stat(os.path.join(folder, name))
                    seen.append(f"{os.path.relpath(os.path.join(folder, name), top)}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.blake2b("\n".join(sorted(seen)).encode(), digest_size=16).hexdigest()


def rows_path(run_dir: Path | str, command: str) -> str:
    return os.path.join(run_dir, f".rows-{command}.json")


def load(run_dir: Path | str, command: str) -> tuple[Any, list[Any]] | None:
    """(what the command kept for the whole run, one kept value per job) when nothing they came from has
    changed since; None otherwise (read the run)."""
    try:
        with open(rows_path(run_dir, command), "rb") as fh:
            doc = loads(fh.read())
    except (OSError, ValueError, RecursionError):
        return None
    try:
        if doc["schema"] != ROWS_SCHEMA or doc["jobgen"] != __version__ or doc["command"] != command:
            return None
        if doc["code"] != code_stamp():
            return None
        digest, journal, jobs = doc["digest"], doc["journal"], doc["jobs"]
        if type(digest) is not str or type(journal) is not str or type(jobs) is not list:
            return None
        if not store.unchanged(run_dir, digest, journal):
            return None
        base = os.fspath(run_dir)
        values = []
        stat = os.stat
        for rel, folder, files, value in jobs:
            path = base + "/" + rel
            st = stat(path)
            if [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns] != folder:
                return None
            for name, *mark in files:
                st = stat(path + "/" + name)
                if [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns] != mark:
                    return None
            values.append(value)
        return doc["whole"], values
    except (OSError, KeyError, TypeError, ValueError):
        return None  # a record gone or unreadable, or a damaged cache: read the run


def keep(run: Run, command: str, whole: Any, values: list[Any], more: list[list[list[Any]]] | None = None) -> bool:
    """Keep the command's rows of `run` (one JSON value per job, in manifest order, and one for the
    whole run), when the run's record and every job's files are settled and were seen whole; whether
    they were kept. `more`: per job, the stamps ([name, *stamp]) of other files in its folder the rows
    came from (logs). Settled means: unchanged for SETTLED_NS before the run was loaded, so a file
    written while the command ran is never kept. Best effort: a folder that takes no new file keeps
    nothing."""
    if run.digest is None or len(values) != len(run.jobs) or (more is not None and len(more) != len(values)):
        return False
    now = run.loaded_ns or time.time_ns()
    jobs = []
    for n, (job, value) in enumerate(zip(run.jobs, values, strict=True)):
        stamps = job.stamps()
        if stamps is None:
            return False
        folder, files = stamps
        files = files + (more[n] if more is not None else [])
        if not _settled(folder, now) or not all(_settled(tuple(f[1:]), now) for f in files):
            return False
        jobs.append([job.dir, list(folder), files, value])
    doc = {
        "schema": ROWS_SCHEMA,
        "jobgen": __version__,
        "code": code_stamp(),
        "command": command,
        "digest": run.digest,
        "journal": run.journal,
        "whole": whole,
        "jobs": jobs,
    }
    path = rows_path(run.run_dir, command)
    tmp = f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"  # each writer its own: then one rename wins
    try:
        with open(tmp, "wb") as fh:
            fh.write(dumps(doc))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    return True


def forget(run_dir: Path | str, command: str) -> None:
    """Remove what a command kept (it no longer holds: a job is live again)."""
    with contextlib.suppress(OSError):
        os.unlink(rows_path(run_dir, command))


def _settled(mark: Stamp | tuple[int, ...], now: int) -> bool:
    return now - mark[2] >= SETTLED_NS
