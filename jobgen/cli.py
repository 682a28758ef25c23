"""The `jobgen` command: a thin door. Each command parses, calls one library function, prints.

Nothing heavy is imported here (a login node must answer `jobgen --help` at once): commands
import what they need inside their own bodies.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from jobgen import __version__, backends
from jobgen.completion import experiment_files, run_refs
from jobgen.errors import JobgenError
from jobgen.states import State

# Options that mean something only beside another: command -> {option: the options, one of which it
# needs}. Given alone they are refused as usage errors, never silently ignored.
NEEDS: dict[str, dict[str, tuple[str, ...]]] = {
    "submit": {"show": ("dry_run", "test_only")},
    "rerun": {"show": ("dry_run",)},
    "status": {"interval": ("watch",), "timeout": ("watch",)},
}
# Options that contradict each other: command -> groups of which at most one may be given.
EXCLUSIVE: dict[str, list[tuple[str, ...]]] = {
    "logs": [("out", "err")],
}


def _given(ctx: click.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source is not click.core.ParameterSource.DEFAULT


def _flag(ctx: click.Context, name: str) -> str:
    return next(p.opts[0] for p in ctx.command.params if p.name == name)


def check_option_rules(ctx: click.Context) -> None:
    """Refuse (usage error, exit 2) an option given without the one it needs, or beside one it excludes."""
    command = ctx.command.name or ""
    for name, needs in NEEDS.get(command, {}).items():
        if _given(ctx, name) and not any(_given(ctx, need) for need in needs):
            raise click.UsageError(f"{_flag(ctx, name)} goes with {' or '.join(_flag(ctx, n) for n in needs)}", ctx)
    for group in EXCLUSIVE.get(command, []):
        given = [_flag(ctx, name) for name in group if _given(ctx, name)]
        if len(given) > 1:
            raise click.UsageError(f"{' and '.join(given)} cannot go together: give one", ctx)


class _Command(click.Command):
    """Every command also takes --output-root after its name (jobgen submit X --output-root DIR), as
    users write it and scripts pass it on; given there, it wins over the one before the command."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not any(p.name == "output_root" for p in self.params):
            self.params.append(
                click.Option(["--output-root"], type=click.Path(file_okay=False), help="As jobgen --output-root.")
            )

    def invoke(self, ctx: click.Context) -> Any:
        given = ctx.params.pop("output_root", None)
        if given is not None:
            ctx.find_root().params["output_root"] = given
        check_option_rules(ctx)
        return super().invoke(ctx)


class _Group(click.Group):
    """Turns unexpected exceptions into one-line errors; --debug shows the traceback."""

    command_class = _Command

    def invoke(self, ctx: click.Context) -> Any:
        # No cycle collection while a command runs: its per-job objects live until it ends, and the
        # collector's passes over them cost more than it frees (bench/bench_status.py, "gc on").
        collecting = gc.isenabled()
        gc.disable()
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.Abort, click.UsageError):
            raise
        except click.ClickException:
            if _debug(ctx):
                traceback.print_exc()
            raise
        except KeyboardInterrupt:
            raise click.Abort() from None
        except BrokenPipeError:
            raise  # its reader went away (`jobgen status | head`): click ends the command quietly, status 1
        except Exception as exc:
            if _debug(ctx):
                raise
            raise JobgenError(f"{type(exc).__name__}: {exc} (rerun with --debug for the traceback)") from None
        finally:
            if collecting:
                gc.enable()  # in-process callers (tests, notebooks) get their collector back


@contextlib.contextmanager
def _json_alone(fmt: str) -> Iterator[None]:
    """With --format json, what is printed inside (a local job's output, a library's words) goes to
    stderr, so that stdout holds the JSON the command prints after it alone."""
    if fmt != "json":
        yield
        return
    with contextlib.redirect_stdout(sys.stderr):
        yield


def _debug(ctx: click.Context) -> bool:
    root = ctx.find_root()
    return bool(root.params.get("debug")) or os.environ.get("JOBGEN_DEBUG") == "1"


def _root(ctx: click.Context) -> Path | None:
    value = ctx.find_root().params.get("output_root")
    return Path(value) if value else None


def _lookup_root(ctx: click.Context) -> Path:
    return _root(ctx) or Path("runs")


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="jobgen")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.option(
    "--output-root",
    envvar="JOBGEN_OUTPUT_ROOT",
    type=click.Path(file_okay=False),
    help="Where runs live (default: the experiment's output_root, else ./runs). Env: JOBGEN_OUTPUT_ROOT.",
)
def main(debug: bool, output_root: str | None) -> None:
    """Run Hugging Face fine-tuning experiments on Slurm.

    \b
    jobgen validate experiments/imdb_fsdp.toml      check a file (and its sweep)
    jobgen prefetch experiments/imdb_fsdp.toml      download data and model here, for offline nodes
    jobgen submit experiments/imdb_fsdp.toml --dry-run --show
    jobgen submit experiments/imdb_fsdp.toml        submit, record the run, return
    jobgen status imdb_fsdp                         states of the latest run
    jobgen summary imdb_fsdp                        time and accuracy per job
    jobgen diff RUN_A RUN_B                         what differs between two runs, and their results
    jobgen rerun RUN                                a new run of RUN's jobs, from its record
    jobgen report imdb_fsdp -o report.html          one HTML page to share: table, curves, causes
    jobgen requeue imdb_fsdp                        failed jobs resume from their checkpoints
    """


class _OutFile(click.Path):
    """A file a command writes: its folder must exist already (jobgen makes no folders: a typo in one
    would put the file where nobody looks)."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = super().convert(value, param, ctx)
        folder = Path(os.fsdecode(path)).parent
        if not folder.is_dir():
            self.fail(f"the folder {folder} does not exist; create it first or write the file elsewhere", param, ctx)
        return path


SET_HELP = (
    "Override one experiment key, e.g. --set train.epochs=1 --set slurm.partition=debug (VALUE as in TOML; repeatable)."
)
# The site's defaults sit under the experiment file (jobgen/experiment/sites.py; docs/guides/sites.md).
site_option = click.option(
    "--site",
    metavar="NAME",
    help="Take defaults from this site of the sites file (env: JOBGEN_SITE; default: the site whose "
    "cluster_name is this cluster's).",
)


@main.command()
@click.argument("experiment", required=False, type=click.Path(dir_okay=False), shell_complete=experiment_files)
@click.option("--dry-run", is_flag=True, help="Write the run directory and show the commands; submit nothing.")
@click.option("--show", is_flag=True, help="With --dry-run: print every script too.")
@click.option(
    "--test-only",
    is_flag=True,
    help="A dry run that also asks Slurm (sbatch --test-only) whether it accepts every job, and when it would start.",
)
@click.option("--backend", type=click.Choice(backends.names()), help="Override launch.backend.")
@click.option("--array", is_flag=True, default=None, help="Submit the sweep as Slurm job array(s) (launch.array).")
@click.option("--array-parallelism", type=click.IntRange(min=1), help="Most array tasks running at once.")
@click.option(
    "--resume",
    "resume_run",
    type=click.Path(file_okay=False, exists=True),
    help="Submit the jobs of RUN that are not queued yet (after a failure midway).",
)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@site_option
@click.pass_context
def submit(
    ctx: click.Context,
    experiment: str | None,
    dry_run: bool,
    show: bool,
    test_only: bool,
    backend: str | None,
    array: bool | None,
    array_parallelism: int | None,
    resume_run: str | None,
    sets: tuple[str, ...],
    site: str | None,
) -> None:
    """Validate EXPERIMENT, write a run directory, and submit (or run) its jobs."""
    from jobgen.commands import submit as sub

    if resume_run:
        if experiment or sets or site:
            raise click.UsageError(
                "--resume RUN submits a run as it was written: no EXPERIMENT or --set with it (nor --site)"
            )
        _submit_and_report(Path(resume_run).resolve())
        return
    if not experiment:
        raise click.UsageError("missing EXPERIMENT (a .toml file), or --resume RUN")
    dry_run = dry_run or test_only
    if test_only:
        chosen = sub.load_experiment(experiment, backend, list(sets), site=site).launch.backend
        if not backends.get(chosen).can_test_only:
            raise JobgenError(
                f"--test-only checks sbatch scripts; {experiment} uses the {chosen} backend (add --backend sbatch)"
            )
    prepared = sub.prepare(
        experiment,
        _root(ctx),
        backend=backend,
        dry_run=dry_run,
        sets=list(sets),
        site=site,
        array=array,
        array_parallelism=array_parallelism,
    )
    for note in prepared.notes:
        click.echo(f"limits: {note}")
    if dry_run:
        from jobgen.commands import waves

        click.echo("\n".join(sub.show(prepared.run_dir, prepared.manifest, show)))
        click.echo(f"dry run: {len(prepared.jobs)} job(s) written, nothing submitted")
        if test_only:
            _test_only(prepared.run_dir, prepared.manifest)
        for line in waves.preview(prepared.manifest):
            click.echo(line)
        return
    click.echo(f"run: {prepared.run_dir}")
    _submit_and_report(prepared.run_dir)


def _test_only(run_dir: Path, manifest: dict[str, Any]) -> None:
    from jobgen.commands.submit import test_only

    refused = []
    click.echo("sbatch --test-only:")
    for name, accepted, words in test_only(run_dir, manifest):
        click.echo(f"  {name}: {'accepted' if accepted else 'REFUSED'}: {words}")
        if not accepted:
            refused.append(f"{name}: {words}")
    total = len(manifest.get("arrays") or manifest["jobs"])
    if refused:
        raise JobgenError(f"sbatch --test-only refused {len(refused)} of {total}; first: {refused[0]}")
    click.echo(f"sbatch --test-only accepts all {total}; submit without --test-only to queue them")


def _submit_and_report(run_dir: Path) -> None:
    from jobgen.commands import waves

    def report(job: dict[str, Any]) -> None:
        if job.get("tasks"):
            click.echo(f"  {job['name']}: submitted as array {job['job_id']} ({len(job['tasks'])} tasks)")
        elif job.get("segments"):
            click.echo(
                f"  {job['name']}: submitted as a chain of {len(job['segments'])} jobs "
                f"{' -> '.join(job['segments'])} (each starts after the one before ends)"
            )
        elif job.get("job_id"):
            click.echo(f"  {job['name']}: submitted as job {job['job_id']}")
        else:
            click.echo(f"  {job['name']}: {job['state']}")

    manifest = waves.submit_run(run_dir, on_submit=report, say=click.echo)
    if backends.get(manifest["backend"]).runs_here:
        from jobgen.results import halving as halving_view
        from jobgen.results.state_rule import (
            read_runs,  # the local backend's summary: sbatch's submission imports neither
        )
        from jobgen.results.summary import summarize

        (run,) = read_runs([run_dir])  # the one state rule: exit 0 without a result is not COMPLETED
        click.echo(summarize([run], baseline=None, fmt="table", plot=None))
        planned = halving_view.ended_as_planned(run)  # shown as such, not as failures
        failed = [job.name for job in run.jobs if job.state is not State.COMPLETED and job.name not in planned]
        if failed:
            raise JobgenError(f"{len(failed)} job(s) did not complete: {', '.join(failed)}; see jobgen logs {run_dir}")
    else:
        waiting = waves.count_waiting(run_dir)
        queued = sum(1 for job in manifest["jobs"] if job.get("job_id"))
        if waiting and not queued:
            click.echo(
                f"nothing fits in the queue now: {waiting} job(s) WAITING; once jobs have ended, run: "
                f"jobgen top-up {run_dir} (jobgen status does it too)"
            )
        elif waiting:
            click.echo(
                f"{queued} job(s) queued, {waiting} WAITING for room in the queue (at most "
                f"{(waves.read(run_dir) or {}).get('max_queued')} queued at once): each job that ends submits "
                f"the next, and so do jobgen status and jobgen top-up; follow with: jobgen status {run_dir}"
            )
        else:
            click.echo(f"{len(manifest['jobs'])} job(s) queued; follow with: jobgen status {run_dir}")


def _one_run(ctx: click.Context, ref: str | None) -> Path:
    """The run folder a command about one run means (default: the latest run under the output root)."""
    from jobgen.record.lookup import find_runs

    (run_dir,) = find_runs([ref] if ref else [], _lookup_root(ctx))
    return run_dir


def _many_runs(ctx: click.Context, refs: tuple[str, ...], all_runs: bool) -> list[Path]:
    """The run folders RUNS means; with --all-runs every run of their experiments."""
    from jobgen.record.lookup import every_run_of, find_runs

    run_dirs = find_runs(list(refs), _lookup_root(ctx))
    return every_run_of(run_dirs) if all_runs else run_dirs


def runs_argument(command: Any) -> Any:
    """RUNS and --all-runs, as every command that reads several runs takes them."""
    command = click.option("--all-runs", is_flag=True, help="Every run of each experiment named, not only its latest.")(
        command
    )
    return click.argument("runs", nargs=-1, shell_complete=run_refs)(command)


def _warn(runs: Any) -> None:
    """One line on stderr per damaged record of the runs' jobs (jobgen.record.model.RunJob.problems)."""
    for run in runs:
        if isinstance(run, Path):
            continue  # its manifest is damaged: the command's own output says so
        for line in run.problems():
            click.echo(f"warning: {run.run_dir}/{line}", err=True)
        for line in run.notes:
            click.echo(f"warning: {line}", err=True)


@main.command()
@click.argument("experiment", type=click.Path(dir_okay=False), shell_complete=experiment_files)
@click.option(
    "--steps", default=20, show_default=True, type=click.IntRange(1, 100_000), help="Timed optimizer steps per point."
)
@click.option(
    "--warmup-steps",
    default=5,
    show_default=True,
    type=click.IntRange(0, 100_000),
    help="Optimizer steps before the timed ones (at least train.warmup_compile_steps).",
)
@click.option(
    "--eval-samples",
    default=256,
    show_default=True,
    type=click.IntRange(1, 10_000_000),
    help="Rows of validation and of test each point scores.",
)
@click.option("--backend", type=click.Choice(backends.names()), help="Override launch.backend.")
@click.option("--timeout", type=click.FloatRange(min=0), help="Give up waiting after this many seconds.")
@click.option(
    "--interval",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds between looks.",
)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@site_option
@click.pass_context
def probe(
    ctx: click.Context,
    experiment: str,
    steps: int,
    warmup_steps: int,
    eval_samples: int,
    backend: str | None,
    timeout: float | None,
    interval: float,
    fmt: str,
    sets: tuple[str, ...],
    site: str | None,
) -> None:
    """Run every sweep point of EXPERIMENT for a few steps, as real jobs, and predict each full job's wall
    time and peak memory (what slurm.time = "auto" and slurm.mem = "auto" ask for)."""
    import json

    from jobgen.commands import probe as probing
    from jobgen.results.status_view import format_table

    def started(run_dir: Path) -> None:
        click.echo(f"probe run: {run_dir} (waiting for its jobs)", err=fmt == "json")

    with _json_alone(fmt):
        done = probing.probe(
            experiment,
            _root(ctx),
            backend=backend,
            sets=list(sets),
            site=site,
            steps=steps,
            warmup_steps=warmup_steps,
            eval_samples=eval_samples,
            timeout=timeout,
            interval=interval,
            on_run=started,
            say=lambda line: click.echo(line, err=fmt == "json"),
        )
    if fmt == "json":
        click.echo(json.dumps([p.as_json() for p in done.points], indent=2))
        return
    click.echo(format_table(*probing.table(done.points)))
    for line in probing.failures(done.points):
        click.echo(f"failed: {line}")
    click.echo(f'predictions in {done.run_dir / "predictions.json"}; slurm.time = "auto" uses them')


@main.command()
@click.argument("run", required=False, shell_complete=run_refs)
@click.option("--watch", is_flag=True, help="Refresh until every job has ended.")
@click.option(
    "--interval",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="With --watch: seconds between refreshes.",
)
@click.option("--timeout", type=click.FloatRange(min=0), help="With --watch: give up after this many seconds.")
@click.option("--refresh", is_flag=True, help="Ask Slurm about every job, also those recorded as ended.")
@click.pass_context
def status(
    ctx: click.Context, run: str | None, watch: bool, interval: float, timeout: float | None, refresh: bool
) -> None:
    """One row per job of RUN (a run folder, experiment name or file; default: the latest run)."""
    from jobgen.commands.wait import watch_status
    from jobgen.results.status_view import format_table

    run_dir = _one_run(ctx, run)
    _top_up_quietly(run_dir)
    for n, view in enumerate(watch_status(run_dir, interval=interval, timeout=timeout, refresh=refresh)):
        click.echo(("\n" if n else "") + f"run: {run_dir}\n{format_table(view.header, view.rows)}")
        for line in view.warnings:
            click.echo(f"warning: {view.run_dir}/{line}", err=True)
        for line in view.notes:
            click.echo(f"warning: {line}", err=True)
        if not watch:
            return


def _top_up_quietly(run_dir: Path) -> None:
    """Submit the waiting jobs of a run that waves and that fit now (launch.max_queued); a refusal is a
    warning here: the command was asked for something else."""
    from jobgen.commands import waves

    try:
        done = waves.top_up(run_dir)
    except JobgenError as exc:
        click.echo(f"warning: the run's waiting jobs were not submitted: {exc.message}", err=True)
        return
    if done.submitted or done.requeued:
        requeued = f"requeued {done.requeued} promoted job(s) of the sweep, " if done.requeued else ""
        click.echo(
            f"top-up: {requeued}submitted {done.submitted} waiting job(s) of the sweep; {done.waiting} still WAITING",
            err=True,
        )
    if done.stalled(run_dir):
        click.echo(f"warning: {done.stalled(run_dir)}", err=True)


@main.command(name="top-up")
@click.argument("run", shell_complete=run_refs)
@click.option(
    "--leaving",
    metavar="JOB_ID",
    help="The job running this on its way out (its batch script's exit path): not counted as queued.",
)
@click.pass_context
def top_up(ctx: click.Context, run: str, leaving: str | None) -> None:
    """Submit the jobs of RUN that wait for room in the queue (launch.max_queued) and fit now."""
    from jobgen.commands import waves

    run_dir = _one_run(ctx, run)
    done = waves.top_up(run_dir, leaving=leaving, wait_if_last=leaving is not None)
    requeued = f", requeued {done.requeued} promoted job(s)" if done.requeued else ""
    click.echo(f"top-up: {run_dir}: submitted {done.submitted}{requeued}, {done.waiting} still WAITING")
    if done.stalled(run_dir):
        click.echo(f"warning: {done.stalled(run_dir)}", err=True)


@main.command()
@click.argument("experiments", nargs=-1, shell_complete=run_refs)
@click.option("--refresh", is_flag=True, help="Ask Slurm for the states of jobs not known to have ended.")
@click.pass_context
def runs(ctx: click.Context, experiments: tuple[str, ...], refresh: bool) -> None:
    """List the runs of EXPERIMENTS (names or files; default: all), oldest first, with their jobs' states."""
    from jobgen.record.lookup import list_runs
    from jobgen.results.status_view import format_table, runs_table

    root = _lookup_root(ctx)
    found = list_runs(list(experiments), root)
    click.echo(format_table(*runs_table(found, root, refresh)) if found else f"no runs under {root}")


@main.command()
@click.argument("run", required=False, shell_complete=run_refs)
@click.argument("job", required=False)
@click.option("--err", is_flag=True, help="Show the error stream (Slurm's .err file).")
@click.option("--out", is_flag=True, help="Show the output stream (the default).")
@click.option("--rank", type=click.IntRange(min=0), help="Only the lines of this rank.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the job ends.")
@click.pass_context
def logs(
    ctx: click.Context, run: str | None, job: str | None, err: bool, out: bool, rank: int | None, follow: bool
) -> None:
    """Print a job's output; per-rank lines are labelled [rank N]."""
    from jobgen.record.model import Run
    from jobgen.results import logs as joblogs
    from jobgen.results.state_rule import read_runs

    stream = "err" if err else "out"
    loaded = Run.load(_one_run(ctx, run))
    entry = loaded.find(job)
    for line in entry.problems():
        click.echo(f"warning: {loaded.run_dir}/{line}", err=True)
    if follow:

        def finished() -> bool:
            (now,) = read_runs([loaded.run_dir])
            return now.find(entry.name).state.is_final

        lines = joblogs.follow(lambda: joblogs.files(loaded.backend, entry.job_dir, stream), rank, finished)
    else:
        files = joblogs.files(loaded.backend, entry.job_dir, stream)
        if not files:
            raise JobgenError(f"{entry.name}: no {stream} log yet in {entry.job_dir} (state {entry.recorded.value})")
        lines = joblogs.read_lines(files, rank)
    shown = 0
    for line in lines:
        click.echo(line)
        shown += 1
    if rank is not None and not shown:
        found = joblogs.ranks(joblogs.files(loaded.backend, entry.job_dir, stream))
        raise JobgenError(
            f"{entry.name}: no line of rank {rank} in its {stream} log; "
            f"ranks with lines: {', '.join(map(str, found)) or 'none'}"
        )


@main.command()
@click.argument("run", shell_complete=run_refs)
@click.argument("jobs", nargs=-1)
@click.pass_context
def cancel(ctx: click.Context, run: str, jobs: tuple[str, ...]) -> None:
    """Cancel the jobs of RUN (all of them, or the JOBS named).

    A job named that waits for room in the queue is not submitted. With no JOBS the whole run stops:
    no waiting job is submitted, and a halving run promotes and requeues nothing more (until a jobgen
    requeue of its jobs).
    """
    from jobgen.commands import waves
    from jobgen.commands.submit import cancel as cancel_jobs
    from jobgen.record.model import Run

    loaded = Run.load(_one_run(ctx, run))
    loaded.pick(list(jobs))  # a name not in the run: one line, before anything is cancelled
    waiting = waves.stop_sweep(loaded.run_dir, jobs)  # before the jobs end: theirs submit nothing
    cancelled = cancel_jobs(loaded, list(jobs))
    for job in cancelled:
        ids = job.ids
        click.echo(f"  {job.name}: cancel sent to job{'s' if len(ids) > 1 else ''} {', '.join(ids)}")
    for name in waiting:
        click.echo(f"  {name}: WAITING, cancelled: it will not be submitted")
    count = len(cancelled) + len(waiting)
    click.echo(f"{count} job(s) cancelled" if count else "nothing to cancel (no job of this run is queued)")


@main.command()
@click.argument("run", shell_complete=run_refs)
@click.argument("jobs", nargs=-1)
@click.pass_context
def requeue(ctx: click.Context, run: str, jobs: tuple[str, ...]) -> None:
    """Start jobs of RUN again; each resumes from its newest checkpoint.

    With no JOBS: every job that ended without success (failed, cancelled, timed out, out of memory,
    node failure, preempted); not a job that halving paused or stopped at a rung (it ended as planned).
    Named JOBS may also be running: with slurm.requeue on they get the warning signal and checkpoint
    first. Slurm keeps the job id when it can; a job it has forgotten is submitted again (the manifest
    keeps its earlier ids).
    """
    from jobgen.commands.requeue import requeue as requeue_jobs
    from jobgen.record.model import Run

    run_dir = _one_run(ctx, run)
    outcomes = requeue_jobs(run_dir, list(jobs))
    _warn([Run.load(run_dir)])
    for o in outcomes:
        click.echo(f"  {o.name} ({o.shown or o.state.value}, job {o.job_id or '-'}): {o.action}: {o.detail}")
    started = sum(o.action != "skipped" for o in outcomes)
    if started:
        click.echo(f"{started} job(s) requeued; follow them with: jobgen status {run_dir} --watch")
    elif jobs:
        click.echo("nothing requeued")
    else:
        click.echo("nothing to requeue: no job of this run ended without success")


@main.command()
@runs_argument
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "markdown", "json"]),
    default="table",
    show_default=True,
    help="Output format.",
)
@click.option(
    "--plot", type=_OutFile(), help="Also draw training time, test accuracy and cost vs accuracy to this PNG."
)
@click.option(
    "--baseline",
    help="Configuration (job name) speed-ups are measured against "
    "(default: the slowest plain-PyTorch one, else the slowest).",
)
@click.option(
    "--combine/--no-combine",
    default=True,
    show_default=True,
    help="Combine runs of one configuration (seeds, repeats) into mean ± std (n).",
)
@click.option(
    "--refresh",
    is_flag=True,
    help="Ask Slurm about every job and its usage, also what the manifest kept of jobs that ended.",
)
@click.pass_context
def summary(
    ctx: click.Context,
    runs: tuple[str, ...],
    fmt: str,
    plot: str | None,
    baseline: str | None,
    combine: bool,
    refresh: bool,
    all_runs: bool,
) -> None:
    """Time and accuracy of every job of RUNS (run folders, experiment names or files; default: the latest run)."""
    from jobgen.results.summary import summary_text

    color = fmt == "table" and sys.stdout.isatty()
    with _json_alone(fmt):
        text, warnings = summary_text(
            _many_runs(ctx, runs, all_runs),
            refresh=refresh,
            baseline=baseline,
            fmt=fmt,
            plot=Path(plot) if plot else None,
            combine=combine,
            color=color,
        )
    click.echo(text, nl=False)
    for line in warnings:
        click.echo(f"warning: {line}", err=True)
    if plot:
        click.echo(f"plot: {plot}", err=True)


@main.command()
@click.argument("a", metavar="A", shell_complete=run_refs)
@click.argument("b", metavar="B", shell_complete=run_refs)
@click.option("--job", metavar="NAME", help="Compare this job of A with the job of that name in B.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_context
def diff(ctx: click.Context, a: str, b: str, job: str | None, fmt: str) -> None:
    """What differs between runs A and B: experiment keys, code, package versions, cluster and nodes,
    then the results of their jobs side by side. Identical parts are folded away.

    A and B are run folders, run ids or experiment names (its latest run). To compare two jobs, write
    RUN:JOB for each, or give --job NAME for a job both runs have (a job's resolved spec.json is
    compared instead of the run's resolved experiment, experiment.resolved.toml).
    """
    from jobgen.results.diff import diff as diff_sides
    from jobgen.results.diff import render_json, render_text

    one, two = _side(ctx, a, job), _side(ctx, b, job)
    if (one.job is None) != (two.job is None):
        raise click.UsageError("compare two runs, or two jobs (RUN:JOB for both, or --job NAME)", ctx)
    with _json_alone(fmt):
        doc = diff_sides(one, two)
    click.echo(render_json(doc) if fmt == "json" else render_text(doc), nl=False)
    _warn([one.run] if one.run.run_dir == two.run.run_dir else [one.run, two.run])
    for line in doc["warnings"]:
        click.echo(f"warning: {line}", err=True)
    for line in doc["notes"]:
        click.echo(f"note: {line}", err=True)


@main.command()
@click.argument("run", shell_complete=run_refs)
@click.argument("jobs", nargs=-1)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=SET_HELP + " Recorded as a change.")
@click.option("--allow-drift", is_flag=True, help="Run it even where the record cannot be repeated as it was.")
@click.option("--dry-run", is_flag=True, help="Write the new run and show what would run; submit nothing.")
@click.option("--show", is_flag=True, help="With --dry-run: print every script too.")
@click.pass_context
def rerun(
    ctx: click.Context,
    run: str,
    jobs: tuple[str, ...],
    sets: tuple[str, ...],
    allow_drift: bool,
    dry_run: bool,
    show: bool,
) -> None:
    """Run the jobs of RUN again (all of them, or the JOBS named) as a new run made from RUN's record:
    each job's recorded spec and script, the run's code/training snapshot, the same seed.

    What cannot be repeated as recorded (no code snapshot, a package of another version, a script this
    jobgen renders differently) is listed and refused; --allow-drift runs it anyway and records it.
    """
    from jobgen.commands import submit as sub
    from jobgen.commands.rerun import rerun as rerun_jobs
    from jobgen.errors import DriftError

    try:
        done = rerun_jobs(_one_run(ctx, run), list(jobs), list(sets), allow_drift=allow_drift, dry_run=dry_run)
    except DriftError as exc:
        for line in exc.drift:
            click.echo(f"drift: {line}", err=True)
        raise
    for line in done.drift:
        click.echo(f"drift (allowed): {line}", err=True)
    for line in done.notes:
        click.echo(f"note: {line}", err=True)
    click.echo(f"rerun of {done.of}: {len(done.jobs)} job(s) from its record")
    if dry_run:
        from jobgen.commands import waves

        click.echo("\n".join(sub.show(done.run_dir, done.manifest, show)))
        click.echo(f"dry run: {len(done.jobs)} job(s) written, nothing submitted")
        for line in waves.preview(done.manifest):
            click.echo(line)
        return
    click.echo(f"run: {done.run_dir}")
    _submit_and_report(done.run_dir)


def _side(ctx: click.Context, ref: str, job: str | None) -> Any:
    """A diff's side: RUN, or RUN:JOB (a job of it), or RUN with --job NAME."""
    from jobgen.record.model import Run
    from jobgen.results.diff import Side

    if ":" in ref and not Path(ref).exists():
        if job:
            raise click.UsageError(f"{ref}: name the job as RUN:JOB or with --job, not both", ctx)
        ref, _, job = ref.rpartition(":")
    if not ref or job == "":
        raise click.UsageError("RUN:JOB needs both a run and a job name", ctx)
    run = Run.load(_one_run(ctx, ref))
    return Side(run, run.pick([job])[0] if job else None)


@main.command()
@runs_argument
@click.option(
    "-o",
    "--output",
    "output",
    default="report.html",
    show_default=True,
    type=_OutFile(),
    help="The HTML file to write.",
)
@click.option("--baseline", help="Configuration (job name) speed-ups are measured against.")
@click.option(
    "--refresh",
    is_flag=True,
    help="Ask Slurm about every job and its usage, also what the manifest kept of jobs that ended.",
)
@click.pass_context
def report(
    ctx: click.Context, runs: tuple[str, ...], output: str, baseline: str | None, refresh: bool, all_runs: bool
) -> None:
    """Write one self-contained HTML page for RUNS (default: the latest run): the summary table, loss and
    accuracy curves, time vs accuracy, failure causes and links to each job's logs."""
    from jobgen.results.report import report_page

    path = report_page(_many_runs(ctx, runs, all_runs), Path(output), refresh=refresh, baseline=baseline)
    click.echo(f"report: {path}")


@main.command()
@runs_argument
@click.pass_context
def sync(ctx: click.Context, runs: tuple[str, ...], all_runs: bool) -> None:
    """Upload the W&B runs that the jobs of RUNS logged offline (default: the latest run).

    Run it on a machine with internet (the login node). The API key comes from your environment
    (WANDB_API_KEY) or `wandb login`; jobgen never stores it.
    """
    from jobgen.commands.sync import sync as sync_runs
    from jobgen.record.model import Run

    folders = sync_runs([Run.load(run_dir) for run_dir in _many_runs(ctx, runs, all_runs)])
    click.echo(f"synced {len(folders)} W&B run(s)")


@main.command()
@runs_argument
@click.option("--yes", is_flag=True, help="Delete; without it, only list what would go.")
@click.pass_context
def clean(ctx: click.Context, runs: tuple[str, ...], all_runs: bool, yes: bool) -> None:
    """Delete the checkpoints of completed jobs of RUNS (default: the latest run).

    Jobs that did not complete keep theirs (`jobgen requeue` resumes from them); results, metrics and
    logs always stay. Lists what would go unless --yes.
    """
    from jobgen.commands.clean import human, reclaimable, remove
    from jobgen.results.state_rule import read_runs

    loaded = read_runs(_many_runs(ctx, runs, all_runs))
    items = [item for run in loaded for item in reclaimable(run)]
    _warn(loaded)
    for item in items:
        click.echo(f"  {human(item.size):>9}  {item.path}")
    total = sum(item.size for item in items)
    if not items:
        click.echo("nothing to clean: no completed job has checkpoints left")
    elif yes:
        click.echo(f"freed {human(remove(items))} from {len(items)} job(s)")
    else:
        click.echo(f"would free {human(total)} from {len(items)} job(s); run again with --yes to delete")


@main.command()
@click.argument("experiment", type=click.Path(dir_okay=False), shell_complete=experiment_files)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@site_option
@click.pass_context
def prefetch(ctx: click.Context, experiment: str, sets: tuple[str, ...], site: str | None) -> None:
    """Download and cache what EXPERIMENT's jobs need (dataset, model, tokenized data), here.

    Run it on the login node before submitting to compute nodes without internet (env.hf_offline).
    Needs the training stack: pip install 'jobgen[train]'.
    """
    from jobgen.commands.prefetch import prefetch as fetch

    prepared, jobs, cache = fetch(experiment, _root(ctx), list(sets), site)
    click.echo(
        f"prefetched {prepared} model/data combination(s) for {jobs} job(s): the Hugging Face cache "
        f"and {cache} hold what they need; submit them now"
    )


@main.command()
@click.argument(
    "experiments", nargs=-1, required=True, type=click.Path(dir_okay=False), shell_complete=experiment_files
)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@site_option
def validate(experiments: tuple[str, ...], sets: tuple[str, ...], site: str | None) -> None:
    """Check experiment files: keys, values, sweep points, job shapes and templates."""
    from jobgen.commands.validate import validate_file
    from jobgen.experiment.sites import describe as describe_site

    for path in experiments:
        count, given, line = validate_file(path, list(sets), site)
        click.echo(f"ok: {path} ({count} job{'s' if count != 1 else ''})")
        if given:
            click.echo(describe_site(given.record()))
        if line:
            click.echo(line)


@main.command()
@click.option("--format", "fmt", type=click.Choice(["table", "markdown"]), default="table", show_default=True)
def schema(fmt: str) -> None:
    """Print every experiment key with its type, default and meaning."""
    from jobgen.experiment.schema import schema_rows

    rows = schema_rows()
    if fmt == "markdown":
        click.echo("| key | type | default | valid | meaning |\n|---|---|---|---|---|")
        for key, tp, default, valid, doc in rows:
            click.echo(f"| `{key}` | `{tp}` | `{default}` | {valid} | {doc} |")
        return
    width = max(len(r[0]) for r in rows)
    for key, tp, default, valid, doc in rows:
        click.echo(f"{key:<{width}}  {tp}  = {default}{f'  ({valid})' if valid else ''}\n{'':<{width}}  {doc}")


def entry() -> None:
    """The `jobgen` command."""
    main()


if __name__ == "__main__":  # pragma: no cover
    entry()
