"""The run's index: what jobgen read from a run's records, kept in the run folder for the next command.

One file per run (INDEX, SQLite by the standard library), written only by jobgen's commands. Each row
holds what was read from one record (a job's file, a job's folder, the manifest): the record's stamp
(inode, size, mtime, ctime), the fingerprint of the code that read it, and what was read, a JSON object
by key (the damage check's verdict, a result's numbers, a job's progress, which records a folder holds).

The one staleness rule: what was read is used only while the record's stamp and the reading code's
fingerprint are both those it was kept with; anything else is read from the record again. The index
holds nothing the records cannot give again: a missing, truncated, locked or garbage index costs time,
never an answer, and the next command that can write it writes a sound one.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from jobgen.record.jsonread import dumps, loads

INDEX = "index.sqlite"
# A file changed less than this long ago is read again next time: on a file system with coarse
# timestamps (NFS, 1 s) a rewrite within the same tick could keep its size and mtime.
SETTLED_NS = 2_000_000_000
BUSY_MS = 2_000  # how long a command waits for another's write before it reads the records instead

Stamp = tuple[int, int, int, int]  # inode, size, mtime, ctime (ns): what os.stat says of one version

_SCHEMA = "CREATE TABLE IF NOT EXISTS records (path TEXT PRIMARY KEY, stamp TEXT NOT NULL, code TEXT NOT NULL, read TEXT NOT NULL)"
# SQLite's codes for a file that is not a sound database: it is rebuilt, not trusted.
_DAMAGED = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB


def stamp(st: os.stat_result) -> Stamp:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@functools.cache
def fingerprint() -> str:
    """A digest of the source of jobgen and of training/progress.py (what the records mean): edited
    reading code never takes what the code before it read. Computed once per process."""
    import jobgen
    import training.progress

    digest = hashlib.sha256()
    top = os.path.dirname(os.path.abspath(jobgen.__file__ or ""))
    files = [os.path.abspath(training.progress.__file__ or "")]
    for folder, dirs, names in os.walk(top):
        dirs.sort()
        files += [os.path.join(folder, n) for n in sorted(names) if n.endswith((".py", ".j2"))]
    for path in files:
        digest.update(os.path.relpath(path, top).encode() + b"\0")
        with contextlib.suppress(OSError), open(path, "rb") as fh:
            digest.update(fh.read())
    return digest.hexdigest()[:32]


def _text(mark: Stamp) -> str:
    return f"{mark[0]} {mark[1]} {mark[2]} {mark[3]}"


class Index:
    """A run's index, read at the first question and written by `save`.

    `row(rel, stamp)` gives what was read from the record at `rel` (under the run folder) when its
    stamp is `stamp`, with this code; `keep` adds what was read of the version read. Every failure to read the
    index reads as "nothing kept"; every failure to write it keeps nothing."""

    def __init__(self, run_dir: Path | str) -> None:
        self.path = os.path.join(run_dir, INDEX)
        self._rows: dict[str, tuple[str, str]] | None = None  # path -> (stamp, read as JSON text)
        self._decoded: dict[str, tuple[str, dict[str, Any]]] = {}  # decoded, and what keep() added
        self._changed: set[str] = set()
        self._damaged = False

    @property
    def rows(self) -> dict[str, tuple[str, str]]:
        if self._rows is None:
            self._rows = self._load()
        return self._rows

    def _load(self) -> dict[str, tuple[str, str]]:
        if not os.path.exists(self.path):
            return {}
        try:
            with contextlib.closing(_connect(self.path)) as db:
                found = db.execute("SELECT path, stamp, read FROM records WHERE code = ?", (fingerprint(),))
                return {path: (mark, read) for path, mark, read in found}
        except sqlite3.Error as exc:
            self._damaged = _is_damaged(exc)
            return {}

    def row(self, rel: str, mark: Stamp) -> dict[str, Any] | None:
        """What was read of this version of the record, by key; None when nothing is kept."""
        text = _text(mark)
        found = self._decoded.get(rel)
        if found is not None:
            return found[1] if found[0] == text else None
        row = self.rows.get(rel)
        if row is None or row[0] != text:
            return None
        try:
            read = loads(row[1])
        except (ValueError, RecursionError):
            return None
        if type(read) is not dict:
            return None
        self._decoded[rel] = (text, read)
        return read

    def get(self, rel: str, mark: Stamp, key: str) -> tuple[bool, Any]:
        """(True, the value) when this version of the record was read for `key`, else (False, None)."""
        read = self.row(rel, mark)
        if read is not None and key in read:
            return True, read[key]
        return False, None

    def knows(self, rel: str) -> bool:
        """Whether a version of the record was read by this code."""
        return rel in self._decoded or rel in self.rows

    def keep(self, rel: str, mark: Stamp, key: str, value: Any) -> None:
        """Keep what was read for `key` (a JSON value) of this version of the record, unless it changed
        too recently."""
        if time.time_ns() - mark[2] < SETTLED_NS:
            return
        read = self.row(rel, mark)
        if read is None:
            read = {}
            self._decoded[rel] = (_text(mark), read)
        if key not in read or read[key] != value:
            read[key] = value
            self._changed.add(rel)

    def save(self) -> None:
        """Write what keep() added: one writer at a time (SQLite's lock, rollback journal); a locked,
        read-only or full run folder keeps nothing this time. A damaged index is replaced whole."""
        if not self._changed:
            return
        code = fingerprint()
        rows = [(rel, self._decoded[rel][0], code, dumps(self._decoded[rel][1]).decode()) for rel in self._changed]
        if self._damaged:
            self._replace(rows)
        else:
            try:
                _write(self.path, rows)
            except sqlite3.Error as exc:
                if not _is_damaged(exc):
                    return
                self._replace(rows)
        self._changed.clear()

    def _replace(self, rows: list[tuple[str, str, str, str]]) -> None:
        """Write a new index beside the damaged one and put it in its place (a reader has one or the other)."""
        tmp = f"{self.path}.{os.getpid()}-{threading.get_ident()}.tmp"  # each writer its own
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            _write(tmp, rows)
            os.replace(tmp, self.path)
            self._damaged = False
        except (sqlite3.Error, OSError):
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _connect(path: str) -> sqlite3.Connection:
    # isolation_level None: the transactions are the ones written out below. SQLite's default rollback
    # journal, never WAL: its shared memory does not work on the network file systems run folders live on.
    return sqlite3.connect(path, timeout=BUSY_MS / 1000, isolation_level=None)


def _write(path: str, rows: list[tuple[str, str, str, str]]) -> None:
    try:
        db = _connect(path)
    except sqlite3.Error:
        return  # a read-only folder: nothing kept
    with contextlib.closing(db):
        db.execute(_SCHEMA)
        db.execute("BEGIN IMMEDIATE")  # the write lock first: a second writer waits, then writes after
        try:
            db.executemany("INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?)", rows)
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise


def _is_damaged(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in _DAMAGED or "not a database" in str(exc) or "malformed" in str(exc)


def one(run_dir: Path | str, rel: str, mark: Stamp, key: str) -> tuple[bool, Any]:
    """Index(run_dir).get for a single record, without loading the whole index (a run's kind)."""
    path = os.path.join(run_dir, INDEX)
    if not os.path.exists(path):
        return False, None
    try:
        with contextlib.closing(_connect(path)) as db:
            row = db.execute(
                "SELECT read FROM records WHERE path = ? AND stamp = ? AND code = ?", (rel, _text(mark), fingerprint())
            ).fetchone()
        read = loads(row[0]) if row else None
    except (sqlite3.Error, ValueError, RecursionError):
        return False, None
    if type(read) is dict and key in read:
        return True, read[key]
    return False, None


def keep_one(run_dir: Path | str, rel: str, mark: Stamp, key: str, value: Any) -> None:
    """Keep what was read for `key` of one record as its only value (a run's kind), without loading
    the whole index."""
    index = Index(run_dir)
    index._rows = {}  # the row is written whole: what else it held is not needed
    index.keep(rel, mark, key, value)
    index.save()
