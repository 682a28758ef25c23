"""`jobgen rerun RUN [JOB...]`: a new run made from an old run's record, not from today's files.

The new run sits beside the old one and holds its experiment.toml, code.patch and code/training/
snapshot, its resolved experiment (the new `--set` items applied), and for each job its recorded
spec.json and script with only the run's folder and id changed: the script's PYTHONPATH names the new
run's copy of the old snapshot, the spec keeps the seed and every key. `--set KEY=VALUE` renders the
recorded experiment again (its recorded overrides and site, then the new items); the manifest's
"rerun" entry names the run repeated, the jobs, the items and what differed. What cannot be repeated
as recorded is drift: no code snapshot, a package whose version differs where the jobs will run, a
script this jobgen renders differently. Drift is refused (DriftError) unless allowed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobgen import __version__, backends
from jobgen.commands.submit import (
    Files,
    customize,
    new_entry,
    queue_settings,
    run_info,
    training_package_dir,
    write_new_run,
)
from jobgen.errors import DriftError, JobgenError
from jobgen.experiment import config, resolved, sites
from jobgen.experiment import halving as halving_config
from jobgen.experiment.schema import LaunchSection
from jobgen.plan.plan import Job, cache_dir_for, plan
from jobgen.plan.render import render_job
from jobgen.plan.spec import build_spec
from jobgen.record import store as record
from jobgen.record.model import Run, RunJob

SNAPSHOT = "code/training"
KEPT = ("experiment.toml", "code.patch")  # the run's own records, copied as they are
# A folder name every quoting of a script (shell, #SBATCH, %-escaped log paths) writes as it is.
_PLAIN = re.compile(r"[A-Za-z0-9_./,:@+=-]+")
# Asked of the python the jobs will run with, with the snapshot first on its path, as in the job.
_LIST_PACKAGES = "import json; from training.results import installed_packages; print(json.dumps(installed_packages()))"


@dataclass(frozen=True)
class Recorded:
    """What a job of the old run recorded: its spec and its script, as written then."""

    job: RunJob
    spec: dict[str, Any]
    script: str


@dataclass(frozen=True)
class Rerun:
    """A rerun written to disk (a dry run, or ready for submit_pending)."""

    run_dir: Path
    manifest: dict[str, Any]
    of: Path  # the run it repeats
    jobs: list[str]
    drift: list[str]  # what differs from the record (there only when allowed)
    notes: list[str]  # what could not be checked here


def rerun(
    run_dir: Path,
    names: list[str],
    sets: list[str] | None = None,
    *,
    allow_drift: bool = False,
    dry_run: bool = False,
) -> Rerun:
    """Write a new run that repeats the named jobs of `run_dir` (all when none is named) from its record.

    Raises DriftError (listing each difference) when the record cannot be repeated faithfully, unless
    `allow_drift`. Nothing is submitted: the caller submits the new run (jobgen.commands.submit)."""
    sets = list(sets or [])
    old = Run.load(run_dir)
    if old.dry_run:
        raise JobgenError(
            f"{old.run_dir} is a dry run: none of its jobs ran, so there is nothing to repeat; "
            "rerun a submitted run, or submit the experiment file"
        )
    recorded = [_recorded(old, job) for job in old.pick(names)]
    snapshot = old.run_dir / SNAPSHOT
    code = snapshot
    drift: list[str] = []
    if not snapshot.is_dir():
        code = training_package_dir()
        drift.append(f"{snapshot}: the code snapshot is missing; the jobs would run {code} of today instead")
    package_drift, notes = packages(old, recorded, code)
    drift += package_drift
    scheduler = backends.get(old.backend)
    experiment = recorded_experiment(old, sets) if sets else None
    tree = resolved_experiment(old, sets)
    halved = _halving(old, experiment, len(recorded))

    def make(run_id: str, new_dir: Path) -> tuple[dict[str, Any], Files]:
        changed = drift + (_render_drifts(old, recorded, run_id, new_dir) if experiment is not None else [])
        if changed and not allow_drift:
            more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
            raise DriftError(
                f"{old.run_dir} cannot be repeated as recorded: {'; '.join(changed[:3])}{more}; rerun with "
                "--allow-drift to run it anyway (the new manifest records what differed)",
                changed,
            )
        made = _render(experiment, recorded, run_id, new_dir, _git(old), halved) if experiment is not None else {}
        files: Files = {name: (old.run_dir / name).read_bytes() for name in KEPT if (old.run_dir / name).is_file()}
        if tree is not None:
            files[resolved.FILE] = resolved.text(tree)
        entries = []
        for rec in recorded:
            spec, script = made.get(rec.job.name) or _moved(old, rec, run_id, new_dir)
            files[str(rec.job.entry.get("spec") or f"{rec.job.dir}/spec.json")] = record.dumps(spec)
            files[str(rec.job.entry["script"])] = script
            entries.append(_entry(rec.job, scheduler.submit_command(new_dir / rec.job.entry["script"]), dry_run))
        manifest = _manifest(old, run_id, entries, dry_run, sets, changed)
        if halved:
            manifest["halving"] = halved
        if scheduler.can_wave:
            manifest["queue"] = _queue(old, experiment, recorded[0].spec)
        files[record.MANIFEST] = record.manifest_text(manifest)
        record.check_no_secrets({k: v for k, v in files.items() if isinstance(v, str)})
        return manifest, files

    new_dir, manifest = write_new_run(old.run_dir.parent.parent, old.run_dir.parent.name, make, {SNAPSHOT: code})
    return Rerun(new_dir, manifest, old.run_dir, manifest["rerun"]["jobs"], manifest["rerun"]["drift"], notes)


def _halving(old: Run, experiment: config.Experiment | None, jobs: int) -> dict[str, Any] | None:
    """The new run's [sweep.halving] settings (its manifest's "halving"): the old run's, or with --set
    the recorded experiment's again; None without halving. A JobgenError for fewer jobs than eta: at a
    rung a job goes on only in the top 1/eta of the jobs there, so fewer would all stop at the first."""
    if experiment is not None:
        settings = halving_config.settings(experiment.sweep.halving, experiment.train.epochs, experiment.data)
        found = settings.record() if settings is not None else None
    else:
        found = old.manifest.get("halving") if isinstance(old.manifest.get("halving"), dict) else None
    eta = found.get("eta") if found else None
    if isinstance(eta, int) and jobs < eta:
        raise JobgenError(
            f"{old.run_dir} halves its sweep (eta = {eta}): a job goes on at a rung only in the top 1/{eta} of "
            f"at least {eta} jobs, so the {jobs} named would all stop at their first rung; rerun at least "
            f"{eta} of its jobs (or all)"
        )
    return found


def _queue(old: Run, experiment: config.Experiment | None, spec: dict[str, Any]) -> dict[str, Any]:
    """The new run's queue settings (jobgen.commands.waves): with --set the recorded experiment's again,
    else the old run's; a run recorded without them gets the defaults and the QOS and account its jobs
    asked for."""
    if experiment is not None:
        launch, slurm = experiment.launch, experiment.slurm
        return queue_settings(launch.max_queued, launch.queue_reserve, slurm.qos, slurm.account)
    if isinstance(old.manifest.get("queue"), dict):
        return dict(old.manifest["queue"])
    said = spec.get("slurm")
    said = said if isinstance(said, dict) else {}
    return queue_settings(0, LaunchSection().queue_reserve, str(said.get("qos") or ""), str(said.get("account") or ""))


def _manifest(
    old: Run, run_id: str, entries: list[dict[str, Any]], dry_run: bool, sets: list[str], drift: list[str]
) -> dict[str, Any]:
    """The new run's manifest: the old one's experiment, backend, git, overrides and site, and what repeats it."""
    manifest = record.manifest_doc(
        run_id,
        old.experiment,
        Path(str(old.manifest.get("experiment_file") or old.run_dir / "experiment.toml")),
        old.backend,
        dry_run,
        *_git(old),
        entries,
        str(old.manifest.get("description") or ""),
    )
    overrides = [*(old.manifest.get("overrides") or []), *sets]
    if overrides:
        manifest["overrides"] = overrides
    if old.manifest.get("site"):
        manifest["site"] = old.manifest["site"]
    jobs = [str(entry["name"]) for entry in entries]
    manifest["rerun"] = {"of": old.run_id, "run_dir": str(old.run_dir), "jobs": jobs, "sets": sets, "drift": drift}
    return manifest


def _recorded(old: Run, job: RunJob) -> Recorded:
    """A job's spec and script as recorded; a one-line error when either cannot be read."""
    spec, problem = job.json("spec.json")
    if not isinstance(spec, dict) or not isinstance(spec.get("run_dir"), str):
        problem = problem or ("missing" if spec is None else "no run_dir in it")
        raise JobgenError(
            f"{old.run_dir}/{job.dir}/spec.json: {problem}; job {job.name} cannot be repeated from its record "
            "(name the other jobs to rerun them)"
        )
    script = old.run_dir / str(job.entry.get("script") or "")
    try:
        text = script.read_text(encoding="utf-8") if job.entry.get("script") else None
    except (OSError, UnicodeDecodeError) as exc:
        raise JobgenError(f"{script}: unreadable ({exc}); job {job.name} cannot be repeated from its record") from None
    if text is None:
        raise JobgenError(
            f"{old.run_dir}: job {job.name} has no recorded script; it cannot be repeated from its record"
        )
    return Recorded(job, spec, text)


def _moved(old: Run, rec: Recorded, run_id: str, new_dir: Path) -> tuple[dict[str, Any], str]:
    """The recorded spec and script, moved to the new run: its folder and its id, nothing else."""
    recorded_dir = rec.spec["run_dir"]
    script = rec.script
    if recorded_dir != str(old.run_dir):
        # The run was moved since. Its scripts name the old folder as each quoting wrote it, and a plain
        # name reads the same in all of them.
        if not (_PLAIN.fullmatch(recorded_dir) and _PLAIN.fullmatch(str(old.run_dir))):
            raise JobgenError(
                f"{old.run_dir} was recorded at {recorded_dir} and its scripts name that folder; "
                "rerun it from where it was recorded"
            )
        script = script.replace(recorded_dir, str(old.run_dir))
    # The run id (of the folder, the job's tag, the header) is the only other mention of the run.
    return _move_paths(rec.spec, recorded_dir, str(new_dir)), script.replace(old.run_id, run_id)


def _move_paths(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return new + value[len(old) :] if value == old or value.startswith(old + "/") else value
    if isinstance(value, dict):
        return {k: _move_paths(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_move_paths(v, old, new) for v in value]
    return value


def _entry(job: RunJob, command: list[str], dry_run: bool) -> dict[str, Any]:
    """A job of the new run: the old entry's name, sweep and files, never submitted yet. A job that ran
    as an array task is rerun as a job of its own (its own script, recorded beside the array's)."""
    entry = new_entry(
        {k: job.entry.get(k) for k in ("name", "index", "sweep", "dir", "spec", "script")}, command, dry_run
    )
    if int(job.entry.get("chain") or 1) > 1:
        entry["chain"] = job.entry["chain"]
    return entry


# --- --set: the recorded experiment, rendered again --------------------------------------------------------


def recorded_experiment(old: Run, sets: list[str]) -> config.Experiment:
    """The experiment as the old run recorded it (its experiment.toml, overrides, site, backend), then `sets`.

    Relative paths in it stay relative to the file that was submitted (manifest "experiment_file")."""
    path = old.run_dir / "experiment.toml"
    if not path.is_file():
        raise JobgenError(f"{path}: missing; --set renders the recorded experiment again, so it needs it")
    text, raw = config.read_toml(path, "the recorded experiment", " in the recorded experiment")
    exp = config.build(raw, path=Path(str(old.manifest.get("experiment_file") or path)), text=text, display=str(path))
    return customize(exp, old.backend, [*(old.manifest.get("overrides") or []), *sets], _site(old), array=False)


def resolved_experiment(old: Run, sets: list[str]) -> dict[str, Any] | None:
    """The old run's resolved experiment (rebuilt from its record when it kept none) with `sets` applied;
    None when its record cannot give one (the new run then has none either, as the old one)."""
    try:
        tree, _ = resolved.read(old.run_dir, old.manifest)
    except JobgenError:
        return None
    return config.set_items(tree, sets, str(old.run_dir / resolved.FILE))


def _site(old: Run) -> sites.Site | None:
    """The site the old run recorded, as the values it gave (the sites file may have changed since)."""
    given = old.manifest.get("site")
    if not isinstance(given, dict):
        return None
    tables: dict[str, dict[str, Any]] = {}
    for dotted, value in (given.get("values") or {}).items():
        section, _, key = str(dotted).partition(".")
        tables.setdefault(section, {})[key] = value
    return sites.Site(name=str(given.get("name")), file=Path(str(given.get("file"))), cluster_name="", tables=tables)


def _render(
    exp: config.Experiment,
    recorded: list[Recorded],
    run_id: str,
    new_dir: Path,
    git: tuple[str | None, bool],
    halved: dict[str, Any] | None,
) -> dict[str, tuple[dict[str, Any], str]]:
    """job name -> (spec, script) of the recorded jobs, rendered for the new run; `halved`: the run's
    [sweep.halving] settings, which each spec carries (as jobgen.commands.submit writes them)."""
    planned = {job.name: job for job in plan(exp)}
    lost = [rec.job.name for rec in recorded if rec.job.name not in planned]
    if lost:
        raise JobgenError(
            f"the recorded experiment with these --set items has no job {lost[0]!r}; "
            "set keys that do not rename the jobs"
        )
    info = run_info(exp, run_id, new_dir, git, halving=bool(halved))
    out = {}
    for rec in recorded:
        job = _as_limited(planned[rec.job.name], rec.spec)
        spec = build_spec(job, info, Path(str(rec.spec.get("cache_dir") or cache_dir_for(job, new_dir.parent.parent))))
        if halved:
            spec["halving"] = halved
        out[job.name] = (spec, render_job(job, info))
    return out


def _as_limited(job: Job, spec: dict[str, Any]) -> Job:
    """slurm.time/mem = "auto" as the recorded job chose them (from its probe then): a rerun repeats them."""
    s, said = job.exp.slurm, spec.get("slurm") or {}
    time = str(said.get("time", s.time)) if s.time == config.AUTO else s.time
    mem = str(said.get("mem", s.mem)) if s.mem == config.AUTO else s.mem
    if (time, mem) == (s.time, s.mem):
        return job
    slurm = dataclasses.replace(s, time=time, mem=mem)
    return dataclasses.replace(job, exp=dataclasses.replace(job.exp, slurm=slurm))


def _git(old: Run) -> tuple[str | None, bool]:
    git = old.manifest.get("git")
    return (git.get("sha"), bool(git.get("dirty"))) if isinstance(git, dict) else (None, False)


def _render_drifts(old: Run, recorded: list[Recorded], run_id: str, new_dir: Path) -> list[str]:
    """With --set: what this jobgen renders differently from the record, the recorded experiment as it was."""
    before = recorded_experiment(old, [])
    now = _render(before, recorded, run_id, new_dir, _git(old), _halving(old, before, len(recorded)))
    return [
        line for rec in recorded for line in _render_drift(rec, _moved(old, rec, run_id, new_dir), now[rec.job.name])
    ]


def _render_drift(rec: Recorded, moved: tuple[dict[str, Any], str], now: tuple[dict[str, Any], str]) -> list[str]:
    """What this jobgen renders differently from the recorded job (both for the new run's folder)."""
    from jobgen.experiment.resolved import flatten

    out = []
    old_spec, new_spec = flatten(moved[0]), flatten(now[0])
    for key in sorted(set(old_spec) | set(new_spec)):
        if old_spec.get(key) != new_spec.get(key):
            out.append(
                f"{rec.job.name}: spec {key} was {old_spec.get(key)!r}, jobgen renders {new_spec.get(key)!r} now"
            )
    old_lines, new_lines = moved[1].splitlines(), now[1].splitlines()
    if old_lines != new_lines:
        n = next((i for i, (a, b) in enumerate(zip(old_lines, new_lines, strict=False)) if a != b), len(old_lines))
        old_line = old_lines[n] if n < len(old_lines) else ""
        new_line = new_lines[n] if n < len(new_lines) else ""
        out.append(
            f"{rec.job.name}: jobgen {__version__} renders its script differently from the recorded one "
            f"(line {n + 1}: {old_line!r} -> {new_line!r})"
        )
    return out


# --- package versions ---------------------------------------------------------------------------------------


def packages(old: Run, recorded: list[Recorded], code: Path) -> tuple[list[str], list[str]]:
    """(drift, notes): each package the jobs' result.json recorded whose version differs where they will
    run now, asked of the python they will run with (with the code snapshot first on its path)."""
    wanted: dict[str, tuple[str, str]] = {}
    for rec in recorded:
        doc, _ = rec.job.json("result.json")  # a damaged one is named by Run.problems
        for name, version in _recorded_packages(doc):
            wanted.setdefault(_norm(name), (name, version))
    if not wanted:
        return [], []
    python = job_python(recorded[0].spec, old.backend)
    if python is None:
        return [], [
            "package versions not checked: the jobs' python comes from env.modules, conda or setup on the nodes"
        ]
    try:
        now = installed(python, code)
    except JobgenError as exc:
        return [exc.message], []
    drift = [
        f"{name} {version} recorded, {now.get(norm) or 'not installed'} here ({python})"
        for norm, (name, version) in sorted(wanted.items())
        if now.get(norm) != version
    ]
    return drift, []


def _recorded_packages(doc: Any) -> list[tuple[str, str]]:
    if not isinstance(doc, dict):
        return []
    ran_on = doc.get("ran_on")
    listed = ran_on.get("packages") if isinstance(ran_on, dict) else None
    if isinstance(listed, list):
        pairs = [str(item).partition("==") for item in listed]
        return [(name, version) for name, sep, version in pairs if sep]
    versions = doc.get("versions")  # a result written before ran_on listed every package
    return [(k, str(v)) for k, v in versions.items() if v] if isinstance(versions, dict) else []


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def job_python(spec: dict[str, Any], backend: str) -> str | None:
    """The python a job's script starts, as found on this machine; None when only the nodes know it."""
    env = spec.get("env")
    env = env if isinstance(env, dict) else {}
    scheduler = backends.get(backend)
    python = str(env.get("python") or "")
    if not python and scheduler.runs_here:
        return scheduler.python()
    if not python and env.get("venv"):
        return str(Path(str(env["venv"])).expanduser() / "bin" / "python")
    if not python and (env.get("conda") or env.get("modules") or env.get("setup")):
        return None
    python = os.path.expanduser(python or scheduler.python())
    return python if os.sep in python else shutil.which(python) or python


def installed(python: str, code: Path) -> dict[str, str]:
    """normalized name -> version of every distribution `python` sees, as training/results.py lists them."""
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": str(code.parent) + (f":{path}" if path else "")}
    try:
        done = subprocess.run([python, "-c", _LIST_PACKAGES], capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        raise JobgenError(f"cannot check package versions: {python} does not run here ({exc})") from None
    try:
        listed = json.loads(done.stdout) if done.returncode == 0 else None
    except ValueError:
        listed = None
    if not isinstance(listed, list):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise JobgenError(f"cannot check package versions: {python} could not list them ({last})")
    pairs = [str(item).partition("==") for item in listed]
    return {_norm(name): version for name, _, version in pairs}
