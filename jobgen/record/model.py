"""The read model of a run: a `Run` and its `RunJob`s, loaded once per command, typed.

Every reading command (status, runs, logs, summary, report, requeue, clean, sync, cancel) takes a
`Run` instead of reading manifest.json itself: the manifest is parsed and checked once, each job's
records are read once (`RunJob.raw`), and the scheduler is asked once for all live jobs of all the
runs a command reads (`jobgen.results.state_rule.read_runs`). Writes still go through `jobgen.record.store`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobgen.errors import JobgenError
from jobgen.facts import RETRIES_SCHEMA
from jobgen.record import store
from jobgen.record.damage import JOB_FILES, json_problem, metrics_problem, parse_json
from jobgen.record.index import Index, Stamp, stamp
from jobgen.states import JobInfo, State, parse
from training.progress import PROGRESS_FILE, PROGRESS_KEYS

_STATES: dict[Any, State] = {state.value: state for state in State}


@dataclass(frozen=True)
class Retries:
    """retries.json (slurm.retries): what the job's batch shell did after each failed attempt
    (jobgen/templates/_retry.j2): retries used of the limit, the nodes it excluded, and why it did not
    retry again (None while it still may)."""

    used: int
    limit: int
    excluded: tuple[str, ...]
    stopped: str | None = None

    def __str__(self) -> str:
        """'1/2 excl n1', '2/2 excl n1,n2: retries used up': a cell of `jobgen status`."""
        text = f"{self.used}/{self.limit}" + (f" excl {','.join(self.excluded)}" if self.excluded else "")
        return text + (f": {self.stopped}" if self.stopped else "")


PROBLEM = "problem"  # the run's index's key for a record's damage check verdict (None: fine)


@dataclass
class RunJob:
    """One job of a run: its manifest entry as typed fields, its records read at most once each."""

    run_dir: Path
    entry: dict[str, Any]  # the manifest entry as written (the store updates it by name)
    name: str
    dir: str
    recorded: State  # the last state jobgen recorded
    job_id: str | None = None
    segments: tuple[str, ...] = ()  # a chained job (slurm.chain): each segment's id
    previous_job_ids: tuple[str, ...] = ()
    # Filled in by jobgen.results.state_rule.read_runs: what the scheduler says, and the one state rule's verdict.
    live: JobInfo | None = None
    state: State = State.UNKNOWN
    cause: Any = None  # jobgen.results.diagnose.Cause, when the logs were asked why the job stopped
    cause_read: bool = False  # this command read the logs for it (cause None: they said nothing)
    # The scheduler was asked about the job and could not answer (Answer.silent): it keeps its last state.
    unanswered: bool = False
    index: Index | None = field(default=None, repr=False)  # the run's, shared by its jobs
    _files: dict[str, bytes | None | OSError] = field(default_factory=dict, repr=False)
    _docs: dict[str, tuple[Any, str | None]] = field(default_factory=dict, repr=False)  # parsed once
    _marks: dict[str, Stamp | OSError | None] = field(default_factory=dict, repr=False)  # stat'ed once
    _read: dict[str, Stamp] = field(default_factory=dict, repr=False)  # the stamps of the versions read
    _folder: str = field(default="", repr=False)
    _job_dir: Path | None = field(default=None, repr=False)
    _problems: list[str] | None = field(default=None, repr=False)  # what `problems` found, once per command
    # Its log files, oldest first, as jobgen.results.logs.of listed them once for this command (the
    # report links them and may read one for the cause).
    log_paths: list[Path] | None = field(default=None, repr=False)

    @classmethod
    def from_entry(cls, run_dir: Path, entry: dict[str, Any], index: Index | None = None) -> RunJob:
        # Once per job of every run a command reads: no more work than the fields need.
        name = str(entry.get("name"))
        state = entry.get("state") or "UNKNOWN"
        recorded = _STATES.get(state) or parse(str(state))
        job_id, segments, previous = entry.get("job_id"), entry.get("segments"), entry.get("previous_job_ids")
        return cls(
            run_dir=run_dir,
            index=index,
            entry=entry,
            name=name,
            dir=str(entry.get("dir") or f"jobs/{name}"),
            recorded=recorded,
            job_id=str(job_id) if job_id else None,
            segments=tuple(str(s) for s in segments) if segments else (),
            previous_job_ids=tuple(str(s) for s in previous) if previous else (),
            state=recorded,
        )

    @property
    def job_dir(self) -> Path:
        if self._job_dir is None:
            self._job_dir = self.run_dir / self.dir
        return self._job_dir

    @property
    def folder(self) -> str:
        """job_dir as a plain string (no pathlib object per job)."""
        if not self._folder:
            self._folder = os.path.join(self.run_dir, self.dir)
        return self._folder

    @property
    def ids(self) -> list[str]:
        """Its Slurm ids: the segments of a chain, else its one id (none before it is submitted)."""
        return list(self.segments or ([self.job_id] if self.job_id else []))

    @property
    def sweep(self) -> dict[str, Any]:
        return dict(self.entry.get("sweep") or {})

    def _stat(self, name: str) -> Stamp | OSError | None:
        """The stat stamp of one of the job's files (None: it does not exist), asked once per command."""
        marks = self._marks
        if name in marks:
            return marks[name]
        try:
            mark: Stamp | OSError | None = stamp(os.stat(self.folder + "/" + name))
        except FileNotFoundError:
            mark = None
        except OSError as exc:
            mark = exc
        marks[name] = mark
        return mark

    def raw(self, name: str) -> bytes | None:
        """The bytes of one of the job's files (None: it does not exist), read once; OSError if unreadable."""
        if name not in self._files:
            if name in self._marks and self._marks[name] is None:
                return None  # this command saw it absent: no open to learn so again (no progress.json yet)
            try:
                self._files[name], self._read[name] = read_with_stamp(self.folder + "/" + name)
            except FileNotFoundError:
                self._files[name] = None
            except OSError as exc:
                self._files[name] = exc
        value = self._files[name]
        if isinstance(value, OSError):
            raise value
        return value

    def json(self, name: str) -> tuple[Any, str | None]:
        """(document, None), (None, None) when absent, or (None, what is wrong with it); parsed once per
        command (the damage check and the summary read the same result.json: neither changes it)."""
        found = self._docs.get(name)
        if found is not None:
            return found
        try:
            raw = self.raw(name)
        except OSError as exc:
            return None, f"unreadable ({exc.strerror or exc})"
        found = self._docs[name] = (None, None) if raw is None else parse_json(raw)
        return found

    def parsed(self, name: str) -> bool:
        """Whether this command has parsed one of the job's JSON records (a fact of it costs no read)."""
        return name in self._docs

    def indexed(
        self, name: str, key: str, read: Callable[[RunJob], Any], valid: Callable[[Any], bool] | None = None
    ) -> Any:
        """What `read(job)` makes of one of the job's files (a JSON value), from the run's index while the
        file's stamp and the reading code are those it was kept with, else read now and kept. `read` must
        depend on that file alone (read through `raw` or `json`); `key` names what it extracts; a kept
        value that `valid` refuses (a damaged index) is read again."""
        mark = self._stat(name)
        index = self.index
        if index is None or type(mark) is not str:
            return read(self)
        rel = self.dir + "/" + name
        known, value = index.get(rel, mark, key)
        if known and (valid is None or valid(value)):
            return value
        value = read(self)
        read_mark = self._read.get(name)
        if read_mark is not None:
            index.keep(rel, read_mark, key, value)
        return value

    def _exists(self, name: str) -> bool:
        """Whether one of the job's records exists (even unreadable): from what this command read or
        stat'ed of it, else a stat."""
        if name not in self._marks and name in self._files:
            return self._files[name] is not None
        return self._stat(name) is not None

    @property
    def finished(self) -> bool:
        """The job wrote a result: the training writes result.json last and atomically, so any result.json
        (even of another schema, or damaged since) says it got to its end. Whether the numbers in it can
        be used is the summary's question (its row says why not). Asked of the file system, not read."""
        return self._exists("result.json")  # there, even if unreadable

    def has(self, name: str) -> bool:
        """Whether one of the job's records exists (even unreadable), asked of the file system once per
        command: most ended jobs lack some (no metrics.csv before the first logged step)."""
        return self._exists(name)

    def progress(self) -> tuple[int, int, int, int] | None:
        """(epoch, epochs, batch, batches) from progress.json, which the training rewrites as it goes."""
        found = self.indexed(PROGRESS_FILE, "progress", _read_progress, _is_progress)
        return (found[0], found[1], found[2], found[3]) if found else None

    def retries(self) -> Retries | None:
        """The job's retry record (slurm.retries); None before a first failure, or when it is damaged
        (`problems` names it then)."""
        if self._stat("retries.json") is None:
            return None
        found = self.indexed("retries.json", "retries", _read_retries, _is_retries)
        return Retries(found[0], found[1], tuple(found[2]), found[3]) if found else None

    def spec(self) -> dict[str, Any]:
        doc, _ = self.json("spec.json")
        return doc if isinstance(doc, dict) else {}

    def problems(self) -> list[str]:
        """One line per damaged record (its folder gone, or a file that cannot be read), named under the run;
        looked for once per command."""
        if self._problems is None:
            self._problems = self._look_for_problems()
        return list(self._problems)

    def _look_for_problems(self) -> list[str]:
        out = []
        for name in JOB_FILES:
            problem = self._problem(name)
            if problem:
                out.append(self._damaged(name, problem))
        if not out and all(self._marks.get(name) is None for name in JOB_FILES) and not os.path.isdir(self.folder):
            return [f"{self.dir}/: the job's folder is missing (deleted?); it is reported from the manifest alone"]
        return out

    def _damaged(self, name: str, problem: str) -> str:
        """The warning line of one damaged record, named under the run."""
        return f"{self.dir}/{name}: {problem}; ignored"

    def _problem(self, name: str) -> str | None:
        """What is wrong with one of the job's files (None: fine or absent); the run's index first."""
        mark = self._stat(name)
        if mark is None:
            return None
        if isinstance(mark, OSError):
            if isinstance(mark, NotADirectoryError):
                return None  # the job's folder is a file: said once, as a missing folder
            return f"unreadable ({mark.strerror or mark})"
        return self.indexed(  # type: ignore[no-any-return]
            name, PROBLEM, lambda job: _check(job, name), lambda kept: kept is None or type(kept) is str
        )


def read_with_stamp(path: str) -> tuple[bytes, Stamp]:
    """A file's bytes and the stamp of the version read (taken after reading: a write meanwhile makes it
    recent, so the index does not keep it)."""
    with open(path, "rb", buffering=0) as fh:
        data = fh.readall()
        return data, stamp(os.fstat(fh.fileno()))


def _check(job: RunJob, name: str) -> str | None:
    if name == "metrics.csv":
        try:
            raw = job.raw(name)
        except OSError as exc:
            return f"unreadable ({exc.strerror or exc})"
        return None if raw is None else metrics_problem(raw)
    doc, problem = job.json(name)
    return json_problem(name, doc, problem)


def _read_progress(job: RunJob) -> list[int] | None:
    doc, _ = job.json(PROGRESS_FILE)
    try:
        return [int(doc[k]) for k in PROGRESS_KEYS]
    except (ValueError, KeyError, TypeError):
        return None


def _is_progress(kept: Any) -> bool:
    return kept is None or (type(kept) is list and len(kept) == 4 and all(type(v) is int for v in kept))


def _is_retries(kept: Any) -> bool:
    return kept is None or (
        type(kept) is list
        and len(kept) == 4
        and type(kept[0]) is int
        and type(kept[1]) is int
        and type(kept[2]) is list
        and all(type(n) is str for n in kept[2])
        and (kept[3] is None or type(kept[3]) is str)
    )


def _read_retries(job: RunJob) -> list[Any] | None:
    doc, _ = job.json("retries.json")
    try:
        used, limit, excluded = int(doc["retries"]), int(doc["limit"]), doc["excluded"]
        stopped = doc.get("stopped")
    except (ValueError, KeyError, TypeError):
        return None
    if doc.get("schema") != RETRIES_SCHEMA or not isinstance(excluded, list):
        return None
    return [used, limit, [str(n) for n in excluded], str(stopped) if stopped else None]


@dataclass
class Run:
    """One run folder: its manifest, checked, and its jobs in manifest order."""

    run_dir: Path
    manifest: dict[str, Any]
    jobs: list[RunJob]
    index: Index | None = field(default=None, repr=False)
    # Set by `--refresh` (jobgen.results.state_rule.settle): Slurm is asked again about every job, its usage
    # too, and what the manifest kept of it is not taken.
    refresh: bool = False
    # The digest of the manifest's bytes read: a write of the whole document is made only while the file
    # still holds them (jobgen.record.store.update_read); none when a journal was replayed.
    digest: str | None = field(default=None, repr=False)
    # What the command has to say of the run as a whole (the scheduler did not answer), one line each.
    notes: list[str] = field(default_factory=list, repr=False)

    @classmethod
    def load(cls, run_dir: Path) -> Run:
        """The run at `run_dir`; a missing or damaged manifest is a one-line error naming the file."""
        read = store.read_manifest(run_dir)
        manifest = read.doc
        folder = Path(run_dir)
        index = Index(folder)
        jobs = [RunJob.from_entry(folder, e, index) for e in manifest["jobs"]]
        return cls(
            folder,
            manifest,
            jobs,
            index,
            digest=read.digest,
        )

    def record(self, updates: dict[str, dict[str, Any]]) -> None:
        """Write these fields of the named jobs to the run's record and to their entries here, each only
        where the job's id is still the one read (a requeue meanwhile gave it another). The manifest read
        is written whole when it is still the one on disk (jobgen.record.store.update_read); the run then
        stands for the record as written (its digest), so a second write in the same command is whole too."""
        ids = {job.name: job.job_id for job in self.jobs}
        written = store.update_read(self.run_dir, self.manifest, self.digest, updates, if_job_id=ids)
        if written is None:
            self.digest = None  # the record changed since it was read: later changes go through the journal
            for job in self.jobs:
                job.entry.update(updates.get(job.name, {}))
        else:
            self.digest = written[0]

    def problems(self) -> list[str]:
        """One line per damaged record of its jobs (RunJob.problems); what was read is saved in the index."""
        out = [line for job in self.jobs for line in job.problems()]
        self.save_index()
        return out

    def save_index(self) -> None:
        """Write what this command read of the jobs' records (RunJob.indexed) to the run's index."""
        if self.index is not None:
            self.index.save()

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or self.run_dir.name)

    @property
    def experiment(self) -> str:
        return str(self.manifest.get("experiment") or self.run_dir.parent.name)

    @property
    def backend(self) -> str:
        return str(self.manifest["backend"])

    @property
    def dry_run(self) -> bool:
        return bool(self.manifest.get("dry_run"))

    @property
    def kind(self) -> str:
        """ "probe" for a run of `jobgen probe`, else "" (see jobgen.record.store.run_kind)."""
        return str(self.manifest.get("kind") or "")

    @property
    def arrays(self) -> list[dict[str, Any]]:
        return list(self.manifest.get("arrays") or [])

    def pick(self, names: Sequence[str]) -> list[RunJob]:
        """The jobs named (all when none is), in manifest order; an unknown name is a one-line error."""
        known = {job.name for job in self.jobs}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise JobgenError(f"no job {unknown[0]!r} in {self.run_dir}; jobs: {', '.join(sorted(known))}")
        return [job for job in self.jobs if not names or job.name in names]

    def find(self, ref: str | None) -> RunJob:
        """One job by name or by one of its Slurm ids; with no ref, the run's only job."""
        if ref is None:
            if len(self.jobs) == 1:
                return self.jobs[0]
            raise JobgenError(f"this run has {len(self.jobs)} jobs; name one: {', '.join(j.name for j in self.jobs)}")
        for job in self.jobs:
            if ref in (job.name, job.job_id, *job.previous_job_ids):
                return job
        raise JobgenError(f"no job {ref!r} in this run; jobs: {', '.join(j.name for j in self.jobs)}")

    def requeue_settings(self, job: RunJob) -> dict[str, Any]:
        settings = job.spec().get("requeue")
        return settings if isinstance(settings, dict) else {}
