"""The read model of a run: a `Run` and its `RunJob`s, loaded once per command, typed.

Every reading command (status, runs, logs, summary, report, requeue, clean, sync, cancel) takes a
`Run` instead of reading manifest.json itself: the manifest is parsed and checked once, each job's
records are read once (`RunJob.raw`), and the scheduler is asked once for all live jobs of all the
runs a command reads (`jobgen.results.state.read_runs`). Writes still go through `jobgen.run.store`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobgen.errors import JobgenError
from jobgen.facts import RETRIES_SCHEMA
from jobgen.run import store
from jobgen.run.damage import JOB_FILES, Verdicts, json_problem, metrics_problem, parse_json, stamp
from jobgen.states import JobInfo, State, parse
from training.progress import PROGRESS_FILE, PROGRESS_KEYS

_NAMES = {name: Path(name) for name in JOB_FILES}


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
    array: str | None = None
    array_index: int | None = None
    # Filled in by jobgen.results.state.read_runs: what the scheduler says, and the one state rule's verdict.
    live: JobInfo | None = None
    state: State = State.UNKNOWN
    cause: Any = None  # jobgen.results.diagnose.Cause, when the logs were asked why the job stopped
    verdicts: Verdicts | None = field(default=None, repr=False)  # the run's, shared by its jobs
    _files: dict[str, bytes | None | OSError] = field(default_factory=dict, repr=False)
    _finished: bool | None = field(default=None, repr=False)  # asked of the file system once per command

    @classmethod
    def from_entry(cls, run_dir: Path, entry: dict[str, Any], verdicts: Verdicts | None = None) -> RunJob:
        name = str(entry.get("name"))
        return cls(
            run_dir=run_dir,
            verdicts=verdicts,
            entry=entry,
            name=name,
            dir=str(entry.get("dir") or f"jobs/{name}"),
            recorded=parse(str(entry.get("state") or "UNKNOWN")),
            job_id=str(entry["job_id"]) if entry.get("job_id") else None,
            segments=tuple(str(s) for s in entry.get("segments") or ()),
            previous_job_ids=tuple(str(s) for s in entry.get("previous_job_ids") or ()),
            array=entry.get("array") or None,
            array_index=entry.get("array_index"),
            state=parse(str(entry.get("state") or "UNKNOWN")),
        )

    @functools.cached_property
    def job_dir(self) -> Path:
        return self.run_dir / self.dir

    @functools.cached_property
    def _folder(self) -> str:
        # Plain strings on the path every job takes: pathlib costs more than the JSON at 10,000 jobs.
        return os.path.join(self.run_dir, self.dir)

    @property
    def ids(self) -> list[str]:
        """Its Slurm ids: the segments of a chain, else its one id (none before it is submitted)."""
        return list(self.segments or ([self.job_id] if self.job_id else []))

    @property
    def sweep(self) -> dict[str, Any]:
        return dict(self.entry.get("sweep") or {})

    def raw(self, name: str) -> bytes | None:
        """The bytes of one of the job's files (None: it does not exist), read once; OSError if unreadable."""
        if name not in self._files:
            try:
                with open(os.path.join(self._folder, name), "rb") as fh:
                    self._files[name] = fh.read()
            except FileNotFoundError:
                self._files[name] = None
            except OSError as exc:
                self._files[name] = exc
        value = self._files[name]
        if isinstance(value, OSError):
            raise value
        return value

    def json(self, name: str) -> tuple[Any, str | None]:
        """(document, None), (None, None) when absent, or (None, what is wrong with it)."""
        try:
            raw = self.raw(name)
        except OSError as exc:
            return None, f"unreadable ({exc.strerror or exc})"
        return (None, None) if raw is None else parse_json(raw)

    @property
    def finished(self) -> bool:
        """The job wrote a result: the training writes result.json last and atomically, so any result.json
        (even of another schema, or damaged since) says it got to its end. Whether the numbers in it can
        be used is the summary's question (its row says why not). Asked of the file system, not read."""
        if "result.json" in self._files:
            return self._files["result.json"] is not None
        if self._finished is None:
            try:
                os.stat(os.path.join(self._folder, "result.json"))
                self._finished = True
            except FileNotFoundError:
                self._finished = False
            except OSError:
                self._finished = True  # there, but unreadable
        return self._finished

    def progress(self) -> tuple[int, int, int, int] | None:
        """(epoch, epochs, batch, batches) from progress.json, which the training rewrites as it goes."""
        doc, _ = self.json(PROGRESS_FILE)
        try:
            return tuple(int(doc[k]) for k in PROGRESS_KEYS)  # type: ignore[return-value]
        except (ValueError, KeyError, TypeError):
            return None

    def retries(self) -> Retries | None:
        """The job's retry record (slurm.retries); None before a first failure, or when it is damaged
        (`problems` names it then)."""
        doc, _ = self.json("retries.json")
        try:
            used, limit, excluded = int(doc["retries"]), int(doc["limit"]), doc["excluded"]
            stopped = doc.get("stopped")
        except (ValueError, KeyError, TypeError):
            return None
        if doc.get("schema") != RETRIES_SCHEMA or not isinstance(excluded, list):
            return None
        return Retries(used, limit, tuple(str(n) for n in excluded), str(stopped) if stopped else None)

    def spec(self) -> dict[str, Any]:
        doc, _ = self.json("spec.json")
        return doc if isinstance(doc, dict) else {}

    def problems(self) -> list[str]:
        """One line per damaged record (its folder gone, or a file that cannot be read), named under the run."""
        if not os.path.isdir(self._folder):
            return [f"{self.dir}/: the job's folder is missing (deleted?); it is reported from the manifest alone"]
        out = []
        for name in JOB_FILES:
            problem = self._problem(name)
            if problem:
                out.append(f"{self.dir}/{name}: {problem}; ignored")
        return out

    def _problem(self, name: str) -> str | None:
        """What is wrong with one of the job's files (None: fine or absent); the run's verdicts first."""
        rel = f"{self.dir}/{name}"
        try:
            mark = stamp(os.stat(os.path.join(self._folder, name)))
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"unreadable ({exc.strerror or exc})"
        if self.verdicts is not None:
            known, problem = self.verdicts.get(rel, mark)
            if known:
                return problem
        if name == "metrics.csv":
            problem = metrics_problem(Path(self._folder, name))
        else:
            doc, problem = self.json(name)
            problem = json_problem(_NAMES[name], doc, problem)
        if self.verdicts is not None:
            self.verdicts.put(rel, mark, problem)
        return problem


@dataclass
class Run:
    """One run folder: its manifest, checked, and its jobs in manifest order."""

    run_dir: Path
    manifest: dict[str, Any]
    jobs: list[RunJob]
    verdicts: Verdicts | None = field(default=None, repr=False)

    @classmethod
    def load(cls, run_dir: Path) -> Run:
        """The run at `run_dir`; a missing or damaged manifest is a one-line error naming the file."""
        manifest = store.load_manifest(run_dir)
        folder = Path(run_dir)
        verdicts = Verdicts(folder)
        return cls(folder, manifest, [RunJob.from_entry(folder, e, verdicts) for e in manifest["jobs"]], verdicts)

    def problems(self) -> list[str]:
        """One line per damaged record of its jobs (RunJob.problems), the verdicts kept for next time."""
        out = [line for job in self.jobs for line in job.problems()]
        if self.verdicts is not None:
            self.verdicts.save()
        return out

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
