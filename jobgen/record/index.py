"""The run's index: what jobgen read from a run's records, kept in the run folder for the next command.

One file per run (INDEX, SQLite by the standard library), written only by jobgen's commands. Each row
holds what was read from the records of one folder (a job's folder; the run folder, for the manifest),
one JSON object: for each record read (a job's file, the manifest) its stamp (inode, size, mtime,
ctime) and what was read, by key (the damage check's verdict, a result's numbers, a job's progress);
the row names the fingerprint of the code that read it. A job's facts are one row: a settled read is one SELECT and one decode per job.

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

Stamp = tuple[int, int, int, int]  # inode, size, mtime, ctime (ns): what os.stat says of one version

_SCHEMA = "CREATE TABLE IF NOT EXISTS folders (folder TEXT PRIMARY KEY, code TEXT NOT NULL, read BLOB NOT NULL)"
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


def _split(rel: str) -> tuple[str, str]:
    """A record's path under the run -> (its folder's row, its name there): "jobs/a/result.json" ->
    ("jobs/a", "result.json"); "manifest.json" -> ("", "manifest.json")."""
    folder, _, name = rel.rpartition("/")
    return folder, name


class Index:
    """A run's index, read at the first question and written by `save`.

    `row(rel, stamp)` gives what was read from the record at `rel` (under the run folder) when its
    stamp is `stamp`, with this code; `keep` adds what was read of the version read. Every failure to read the
    index reads as "nothing kept"; every failure to write it keeps nothing."""

    def __init__(self, run_dir: Path | str) -> None:
        self.path = os.path.join(run_dir, INDEX)
        self._rows: dict[str, bytes] | None = None  # folder -> its row's JSON, as loaded
        self._folders: dict[str, dict[str, Any]] = {}  # folder -> name -> [stamp, read], decoded once
        self._changed: set[str] = set()
        self._damaged = False

    @property
    def rows(self) -> dict[str, bytes]:
        if self._rows is None:
            self._rows = self._load()
        return self._rows

    def _load(self) -> dict[str, bytes]:
        if not os.path.exists(self.path):
            return {}
        try:
            with contextlib.closing(_connect(self.path)) as db:
                found = db.execute("SELECT folder, read FROM folders WHERE code = ?", (fingerprint(),))
                return dict(found.fetchall())
        except sqlite3.Error as exc:
            self._damaged = _is_damaged(exc)
            return {}

    def _folder(self, folder: str) -> dict[str, Any]:
        """What was read of the folder's records, by name (decoded at its first question)."""
        found = self._folders.get(folder)
        if found is None:
            found = self._folders[folder] = _decode(self.rows.get(folder))
        return found

    def row(self, rel: str, mark: Stamp) -> dict[str, Any] | None:
        """What was read of this version of the record, by key; None when nothing is kept."""
        folder, name = _split(rel)
        entry = self._folder(folder).get(name)
        if type(entry) is not list or len(entry) != 2 or entry[0] != _text(mark) or type(entry[1]) is not dict:
            return None
        return entry[1]

    def get(self, rel: str, mark: Stamp, key: str) -> tuple[bool, Any]:
        """(True, the value) when this version of the record was read for `key`, else (False, None)."""
        read = self.row(rel, mark)
        if read is not None and key in read:
            return True, read[key]
        return False, None

    def keep(self, rel: str, mark: Stamp, key: str, value: Any) -> None:
        """Keep what was read for `key` (a JSON value) of this version of the record, unless it changed
        too recently."""
        if time.time_ns() - mark[2] < SETTLED_NS:
            return
        read = self.row(rel, mark)
        folder, name = _split(rel)
        if read is None:
            read = {}
            self._folder(folder)[name] = [_text(mark), read]  # what was read of another version goes
        if key not in read or read[key] != value:
            read[key] = value
            self._changed.add(folder)

    def save(self) -> None:
        """Write the rows keep() changed: one writer at a time (SQLite's lock, rollback journal); a locked,
        read-only or full run folder keeps nothing this time. A damaged index is replaced whole."""
        if not self._changed:
            return
        code = fingerprint()
        rows = [
            (folder, code, json.dumps(self._folders[folder], separators=(",", ":")).encode())
            for folder in self._changed
        ]
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

    def _replace(self, rows: list[tuple[str, str, bytes]]) -> None:
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


def _decode(text: bytes | str | None) -> dict[str, Any]:
    """A row's JSON as {name: [stamp, read]}; {} for none, or for one that is not an object."""
    if text is None:
        return {}
    try:
        found = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return found if type(found) is dict else {}


def _connect(path: str) -> sqlite3.Connection:
    # isolation_level None: the transactions are the ones written out below. SQLite's default rollback
    # journal, never WAL: its shared memory does not work on the network file systems run folders live on.
    return sqlite3.connect(path, timeout=BUSY_MS / 1000, isolation_level=None)


def _write(path: str, rows: list[tuple[str, str, bytes]]) -> None:
    try:
        db = _connect(path)
    except sqlite3.Error:
        return  # a read-only folder: nothing kept
    with contextlib.closing(db):
        db.execute(_SCHEMA)
        db.execute("BEGIN IMMEDIATE")  # the write lock first: a second writer waits, then writes after
        try:
            db.executemany("INSERT OR REPLACE INTO folders VALUES (?, ?, ?)", rows)
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
    folder, name = _split(rel)
    try:
        with contextlib.closing(_connect(path)) as db:
            row = db.execute(
                "SELECT read FROM folders WHERE folder = ? AND code = ?", (folder, fingerprint())
            ).fetchone()
    except sqlite3.Error:
        return False, None
    index = Index(run_dir)
    index._rows = {folder: row[0]} if row else {}
    return index.get(rel, mark, key)


def keep_one(run_dir: Path | str, rel: str, mark: Stamp, key: str, value: Any) -> None:
    """Keep what was read for `key` of one record as its folder's only value (a run's kind), without
    loading the whole index."""
    index = Index(run_dir)
    index._rows = {}  # the row is written whole: what else it held is not needed
    index.keep(rel, mark, key, value)
    index.save()
