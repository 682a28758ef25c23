"""The run's index: what jobgen read from a run's records, kept in the run folder for the next command.

One file per run (INDEX, SQLite by the standard library), written only by jobgen's commands. One row
per record and what was read of it (the damage check's verdict, a result's numbers, a job's progress):
the record's path under the run, the key, the stamp of the version read (inode, size, mtime, ctime),
the fingerprint of the code that read it, and the value as JSON (SQL NULL for null). A command loads
the rows of a key when it first asks for one: `status` never decodes the results a `summary` keeps.

The one staleness rule: what was read is used only while the record's stamp and the reading code's
fingerprint are both those it was kept with; anything else is read from the record again. The index
holds nothing the records cannot give again: a missing, truncated, locked or garbage index costs time,
never an answer, and the next command that can write it writes a sound one.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

INDEX = "index.sqlite"
# A file changed less than this long ago is read again next time: on a file system with coarse
# timestamps (NFS, 1 s) a rewrite within the same tick could keep its size and mtime.
SETTLED_NS = 2_000_000_000
BUSY_MS = 2_000  # how long a command waits for another's write before it reads the records instead

Stamp = str  # "inode size mtime ctime" (ns): what os.stat says of one version, as the index keeps it

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS facts (record TEXT NOT NULL, key TEXT NOT NULL, stamp TEXT NOT NULL, "
    "code TEXT NOT NULL, value TEXT, PRIMARY KEY (record, key)) WITHOUT ROWID"
)
# SQLite's codes for a file that is not a sound database: it is rebuilt, not trusted.
_DAMAGED = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB

_encode = json.JSONEncoder(separators=(",", ":")).encode  # one encoder: json.dumps with options makes one a call
_UNREAD = object()  # a kept value not decoded yet
Kept = dict[str, tuple[Any, Any, Any]]  # record -> (stamp, value as JSON, value or _UNREAD), of one key


def stamp(st: os.stat_result) -> Stamp:
    return f"{st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}"


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


class Index:
    """A run's index: `get(record, stamp, key)` gives what was read for `key` of the record at `record`
    (its path under the run folder) when its stamp is `stamp`, with this code; `keep` adds what was
    read of the version read, and `save` writes what was added. Every failure to read the index reads
    as "nothing kept"; every failure to write it keeps nothing."""

    def __init__(self, run_dir: Path | str) -> None:
        self.path = os.path.join(run_dir, INDEX)
        self._kept: dict[str, Kept] = {}  # key -> its rows, loaded at its first question
        self._changed: dict[tuple[str, str], tuple[str, str | None]] = {}  # (record, key) -> (stamp, value)
        self._damaged = False

    def _rows(self, key: str) -> Kept:
        found = self._kept.get(key)
        if found is None:
            found = self._kept[key] = self._load(key)
        return found

    def _load(self, key: str) -> Kept:
        if not os.path.exists(self.path):
            return {}
        try:
            with contextlib.closing(_connect(self.path)) as db:
                rows = db.execute(
                    "SELECT record, stamp, value FROM facts WHERE key = ? AND code = ?", (key, fingerprint())
                )
                return {record: (mark, value, _UNREAD) for record, mark, value in rows}
        except sqlite3.Error as exc:
            self._damaged = self._damaged or _is_damaged(exc)
            return {}

    def get(self, record: str, mark: Stamp, key: str) -> tuple[bool, Any]:
        """(True, the value) when this version of the record was read for `key`, else (False, None)."""
        found = self._rows(key).get(record)
        if found is None or found[0] != mark:
            return False, None
        if found[2] is not _UNREAD:
            return True, found[2]  # kept by this command: the value itself, not decoded again
        if found[1] is None:
            return True, None
        try:
            return True, json.loads(found[1])
        except (ValueError, TypeError, RecursionError):
            return False, None

    def keep(self, record: str, mark: Stamp, key: str, value: Any) -> None:
        """Keep what was read for `key` (a JSON value) of this version of the record, unless it changed
        too recently."""
        if time.time_ns() - int(mark.split(" ")[2]) < SETTLED_NS:
            return
        row = (mark, None if value is None else _encode(value))
        rows = self._rows(key)
        found = rows.get(record)
        if found is None or found[:2] != row:
            self._changed[record, key] = row
        rows[record] = (*row, value)

    def save(self) -> None:
        """Write the rows keep() changed: one writer at a time (SQLite's lock, rollback journal); a locked,
        read-only or full run folder keeps nothing this time. A damaged index is replaced whole."""
        if not self._changed:
            return
        code = fingerprint()
        rows = [(record, key, mark, code, value) for (record, key), (mark, value) in self._changed.items()]
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

    def _replace(self, rows: list[tuple[str, str, str, str, str | None]]) -> None:
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


def _write(path: str, rows: list[tuple[str, str, str, str, str | None]]) -> None:
    try:
        db = _connect(path)
    except sqlite3.Error:
        return  # a read-only folder: nothing kept
    with contextlib.closing(db):
        db.execute(_SCHEMA)
        db.execute("BEGIN IMMEDIATE")  # the write lock first: a second writer waits, then writes after
        try:
            db.executemany("INSERT OR REPLACE INTO facts VALUES (?, ?, ?, ?, ?)", rows)
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise


def _is_damaged(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in _DAMAGED or "not a database" in str(exc) or "malformed" in str(exc)
