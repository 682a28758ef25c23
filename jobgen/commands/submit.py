"""The submit path: load -> plan -> render -> write the run -> (dry-run stops here) -> submit.

Everything that can fail on the user's input fails before the run directory is written; after
that, every submitted job is recorded in the manifest at once, so a failure midway leaves a
manifest that says exactly which jobs are queued, and `jobgen submit --resume RUN` does the rest.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobgen import backends
from jobgen.backends import Scheduler
from jobgen.backends._queue import max_queued
from jobgen.commands import limits
from jobgen.errors import ConfigError, JobgenError, SubmitError
from jobgen.experiment import config, resolved, sites
from jobgen.experiment import halving as halving_config
from jobgen.facts import now_iso
from jobgen.plan import container
from jobgen.plan.container import DEFAULT_HF_HOME
from jobgen.plan.plan import Job, cache_dir_for, plan
from jobgen.plan.render import RunInfo, container_words, render_job
from jobgen.plan.spec import build_spec
from jobgen.record import store as record
from jobgen.record.model import Run, RunJob
from jobgen.states import State

Files = dict[str, str | bytes]  # path relative to the run folder -> content


@dataclass(frozen=True)
class Prepared:
    """A run written to disk, ready to submit."""

    run_dir: Path
    manifest: dict[str, Any]
    jobs: list[Job]
    notes: tuple[str, ...] = ()  # how limits were chosen (slurm.time/mem = "auto"), one line per job


def load_experiment(
    path: str | Path,
    backend: str | None = None,
    sets: list[str] | None = None,
    *,
    site: str | None = None,
    **launch: Any,
) -> config.Experiment:
    """Load an experiment; `--set` items and command-line choices (backend, array, ...) override it,
    and it overrides the site's defaults (`site` names one; see jobgen.experiment.sites.choose)."""
    return customize(config.load(path), backend, sets, sites.choose(site), **launch)


def customize(
    exp: config.Experiment, backend: str | None, sets: list[str] | None, site: sites.Site | None, **launch: Any
) -> config.Experiment:
    """An experiment with its `--set` items, command-line choices and site applied (site < file < --set)."""
    exp = config.with_sets(exp, sets or [])
    overrides = {k: v for k, v in {"backend": backend, **launch}.items() if v is not None}
    if overrides:
        raw = {**exp.raw, "launch": {**exp.raw.get("launch", {}), **overrides}}
        exp = config.build(raw, path=exp.path, text=exp.text, display=exp.label)
    return sites.apply(exp, site)


def prepare(
    path: str | Path,
    output_root: Path | None = None,
    *,
    backend: str | None = None,
    dry_run: bool = False,
    sets: list[str] | None = None,
    site: str | None = None,
    probe: dict[str, Any] | None = None,
    **launch: Any,
) -> Prepared:
    """Validate, plan and render every job, then write the whole run directory at once. With `probe`
    (a step budget, training/probe.py) the run is the experiment's probe (`jobgen probe`)."""
    exp = load_experiment(path, backend, sets, site=site, **launch)
    jobs = plan(exp)
    root = output_root_of(exp, output_root)
    code_dir = training_package_dir()
    notes: list[str] = []
    if probe is not None:
        jobs = limits.for_probe(jobs)
    else:
        jobs, notes = limits.auto_limits(exp, jobs, root, code_dir)
    git = record.git_info(code_dir)
    run_dir, manifest = write_new_run(
        root,
        exp.name,
        lambda run_id, run_dir: _render(exp, jobs, root, run_id, run_dir, git, dry_run, sets, probe),
        {"code/training": code_dir},
    )
    return Prepared(run_dir=run_dir, manifest=manifest, jobs=jobs, notes=tuple(notes))


def write_new_run(
    root: Path,
    experiment: str,
    make: Callable[[str, Path], tuple[dict[str, Any], Files]],
    copy_dirs: dict[str, Path],
) -> tuple[Path, dict[str, Any]]:
    """Claim a new run id under root/experiment and write the run whole: `make(run_id, run_dir)` gives its
    manifest and files (every file made before anything is written: a job that cannot render leaves no
    trace), `copy_dirs` the folders copied into it (the code snapshot)."""
    for _ in range(100):
        run_id = record.new_run_id(root)
        run_dir = record.inside(root, experiment, run_id)
        manifest, files = make(run_id, run_dir)
        if record.reserve_run(root, experiment, run_id):
            break
    else:
        raise JobgenError(f"{root / experiment}: no free run id after 100 tries; try again")
    record.write_run(run_dir, files, copy_dirs)
    return run_dir, manifest


def _render(
    exp: config.Experiment,
    jobs: list[Job],
    root: Path,
    run_id: str,
    run_dir: Path,
    git: tuple[str | None, bool, str],
    dry_run: bool,
    sets: list[str] | None,
    probe: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], Files]:
    """The run's manifest and every file it holds, by path relative to the run folder."""
    sha, dirty, patch = git
    scheduler = backends.get(exp.launch.backend)
    halved = halving_config.settings(exp.sweep.halving, exp.train.epochs, exp.data)
    run = run_info(exp, run_id, run_dir, (sha, dirty), halving=probe is None and halved is not None)
    files: dict[str, str | bytes] = {"experiment.toml": exp.text, "code.patch": patch}
    files[resolved.FILE] = resolved.text(exp.raw)
    missing = container.missing_mount_points(jobs[0], run_dir, cache_dir_for(jobs[0], root), run.hf_home)
    if missing:
        raise ConfigError(f"{exp.label}: container.image: {missing[0]}")
    entries = []
    for job in jobs:
        rel = f"jobs/{job.name}"
        script_rel = f"{rel}/{scheduler.script_name}"
        files[script_rel] = render_job(job, run)
        spec = build_spec(job, run, cache_dir_for(job, root))
        if probe is not None:
            spec["probe"] = dict(probe)
        elif halved is not None:
            spec["halving"] = halved.record()
        files[f"{rel}/spec.json"] = record.dumps(spec)
        fields = {"name": job.name, "index": job.index, "sweep": job.sweep, "dir": rel, "spec": f"{rel}/spec.json"}
        entries.append(
            new_entry({**fields, "script": script_rel}, scheduler.submit_command(run_dir / script_rel), dry_run)
        )
        words = container_words(job, run)
        if words:
            entries[-1]["container"] = words  # for a backend that writes the srun line itself (submitit)
        if exp.slurm.chain > 1:
            entries[-1]["chain"] = exp.slurm.chain
    manifest = record.manifest_doc(
        run_id, exp.name, exp.path, exp.launch.backend, dry_run, sha, dirty, entries, exp.experiment.description
    )
    if probe is not None:
        manifest["kind"] = record.PROBE
    elif halved is not None:
        manifest["halving"] = halved.record()
    if sets:
        manifest["overrides"] = list(sets)
    if exp.site:
        manifest["site"] = exp.site.record()
    if jobs and container.record(jobs[0]):
        manifest["container"] = container.record(jobs[0])  # [container] is one for the whole run
    if exp.launch.array:
        manifest["arrays"] = _arrays(jobs, entries, run, exp, files, scheduler, dry_run)
    if scheduler.can_wave:
        manifest["queue"] = queue_settings(
            exp.launch.max_queued, exp.launch.queue_reserve, exp.slurm.qos, exp.slurm.account
        )
    files[record.MANIFEST] = record.manifest_text(manifest)
    record.check_no_secrets({k: v for k, v in files.items() if isinstance(v, str)})
    return manifest, files


def queue_settings(max_queued: int, reserve: int, qos: str, account: str) -> dict[str, Any]:
    """A run's manifest "queue": what jobgen.commands.waves sizes its waves by when it is submitted."""
    return {"max_queued": max_queued, "reserve": reserve, "qos": qos, "account": account}


def _arrays(
    jobs: list[Job],
    entries: list[dict[str, Any]],
    run: RunInfo,
    exp: config.Experiment,
    files: dict[str, str | bytes],
    scheduler: Scheduler,
    dry_run: bool,
) -> list[dict[str, Any]]:
    """Render the sweep as job arrays; the jobs then carry their array and task index."""
    from jobgen.plan.arrays import render_arrays

    settings = scheduler.settings()
    size = scheduler.max_array_size(settings)
    if scheduler.can_wave and not dry_run:
        # Waves submit whole arrays: none may be larger than a wave.
        room = scheduler.queue_room(settings, exp.slurm.qos, exp.slurm.account) if not exp.launch.max_queued else None
        wave = max_queued(exp.launch.max_queued, exp.launch.queue_reserve, room)
        if wave is not None and wave < len(jobs):
            size = min(size, wave)
    arrays = render_arrays(jobs, [e["script"] for e in entries], run, exp.path, exp.launch.array_parallelism, size)
    by_name = {e["name"]: e for e in entries}
    out = []
    for array in arrays:
        files[array["script"]] = array.pop("text")
        for index, name in enumerate(array["tasks"]):
            by_name[name].update(array=array["name"], array_index=index, submit_command=None)
        state = State.DRY_RUN if dry_run else State.NOT_SUBMITTED
        out.append(
            {
                **array,
                "submit_command": scheduler.submit_command(run.run_dir / array["script"]),
                "job_id": None,
                "state": state.value,
                "error": None,
            }
        )
    return out


def new_entry(fields: dict[str, Any], command: list[str], dry_run: bool) -> dict[str, Any]:
    """A manifest entry not submitted yet: `fields` (name, index, sweep, dir, spec, script), then the rest."""
    return {
        **fields,
        "submit_command": command,
        "job_id": None,
        "array_index": None,
        "submitted_at": None,
        "state": (State.DRY_RUN if dry_run else State.NOT_SUBMITTED).value,
        "error": None,
    }


def run_info(
    exp: config.Experiment, run_id: str, run_dir: Path, git: tuple[str | None, bool], halving: bool
) -> RunInfo:
    """What a run's scripts say of it, made the same way for a submit and a rerun (whose drift check
    compares the two renders line by line)."""
    return RunInfo(
        run_id=run_id,
        run_dir=run_dir,
        git_sha=git[0],
        git_dirty=git[1],
        # Locally the jobs run with this very interpreter; on a cluster, with the nodes' `python`.
        default_python=backends.get(exp.launch.backend).python(),
        hf_home=hf_home(),
        jobgen_python=sys.executable,
        halving=halving,
    )


def hf_home() -> str:
    """The Hugging Face cache a container mounts: $HF_HOME of this shell, else ~/.cache/huggingface
    (~ stays the node's $HOME in the script)."""
    named = os.environ.get("HF_HOME")
    return str(Path(named).expanduser().absolute()) if named else DEFAULT_HF_HOME


def output_root_of(exp: config.Experiment, override: Path | None) -> Path:
    root = Path(override) if override else Path(exp.experiment.output_root).expanduser()
    root = root.resolve()
    if any(c in str(root) for c in "\n\r"):
        raise JobgenError(f"output root {str(root)!r} contains a line break; choose another folder")
    return root


def training_package_dir() -> Path:
    """Where the training package lives (found without importing it: it pulls in torch)."""
    spec = importlib.util.find_spec("training")
    if spec is None or not spec.submodule_search_locations:
        raise JobgenError("the 'training' package is not installed next to jobgen; reinstall jobgen")
    return Path(list(spec.submodule_search_locations)[0])


def submit_pending(run_dir: Path, on_submit: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Submit every job (or array) of a run that has no job id yet; record each one as soon as it is queued.
    The WAITING jobs of a run that waves are jobgen.commands.waves.top_up's.

    Safe to call again (`--resume`), even at once from two shells: what was submitted is skipped, and a
    job whose submission was tried but not recorded (sbatch timed out, its reply was lost, the disk
    filled up) is looked for on the cluster, by the tag in its comment, before it is submitted again.
    """
    with record.run_lock(run_dir):
        manifest = record.load_manifest(run_dir)
        if manifest.get("dry_run"):
            raise JobgenError(f"{run_dir} is a dry run; submit the experiment file again without --dry-run")
        key = "arrays" if manifest.get("arrays") else "jobs"
        pending = [e for e in manifest[key] if not e.get("job_id") and e["state"] == State.NOT_SUBMITTED.value]
        submit_entries(run_dir, manifest, key, pending, on_submit)
        backend = backends.get(manifest["backend"])
        if backend.runs_here and manifest.get("halving"):
            _resume_promoted(run_dir, backend, manifest)
            record.compact(run_dir)
        return record.load_manifest(run_dir)


def _resume_promoted(run_dir: Path, backend: Scheduler, manifest: dict[str, Any]) -> None:
    """Local halving: run again, in order, each paused job that a later report promoted."""
    from jobgen.results import halving as halving_view
    from training.halving import Settings

    def run_one(entry: dict[str, Any]) -> None:
        # The entry as recorded now (its first run's fields: the time it ran so far), not as at the start.
        now = {e["name"]: e for e in record.load_manifest(run_dir)["jobs"]}.get(entry["name"], entry)
        record.update_jobs(run_dir, {entry["name"]: backend.submit(run_dir, now)})

    halving_view.resume_local(run_dir, Settings.from_record(manifest["halving"]), manifest["jobs"], run_one)


def submit_entries(
    run_dir: Path,
    manifest: dict[str, Any],
    key: str,
    pending: list[dict[str, Any]],
    on_submit: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Submit these entries of a run's manifest (`key`: jobs or arrays), at most once each; the caller
    holds the run's submit lock (record.run_lock)."""
    backend = backends.get(manifest["backend"])
    tried = [e for e in pending if e.get("submit_tried_at")]
    found = backend.find(run_dir, tried, min(e["submit_tried_at"] for e in tried)) if tried else {}
    try:
        _submit_all(run_dir, backend, manifest, key, pending, found, on_submit)
    except JobgenError as exc:
        if isinstance(exc, SubmitError):
            raise
        raise JobgenError(
            f"{exc.message}; then run: jobgen submit --resume {run_dir} (a job already queued is "
            "found, not submitted twice)"
        ) from None
    finally:
        record.compact(run_dir)  # the journal of this submission, folded into manifest.json once


def _submit_all(
    run_dir: Path,
    backend: Scheduler,
    manifest: dict[str, Any],
    key: str,
    pending: list[dict[str, Any]],
    found: dict[str, list[str]],
    on_submit: Callable[[dict[str, Any]], None] | None,
) -> None:
    # One note for all, on disk before the first sbatch runs: if an answer never comes (a crash, a lost
    # reply), the next try knows to look for these jobs on the cluster before it submits them again.
    fresh = {e["name"]: {"submit_tried_at": now_iso()} for e in pending if not found.get(e["name"])}
    if fresh:
        record.update_jobs(run_dir, fresh, key=key)
    for n, entry in enumerate(pending):
        entry.update(fresh.get(entry["name"], {}))
        try:
            _submit_entry(run_dir, backend, manifest, key, entry, found, on_submit)
        except BaseException:
            # The jobs after this one were never handed to sbatch: nothing to look for next time.
            untried = {e["name"]: {"submit_tried_at": None} for e in pending[n + 1 :] if e["name"] in fresh}
            if untried:
                with contextlib.suppress(JobgenError):  # if even that fails, resume asks Slurm: still safe
                    record.update_jobs(run_dir, untried, key=key)
            raise


def _submit_entry(
    run_dir: Path,
    backend: Scheduler,
    manifest: dict[str, Any],
    key: str,
    entry: dict[str, Any],
    found: dict[str, list[str]],
    on_submit: Callable[[dict[str, Any]], None] | None,
) -> None:
    ids = sorted(found.get(entry["name"]) or [], key=_id_order)
    if ids:  # queued by the earlier try: keep it, submit nothing
        fields = {
            "job_id": ids[0].split("_")[0] if key == "arrays" else ids[0],
            "state": State.SUBMITTED.value,
            "submitted_at": entry["submit_tried_at"],
            "found_on_cluster": True,
        }
        if int(entry.get("chain") or 1) > 1:
            fields["segments"] = ids  # the segments queued before the answer was lost
    else:
        fields = _submit_one(run_dir, backend, entry, manifest, key)
    _record_submitted(run_dir, entry, fields, key)
    if on_submit:
        on_submit(entry)


def _submit_one(
    run_dir: Path, backend: Scheduler, entry: dict[str, Any], manifest: dict[str, Any], key: str
) -> dict[str, Any]:
    chain = int(entry.get("chain") or 1)
    try:
        return backend.submit_chain(run_dir, entry, chain) if chain > 1 else backend.submit(run_dir, entry)
    except SubmitError as exc:
        # A plain refusal queued nothing: no need to look for the job next time.
        tried = {} if exc.maybe_queued else {"submit_tried_at": None}
        record.update_jobs(run_dir, {entry["name"]: {"error": exc.message, **tried}}, key=key)
        done = sum(1 for e in record.load_manifest(run_dir)[key] if e.get("job_id"))
        raise SubmitError(
            f"{exc.message} ({done} of {len(manifest[key])} {key} submitted; after fixing it run: "
            f"jobgen submit --resume {run_dir}; a job Slurm took without saying so is found, not submitted twice)"
        ) from None


def _record_submitted(run_dir: Path, entry: dict[str, Any], fields: dict[str, Any], key: str) -> None:
    entry.update(fields)
    # Not fsync'ed: a crash of jobgen leaves it in the page cache, and after a crash of the machine the
    # note written before sbatch finds the job by its tag.
    record.update_jobs(run_dir, {entry["name"]: {**fields, "error": None}}, key=key, durable=False)
    if key == "arrays":
        tasks = {
            name: {**fields, "job_id": f"{fields['job_id']}_{i}", "error": None}
            for i, name in enumerate(entry["tasks"])
        }
        record.update_jobs(run_dir, tasks, durable=False)


def _id_order(job_id: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", job_id))


def test_only(run_dir: Path, manifest: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """(name, accepted, sbatch's words) for every job (or array) of a dry run; nothing is queued."""
    scheduler = backends.get(manifest["backend"])
    return [
        (job["name"], *scheduler.test_only(run_dir / job["script"]))
        for job in manifest.get("arrays") or manifest["jobs"]
    ]


def show(run_dir: Path, manifest: dict[str, Any], with_scripts: bool) -> list[str]:
    """Lines that show what a run holds: per job the script and the exact submit command."""
    import shlex

    lines = [f"run: {run_dir}"]
    if manifest.get("site"):
        lines.append(sites.describe(manifest["site"]))
    if manifest.get("container"):
        lines.append(f"container: {manifest['container']['runtime']} {manifest['container']['image']}")
    for job in manifest.get("arrays") or manifest["jobs"]:
        lines.append(f"  {job['name']}: {run_dir / job['script']}")
        lines.append(f"    $ {shlex.join(job['submit_command'])}")
        if manifest.get("container") and not with_scripts and "arrays" not in manifest:
            lines += ["    " + line for line in launch_lines((run_dir / job["script"]).read_text(encoding="utf-8"))]
        if int(job.get("chain") or 1) > 1:
            command = job["submit_command"]
            after = shlex.join([*command[:-1], "--dependency=afterany:<previous id>", command[-1]])
            lines.append(f"    $ {after}    # segments 2..{job['chain']} of the chain")
        if with_scripts:
            lines.append((run_dir / job["script"]).read_text(encoding="utf-8"))
    return lines


def launch_lines(script: str) -> list[str]:
    """The lines of a script that start the tasks (its srun step or exec, with their continuation
    lines): what --dry-run shows of a container's wrapping."""
    lines = script.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"(run_step )?(srun|exec) ", line)]
    if not starts:
        return []
    end = starts[-1]
    while end < len(lines) - 1 and lines[end].endswith("\\"):
        end += 1
    return lines[starts[-1] : end + 1]


def cancel(run: Run, names: list[str]) -> list[RunJob]:
    """Cancel the named jobs of a run (all when none named) that have a job id; returns them. For the
    whole run, waves.stop_sweep comes first: no job on its way out then submits or requeues another."""
    chosen = [job for job in run.pick(names) if job.job_id]
    if chosen:
        # A chained job is all its segments: cancelling only the running one would start the next.
        backends.get(run.backend).cancel([i for job in chosen for i in job.ids])
        record.update_jobs(run.run_dir, {job.name: {"cancel_requested_at": now_iso()} for job in chosen})
        record.compact(run.run_dir)
    return chosen
