"""Job -> script text. Pure: no files written, no subprocess; the same inputs give the same bytes.

One Jinja environment: StrictUndefined (a missing value is an error, not an empty string),
no autoescape (this is shell, not HTML), and filters that quote: every user value passes through
`shquote` (shell) or `sbatch_value` (#SBATCH lines, which sbatch parses with its own rules).
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from jobgen import __version__, backends
from jobgen.backends._slurm import extra_options, resource_options
from jobgen.errors import TemplateError, one_line
from jobgen.experiment.config import ENV_NAME_RE, as_dict, control_char
from jobgen.facts import signal_name, submit_tag
from jobgen.plan import container
from jobgen.plan.container import DEFAULT_HF_HOME
from jobgen.plan.plan import Job, cache_dir_for
from training import contract

_SBATCH_PLAIN = re.compile(r"[A-Za-z0-9_./:@%,=+-]+")
_FLAG = re.compile(r"[A-Za-z][A-Za-z0-9-]*")


@dataclass(frozen=True)
class RunInfo:
    """What a script says about the run it belongs to."""

    run_id: str
    run_dir: Path
    git_sha: str | None = None
    git_dirty: bool = False
    version: str = __version__
    default_python: str = "python"
    hf_home: str = DEFAULT_HF_HOME  # the Hugging Face cache a container mounts ($HF_HOME at submit time)
    # The interpreter jobgen runs in: a job that ends runs `python -m jobgen top-up` with it (waves).
    jobgen_python: str = "python3"
    # The jobs stop at halving rungs ([sweep.halving], not a probe): a chain's segments then hold and release.
    halving: bool = False

    @property
    def code_dir(self) -> Path:
        return self.run_dir / "code"

    def job_dir(self, job: Job) -> Path:
        return self.run_dir / "jobs" / job.name


def template_dir() -> Path:
    """The shipped templates: the folder beside this package's modules (jobgen/templates)."""
    return Path(__file__).resolve().parent.parent / "templates"


@functools.cache
def environment(user_dir: Path | None = None) -> jinja2.Environment:
    """The one Jinja environment; a user's template directory is searched before the shipped one."""
    dirs = ([str(user_dir)] if user_dir else []) + [str(template_dir())]
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(dirs),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["shquote"] = shquote
    env.filters["sbatch_value"] = sbatch_value
    env.filters["shpath"] = shpath
    env.filters["oneline"] = oneline
    env.filters["envname"] = envname
    env.filters["sbatch_flag"] = sbatch_flag
    return env


# The filters are the last line of defence: validation refuses these values first, and a value that
# slips past it stops the render with an error instead of becoming a script.
def _refuse_control(value: Any, where: str) -> str:
    text = str(value)
    if control_char(text):
        raise TemplateError(
            f"refusing to write {text!r} {where}: it holds a control character; write the value on one line"
        )
    return text


def shquote(value: Any) -> str:
    return _quote(_refuse_control(value, "into the script"))


def _quote(text: str) -> str:
    quoted = shlex.quote(text)
    # shlex leaves `=` bare; `export A==x` and `source =/bin/activate` are valid but read as typos (and lint so).
    return f"'{text}'" if quoted == text and "=" in text else quoted


def shpath(value: Any) -> str:
    """Quote a path for the shell, keeping a leading ~/ as the node's $HOME (quotes stop ~ expanding)."""
    text = _refuse_control(value, "into the script")
    if text == "~" or text.startswith("~/"):
        rest = text[2:]
        return '"${HOME}"' + ("/" + _quote(rest) if rest else "")
    return _quote(text)


def sbatch_value(value: Any) -> str:
    """'=value' for an #SBATCH line ('' for a bare flag); sbatch reads double quotes and backslashes."""
    if value is None:
        return ""
    # sbatch reads one line per directive: a line break would end it and start a command.
    text = _refuse_control(value, "on an #SBATCH line")
    if _SBATCH_PLAIN.fullmatch(text):
        return f"={text}"
    return '="' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sbatch_flag(value: Any) -> str:
    """An #SBATCH long option name, as validation allows it (mail-type, ...)."""
    text = str(value)
    if not _FLAG.fullmatch(text):
        raise TemplateError(
            f"refusing to write {text!r} as an #SBATCH option name; use a long option such as mail-type"
        )
    return text


def envname(value: Any) -> str:
    """A variable name for `export NAME=...`."""
    text = str(value)
    if not ENV_NAME_RE.fullmatch(text):
        raise TemplateError(f"refusing to export {text!r}: not a shell variable name")
    return text


def oneline(value: Any) -> str:
    """For comments: a value must not end the comment line (control characters become escapes)."""
    return one_line(str(value))


def template_name(job: Job) -> tuple[str, Path | None]:
    """(template name, user directory or None)."""
    custom = job.exp.launch.template
    if custom:
        path = (job.exp.base_dir / custom).resolve()
        return path.name, path.parent
    return backends.get(job.exp.launch.backend).template, None


def render_job(job: Job, run: RunInfo, template: str | None = None) -> str:
    """The script for one job. `template` overrides the experiment's choice (golden tests)."""
    name, user_dir = (template, None) if template else template_name(job)
    try:
        tpl = environment(user_dir).get_template(name)
        return tpl.render(**job_context(job, run))
    except jinja2.TemplateNotFound as exc:
        raise TemplateError(f"template {exc.name!r} not found (looked in {user_dir or template_dir()})") from None
    except jinja2.UndefinedError as exc:
        raise TemplateError(f"template {name}: {exc.message}; use only the variables jobgen passes") from None
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"template {exc.filename or name}:{exc.lineno}: {exc.message}") from None


def container_words(job: Job, run: RunInfo) -> dict[str, list[str]] | None:
    """The container partial's srun flags and command words as argument lists, for a backend that
    builds the task's command itself (submitit): rendered by the same macros, with ~ expanded here."""
    if not job.exp.container.runtime:  # no [container]: nothing to build (and no context to make per job)
        return None
    context = job_context(job, run)
    if context["container"] is None:
        return None
    hf_home = str(Path(run.hf_home).expanduser())
    ctx = context["container"]
    mounts = [(str(Path(s).expanduser()), str(Path(d).expanduser())) for s, d in ctx["mounts"]]
    context["container"] = {**ctx, "mounts": mounts, "created": [str(Path(p).expanduser()) for p in ctx["created"]]}
    context["hf_home"] = hf_home
    _, user_dir = template_name(job)
    runtime = environment(user_dir).get_template(ctx["partial"]).make_module(vars=context)
    return {name: shlex.split(str(getattr(runtime, name)())) for name in ("srun_flags", "command")}


def job_context(job: Job, run: RunInfo) -> dict[str, Any]:
    exp, job_dir = job.exp, run.job_dir(job)
    # In a container the image's python runs the tasks, not this machine's interpreter.
    python = exp.env.python or ("python" if exp.container.runtime else run.default_python)
    signal = signal_name(exp.slurm.signal)
    # Under torchrun/accelerate the warning signal needs passing on to the ranks (training/relay.py).
    relay = f"{shpath(python)} -u -m training.relay --signal={signal} -- " if exp.slurm.requeue else ""
    return {
        "version": run.version,
        "experiment_file": str(exp.path),
        "experiment": exp.name,
        "job_name": job.name,
        "job_index": job.index,
        "run_id": run.run_id,
        "run_dir": str(run.run_dir),
        "job_dir": str(job_dir),
        "code_dir": str(run.code_dir),
        "spec_path": str(job_dir / "spec.json"),
        "git_sha": run.git_sha,
        "git_dirty": run.git_dirty,
        "sbatch": sbatch_options(job, job_dir, submit_tag(run.run_id, job.name)),
        "modules": exp.env.modules,
        "conda": exp.env.conda,
        "venv": exp.env.venv,
        "python": python,
        "env_vars": sorted(exp.env.vars.items()),
        "setup": exp.env.setup,
        "hf_offline": exp.env.hf_offline,
        "nodes": job.nodes,
        "ntasks_per_node": job.ntasks_per_node,
        "devices": job.devices,
        "requeue": exp.slurm.requeue,
        "signal": signal,
        "relay": relay,
        "launcher": exp.launch.launcher,
        "mixed_precision": contract.accelerate_mixed_precision(exp.train.precision, exp.train.accelerator),
        "chain": exp.slurm.chain,
        "halving": run.halving,
        "container": container.context(
            job, run.run_dir, job_dir, cache_dir_for(job, run.run_dir.parent.parent), run.hf_home
        ),
        "hf_home": run.hf_home,
        "retries": exp.slurm.retries,
        "jobgen_python": run.jobgen_python,
        "strict": True,
    }


def with_tag(tag: str, comment: Any) -> str:
    """The job's comment: jobgen's tag first, then the user's own slurm.extra comment."""
    return tag if comment in (None, True, False, "") else f"{tag} {comment}"


def sbatch_options(job: Job, job_dir: Path, tag: str | None = None) -> list[tuple[str, str | None]]:
    """Every #SBATCH flag of a job, in a stable order. None marks a bare flag."""
    s = job.exp.slurm
    log = str(job_dir).replace("%", "%%")
    job_name = job.exp.name if job.name == job.exp.name else f"{job.exp.name}.{job.name}"
    opts = [("job-name", job_name), *resource_options(as_dict(s))]
    # A requeued job keeps its id, hence its log files (whoever requeues it: its own warning signal,
    # `jobgen requeue`, or Slurm after a node failure); appending keeps the earlier attempt's lines.
    opts += [("output", f"{log}/slurm-%j.out"), ("error", f"{log}/slurm-%j.err"), ("open-mode", "append")]
    if s.requeue or s.retries:
        # A job that is not requeueable (JobRequeue=0 in slurm.conf, the site's default) cannot be
        # requeued by its batch shell; with it, Slurm also requeues the job itself after a node failure.
        opts.append(("requeue", None))
    if s.requeue:
        opts.append(("signal", f"{signal_name(s.signal)}@{s.signal_seconds}"))
    extra = dict(s.extra)
    if tag:
        # At-most-once submission: `submit --resume` and `requeue` look for this tag (squeue, sacct)
        # before they submit a job whose sbatch reply was lost.
        opts.append(("comment", with_tag(tag, extra.pop("comment", None))))
    return opts + extra_options(extra)
