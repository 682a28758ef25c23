"""The run directory: the only module that writes manifests, always temp-file-then-rename.

A run is built complete in a hidden `.incomplete-<id>` folder and renamed into place, so a failure
while writing leaves no half run behind; later manifest updates hold a lock and replace the file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobgen import __version__
from jobgen.errors import JobgenError, RunNotFound
from jobgen.facts import MANIFEST_SCHEMA, RUN_ID_RE, SECRET_RE, identity, now_iso, version_of

MANIFEST = "manifest.json"


def new_run_id(output_root: Path | None = None) -> str:
    """A run id for a new run under `output_root`: the time to the second, then 4 hex digits.

    Run ids sort in the order the runs were made (`jobgen status exp` reads an experiment's last, and
    `jobgen status` the last of all), also within one second: the digits are drawn just above the
    highest any experiment under `output_root` took in this second (randomly, a little above, so two
    submits racing in one second seldom draw the same; reserve_run settles a tie). When a second's
    ids run out, the next second's are drawn.
    """
    while True:
        now = dt.datetime.now()
        stamp = now.strftime("%Y%m%d-%H%M%S")
        taken = [p.name for p in output_root.glob(f"*/{stamp}-*")] if output_root else []
        low = max((int(name[-4:], 16) for name in taken if RUN_ID_RE.fullmatch(name)), default=-1) + 1
        if low <= 0xFFFF:
            return f"{stamp}-{low + secrets.randbelow(min(0x100, 0x10000 - low)):04x}"
        time.sleep(1 - now.microsecond / 1e6)


def git_info(path: Path) -> tuple[str | None, bool, str]:
    """(commit, dirty, patch of uncommitted changes) of the checkout holding `path`, or (None, False, '')."""

    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, timeout=30, check=True)
        return out.stdout

    try:
        sha = git("rev-parse", "HEAD").strip()
        patch = git("diff", "HEAD", "--binary")
    except (OSError, subprocess.SubprocessError):
        return None, False, ""
    return sha, bool(patch), patch


def secret_values() -> dict[str, str]:
    """Secret-looking variables of this environment whose values are long enough to be real secrets."""
    return {k: v for k, v in os.environ.items() if SECRET_RE.search(k) and len(v) >= 8}


# Secrets that a job's own code printed, in the shapes their issuers give them (Hugging Face, GitHub,
# OpenAI-style, AWS, Slack), and `NAME=value` where NAME is a secret's (HF_TOKEN, api_key; not tokens_per_s).
_TOKEN_SHAPES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|sk-[A-Za-z0-9_-]{20,}"
    r"|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,})"
)
_NAMED = re.compile(
    r"\b((?:[A-Za-z0-9]+_)*(?:TOKEN|SECRET|KEY|PASSWORD|PASSWD|CREDENTIALS?)(?:_[A-Za-z0-9]+)*\s*=\s*)(\S+)", re.I
)
REDACTED = "[redacted]"


def redact(text: str) -> str:
    """The text with every secret taken out: the values of this environment's secret variables (the
    jobs inherit them), token-shaped strings, and the value after `NAME=` where NAME looks like a secret's."""
    return redactor()(text)


def redactor() -> Callable[[str], str]:
    """redact, with this environment's secrets looked up once (a command redacts every job's log lines)."""
    found = sorted(secret_values().items(), key=lambda kv: -len(kv[1]))

    def named(m: re.Match[str]) -> str:
        return m.group(1) + (m.group(2) if m.group(2).startswith("[redacted") else REDACTED)

    done: dict[str, str] = {}  # a sweep that failed on one line says it once per job: redacted once

    def take_out(text: str) -> str:
        said = done.get(text)
        if said is None:
            said = text
            for key, value in found:
                said = said.replace(value, f"[redacted ${key}]")
            said = done[text] = _NAMED.sub(named, _TOKEN_SHAPES.sub(REDACTED, said))
        return said

    return take_out


def check_no_secrets(files: dict[str, str]) -> None:
    """Refuse to write a file that contains the value of a secret from the environment."""
    secrets_ = secret_values()
    for name, text in files.items():
        for key, value in secrets_.items():
            if value in text:
                raise JobgenError(
                    f"{name} would contain the value of ${key}; remove it from the experiment file "
                    "(jobs inherit secrets from your shell)"
                )


def reserve_run(output_root: Path, experiment: str, run_id: str) -> Path | None:
    """Create the run's folder, empty, and so claim its id; None when the id is taken (two submits in
    one second drew the same one). The folder stays empty, and is no run, until write_run fills it."""
    folder = inside(output_root, experiment)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / run_id).mkdir()
    except (FileExistsError, FileNotFoundError):  # taken, or its experiment folder was just released
        return None
    except OSError as exc:
        raise JobgenError(
            f"cannot create a run under {folder}: {exc.strerror}; free space or choose another --output-root"
        ) from None
    return folder / run_id


def release_run(run_dir: Path) -> None:
    """Give back a reserved run folder that was never filled (and its experiment folder, if now empty)."""
    with contextlib.suppress(OSError):
        run_dir.rmdir()
        run_dir.parent.rmdir()


def inside(folder: Path, *parts: str) -> Path:
    """folder/parts..., refused unless it stays below folder: a name never climbs out of the output root."""
    path = Path(os.path.normpath(folder.joinpath(*parts)))
    if any(p in ("", ".", "..") or os.sep in p for p in parts) or not path.is_relative_to(folder) or path == folder:
        raise JobgenError(f"{'/'.join(parts)!r} would put files outside {folder}; use a plain name")
    return path


def write_run(run_dir: Path, files: dict[str, str | bytes], copy_dirs: dict[str, Path]) -> Path:
    """Fill a reserved (empty) run folder at once: write into a hidden folder, then rename into place.

    A full disk or an unwritable folder leaves nothing behind but the error (the reservation included).
    """
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".incomplete-{run_dir.name}-", dir=run_dir.parent))
    except OSError as exc:
        release_run(run_dir)
        raise JobgenError(
            f"cannot write the run {run_dir}: {exc.strerror}; free space or choose another --output-root"
        ) from None
    made: set[str] = set()
    try:
        for rel, content in files.items():
            # Strings, not pathlib: two files per job. What is not a plain path below the run is refused.
            parts = [p for p in rel.split("/") if p not in ("", ".")]
            if not parts or ".." in parts or rel.startswith("/"):
                inside(tmp, *Path(rel).parts)  # raises, naming the path
            target = os.path.join(tmp, *parts)
            parent = os.path.dirname(target)
            if parent not in made:
                os.makedirs(parent, exist_ok=True)
                made.add(parent)
            with open(target, "wb") as fh:
                fh.write(content if isinstance(content, bytes) else content.encode("utf-8"))
        for rel, source in copy_dirs.items():
            shutil.copytree(source, tmp / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        os.chmod(tmp, 0o777 & ~_umask())
        os.rename(tmp, run_dir)  # onto the empty reserved folder: atomic
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        release_run(run_dir)
        if isinstance(exc, OSError):
            raise JobgenError(
                f"cannot write the run {run_dir}: {exc.strerror or exc}; nothing was submitted; "
                "free space or choose another --output-root"
            ) from None
        raise
    return run_dir


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def manifest_doc(
    run_id: str,
    exp_name: str,
    exp_file: Path,
    backend: str,
    dry_run: bool,
    git_sha: str | None,
    git_dirty: bool,
    jobs: list[dict[str, Any]],
    description: str = "",
) -> dict[str, Any]:
    return {
        "schema": MANIFEST_SCHEMA,
        "run_id": run_id,
        "experiment": exp_name,
        "experiment_file": str(exp_file),
        "description": description,
        "backend": backend,
        "dry_run": dry_run,
        "created": now_iso(),
        "jobgen_version": __version__,
        "git": {"sha": git_sha, "dirty": git_dirty},
        "jobs": jobs,
    }


def dumps(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


_ROWS = ("jobs", "arrays")  # a manifest's lists of entries, one line each


def manifest_text(doc: dict[str, Any]) -> str:
    """A manifest as written: indented JSON with each entry of its jobs and arrays on one line. Python's
    json module indents in Python, not C: one line per entry keeps every fold of the journal cheap."""
    parts = []
    for key, value in doc.items():
        if key in _ROWS and type(value) is list and value:
            text = "[\n    " + ",\n    ".join([json.dumps(entry) for entry in value]) + "\n  ]"
        else:
            text = json.dumps(value, indent=2).replace("\n", "\n  ")  # "\n" inside a string is escaped
        parts.append(f"  {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n}\n" if parts else "{}\n"


def atomic_write(path: Path, text: str | bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode() if isinstance(text, str) else text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_manifest(run_dir: Path) -> dict[str, Any]:
    """The run's manifest with its journal replayed, checked: a damaged or foreign one is an error that
    names the file."""
    return read_manifest(run_dir).doc


@dataclass(frozen=True)
class ManifestRead:
    """A manifest as read: the document (its journal replayed), and what says whether the run's record is
    still the one read (`unchanged`): the digest of the manifest's bytes (None when a journal was
    replayed: a journal is folded in at the end of every command that writes, so a run at rest has none)
    and the name of the journal file that, once it exists, holds changes made since."""

    doc: dict[str, Any]
    digest: str | None
    journal: str


def read_manifest(run_dir: Path) -> ManifestRead:
    """load_manifest, with what `unchanged` needs to tell later that the record is still this one."""
    path = Path(run_dir) / MANIFEST
    if not path.is_file():
        raise RunNotFound(f"{run_dir}: no {MANIFEST}; not a jobgen run directory")
    for _ in range(10):
        doc, seen, digest = _read_manifest(path)
        journal = journal_path(Path(run_dir), doc)
        lines = _journal_lines(journal)
        if lines is None and identity(path) != seen:
            continue  # folded into a new manifest while we read the old one: read again
        named: dict[str, dict[str, list[dict[str, Any]]]] = {}  # key -> name -> its entries, made once
        for number, change in enumerate(lines or [], start=1):
            problem = _apply(doc, change, named)
            if problem:
                raise JobgenError(
                    f"{journal}: damaged: line {number} {problem}; jobgen cannot read this run "
                    "(restore it from a copy, or remove the run)"
                )
        if lines is None:
            return ManifestRead(doc, digest, journal.name)
        return ManifestRead(doc, None, journal.name)
    raise JobgenError(f"{path} keeps changing while it is read; try again")


def _digest(raw: bytes) -> str:
    """What tells two versions of a record apart: SHA-256 (in hardware on most CPUs), its first 128 bits."""
    return hashlib.sha256(raw).hexdigest()[:32]


PROBE = "probe"  # manifest "kind" of a run made by `jobgen probe`


def run_kind(run_dir: Path) -> str:
    """ "dry" (`submit --dry-run`, `--test-only`), "probe" (`jobgen probe`) or "" (a submitted run). Set
    when the run is written and never changed: the manifest file alone tells; a damaged one counts as
    a submitted run (its reader reports the damage). Every command that names an experiment asks it of
    each of its runs: the answer is kept in the run's index by the manifest's stamp (what that buys:
    bench/bench_latest.py)."""
    from jobgen.record import index

    path = os.path.join(run_dir, MANIFEST)
    try:
        with open(path, "rb", buffering=0) as fh:
            mark = index.stamp(os.fstat(fh.fileno()))
            kept = index.Index(run_dir)
            known, kind = kept.get(MANIFEST, mark, "kind")
            if known and type(kind) is str:
                return kind
            raw = fh.readall()
    except OSError:
        return ""  # unreadable: a damaged run, as _read_manifest says
    kind = _kind(raw)
    kept.keep(MANIFEST, mark, "kind", kind)
    kept.save()
    return kind


def _kind(raw: bytes) -> str:
    """run_kind of a manifest's bytes."""
    from jobgen.record.damage import parse_json

    doc, problem = parse_json(raw)
    if problem or manifest_problem(doc):
        return ""
    return _kind_of(doc)


def _kind_of(doc: dict[str, Any]) -> str:
    """run_kind of a checked manifest document."""
    return "dry" if doc.get("dry_run") else str(doc.get("kind") or "")


def _read_manifest(path: Path) -> tuple[dict[str, Any], tuple[int, int], str]:
    """The checked document, the file's identity (inode, mtime) and the digest of the bytes read."""
    from jobgen.record.damage import parse_json

    try:
        with open(path, "rb") as fh:
            raw, stat = fh.read(), os.fstat(fh.fileno())
    except OSError as exc:
        raise JobgenError(f"{path}: unreadable ({exc.strerror or exc})") from None
    doc, problem = parse_json(raw)
    problem = problem or manifest_problem(doc)
    if problem:
        raise JobgenError(
            f"{path}: damaged: {problem}; jobgen cannot read this run (restore the file from a copy, or remove the run)"
        )
    assert isinstance(doc, dict)  # manifest_problem() said so
    return doc, version_of(stat), _digest(raw)


# --- the journal: a job's record written in O(1) ----------------------------------------------------------
#
# Between two rewrites of manifest.json, every change to a job (about to be submitted, its id, its state)
# is one line appended to `.journal-<generation>.jsonl` (the generation is the manifest's "journal"),
# fsync'ed under the manifest lock before the command goes on: recording the last job costs what the first did,
# and the at-most-once note is on disk before sbatch runs. Readers replay it over the manifest in order.
# Compaction writes the replayed manifest under the next generation, then deletes the old journal (a
# reader that finds its journal gone and the manifest replaced reads again). A last line cut short by a
# crash is ignored; a damaged line before it is an error naming the file.

JOURNAL = ".journal-{}.jsonl"
COMPACT_BYTES = 256 * 1024  # past this (and past the manifest's own size), a write folds the journal in
_generations: dict[Path, tuple[tuple[int, int] | None, int]] = {}  # run folder -> (manifest identity, generation)


def journal_path(run_dir: Path, doc: dict[str, Any]) -> Path:
    generation = doc.get("journal")
    return run_dir / JOURNAL.format(generation if isinstance(generation, int) else 0)


def _journal_lines(path: Path) -> list[Any] | None:
    """The journal's changes, in order (None: there is no journal file)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise JobgenError(f"{path}: unreadable ({exc.strerror or exc})") from None
    lines = raw.split(b"\n")
    out: list[Any] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            if number == len(lines):  # no newline after it: an append cut short, not yet a record
                break
            raise JobgenError(
                f"{path}: damaged: line {number} is not JSON; jobgen cannot read this run "
                "(restore it from a copy, or remove the run)"
            ) from None
    return out


def _apply(doc: dict[str, Any], change: Any, named: dict[str, dict[str, list[dict[str, Any]]]]) -> str | None:
    """Merge one journal line into the manifest; what is wrong with the line, if anything. `named`: the
    entries of each key by name, built at the first line that needs them (a submission's journal has a
    line per job: looking each name up, not every entry per line, keeps the replay linear)."""
    if not isinstance(change, dict) or not isinstance(change.get("updates"), dict):
        return "is not a change of jobs"
    if_job_id = change.get("if_job_id")
    key = str(change.get("key") or "jobs")
    if key not in named:
        named[key] = {}
        for entry in doc.get(key) or []:
            named[key].setdefault(entry["name"], []).append(entry)
    entries = named[key]
    for name, fields in change["updates"].items():
        for entry in entries.get(name, ()):
            if isinstance(fields, dict) and (
                not isinstance(if_job_id, dict) or entry.get("job_id") == if_job_id.get(name)
            ):
                entry.update(fields)
    return None


def _generation(run_dir: Path) -> int:
    """The manifest's journal generation, read again only when the manifest file was replaced."""
    seen = identity(run_dir / MANIFEST)
    cached = _generations.get(run_dir)
    if cached is None or cached[0] != seen or seen is None:
        doc, seen, _ = _read_manifest(run_dir / MANIFEST)
        generation = doc.get("journal")
        cached = (seen, generation if isinstance(generation, int) else 0)
        _generations[run_dir] = cached
    return cached[1]


def update_jobs(
    run_dir: Path,
    updates: dict[str, dict[str, Any]],
    key: str = "jobs",
    if_job_id: dict[str, str | None] | None = None,
    durable: bool = True,
) -> None:
    """Merge fields into the named entries of manifest[key] (jobs, or arrays): one line appended to the
    run's journal, on disk when this returns (`durable`: fsync'ed, so it outlives a crash of the machine).

    `if_job_id` (name -> the job id the update is about) skips entries whose id changed meanwhile: a
    status read before a requeue must not write the old job's state over the new one's.
    """
    run_dir = Path(run_dir)
    line = json.dumps({"key": key, "updates": updates, "if_job_id": if_job_id}, separators=(",", ":")) + "\n"
    with _locked(run_dir / ".manifest.lock"):
        path = run_dir / JOURNAL.format(_generation(run_dir))
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(line)
                fh.flush()
                if durable:
                    os.fsync(fh.fileno())
                size = fh.tell()
        except OSError as exc:  # the manifest and the journal's earlier lines stay whole
            raise JobgenError(f"cannot update {path}: {exc.strerror or exc}; free space first") from None
        if size > max(COMPACT_BYTES, _size(run_dir / MANIFEST)):
            _compact(run_dir)


def update_read(
    run_dir: Path,
    doc: dict[str, Any],
    digest: str | None,
    updates: dict[str, dict[str, Any]],
    if_job_id: dict[str, str | None] | None = None,
) -> tuple[str, str] | None:
    """update_jobs and compact for a command that holds the manifest as it read it (`doc`, and the
    `digest` of its bytes, jobgen.record.model.Run): while the file's bytes are still those and no journal
    holds a change made since, the updates are applied to `doc` and it is written whole, under the
    manifest lock and the next journal generation, as a fold writes it: one rename, no journal line and
    no second read of the manifest (the fold's read and replay would cost as much as the write).
    Returns (the digest of the bytes written, the journal name that would hold changes made after it);
    None when the record changed since it was read: then the updates went through the journal
    (update_jobs, if_job_id respected) and were folded in, and `doc` is left as it was."""
    run_dir = Path(run_dir)
    if digest is not None:
        with _locked(run_dir / ".manifest.lock"):
            try:
                with open(run_dir / MANIFEST, "rb") as fh:
                    same = _digest(fh.read()) == digest
            except OSError:
                same = False
            if same and not os.path.lexists(journal_path(run_dir, doc)):
                _apply(doc, {"updates": updates, "if_job_id": if_job_id}, {})
                try:
                    written = _write_next_generation(run_dir, doc)
                except OSError as exc:  # the manifest stays whole: nothing of the updates is recorded
                    raise JobgenError(
                        f"cannot update {run_dir / MANIFEST}: {exc.strerror or exc}; free space first"
                    ) from None
                return written, journal_path(run_dir, doc).name
    update_jobs(run_dir, updates, if_job_id=if_job_id, durable=False)
    compact(run_dir)
    return None


def compact(run_dir: Path) -> None:
    """Fold the journal into manifest.json (at the end of a submission; writes fold it in now and then).
    Best effort: the journal stays the record until it is folded, so a failure here loses nothing."""
    if not any(Path(run_dir).glob(JOURNAL.format("*"))):
        return
    with contextlib.suppress(JobgenError), _locked(Path(run_dir) / ".manifest.lock"):
        _compact(Path(run_dir))


def _compact(run_dir: Path) -> None:
    doc = load_manifest(run_dir)
    old = journal_path(run_dir, doc)
    if not old.exists():
        return
    try:
        _write_next_generation(run_dir, doc)
    except OSError:
        return  # a full disk: the old manifest and its journal stay whole and say everything; fold them later
    with contextlib.suppress(OSError):
        old.unlink()


def _write_next_generation(run_dir: Path, doc: dict[str, Any]) -> str:
    """Write `doc` whole as the manifest of the next journal generation (a reader holding the old one
    then finds its journal gone and reads again); the digest of the bytes written. OSError leaves the
    file and `doc`'s generation as they were."""
    generation = doc.get("journal")
    doc["journal"] = int(generation or 0) + 1
    raw = manifest_text(doc).encode()
    try:
        atomic_write(run_dir / MANIFEST, raw)
    except OSError:
        doc["journal"] = generation
        raise
    return _digest(raw)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def manifest_problem(doc: Any) -> str | None:
    """What makes a manifest unusable (None: nothing): its shape, its schema, paths that leave the run."""
    if not isinstance(doc, dict):
        return f"not a JSON object (a {type(doc).__name__})"
    if doc.get("schema") != MANIFEST_SCHEMA:
        return f"manifest schema {str(doc.get('schema'))[:20]!r} is not {MANIFEST_SCHEMA}; use a matching jobgen"
    if not isinstance(doc.get("backend"), str) or not isinstance(doc.get("jobs"), list):
        return "no 'backend' or no list of 'jobs'"
    for key in ("jobs", "arrays"):
        for i, entry in enumerate(doc.get(key) or []):
            # Plain type checks first: this runs for every job of the manifest on every read.
            if type(entry) is not dict or type(entry.get("name")) is not str or type(entry.get("state")) is not str:
                if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in ("name", "state")):
                    return f"{key}[{i}] has no name or state"
            for field in ("dir", "script", "spec"):
                rel = entry.get(field)
                if rel is not None and not _plain_relative(rel):
                    return f"{key}[{i}].{field} = {str(rel)[:40]!r} is not a path inside the run"
    return None


def _plain_relative(rel: Any) -> bool:
    # Strings, not pathlib: this runs three times per job of the manifest on every read.
    # A path without ".." anywhere has no ".." part: the split only for the few that have one.
    return isinstance(rel, str) and bool(rel) and rel[0] != "/" and (".." not in rel or ".." not in rel.split("/"))


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Held while jobs of a run are submitted or requeued: two `submit --resume` or `requeue` of one run at
    once take turns, and the second sees what the first queued (the manifest lock is held only per write)."""
    with _locked(Path(run_dir) / ".submit.lock"):
        yield


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        # Opened for reading only: a lock is no writer, so it does not keep the file system busy.
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    except OSError as exc:
        raise JobgenError(f"cannot lock {path}: {exc.strerror or exc}; is the run folder writable by you?") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
