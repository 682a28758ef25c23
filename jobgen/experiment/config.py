"""Load an experiment file into the typed tree of jobgen.experiment.schema, validating every key once.

Errors name the file, the dotted key (and its line where it can be found) and what is valid:
    experiments/x.toml:12: train.strategy: 'fdsp' is not one of auto, ddp, fsdp, ... (did you mean 'fsdp'?)
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from jobgen import backends
from jobgen.errors import BadUsage, ConfigError, is_control
from jobgen.experiment import container, random_search, schema
from jobgen.experiment import halving as halving_config
from jobgen.experiment.schema import Experiment as Experiment
from jobgen.facts import MAX_NAME, SECRET_RE, signal_name, time_seconds
from training import contract
from training.contract import show as _show
from training.contract import suggest as _suggest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Every form sbatch's --time takes: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (and UNLIMITED/INFINITE).
# Always used with fullmatch: `$` in re.match also matches before a trailing newline, and a newline
# in a value ends an #SBATCH line (or an `export NAME`) early.
_TIME_RE = re.compile(r"(\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE)", re.IGNORECASE)
_MEM_RE = re.compile(r"\d+[KMGT]?", re.IGNORECASE)
_WORD_RE = re.compile(r"[A-Za-z0-9_.,:+-]*")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_CONSTRAINT_RE = re.compile(r"[A-Za-z0-9_.,:&|*\[\]()-]*")
_FLAG_RE = re.compile(r"[a-z][a-z0-9-]*")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
AUTO = "auto"  # slurm.time / slurm.mem: from the newest probe of the same points, times the margin
# The longest slurm.time accepted: a year. Longer is a typo (99999999-00:00:00), not a job.
MAX_TIME_DAYS = 365
BUILTIN = "builtin:"
BUILTIN_MODELS = contract.BUILTIN_MODELS
_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "ALRM", "CONT", "URG")

# #SBATCH flags that jobgen writes itself: set them through their typed keys instead.
# sbatch's long options (Slurm 22.05-24.11 man pages). A flag outside this list is still passed on
# (newer Slurm may know it) unless it looks like a misspelling of one inside it.
SBATCH_OPTIONS = frozenset(
    """
account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment constraint container
container-id contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot
dependency distribution error exclude exclusive export export-file extra extra-node-info get-user-env gid
gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags hint hold ignore-pbs input
job-name kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus
network nice no-kill no-requeue nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node
ntasks-per-socket open-mode output overcommit oversubscribe partition power prefer priority profile propagate
qos quiet reboot requeue reservation resv-ports segment signal sockets-per-node spread-job switches test-only
thread-spec threads-per-core time time-min tmp tres-bind tres-per-task uid use-min-nodes verbose wait
wait-all-nodes wckey wrap x11
""".split()
)
MANAGED_FLAGS = {
    "nodes": "slurm.nodes",
    "N": "slurm.nodes",
    "ntasks-per-node": "slurm.ntasks_per_node",
    "gpus-per-node": "slurm.gpus_per_node",
    "cpus-per-task": "slurm.cpus_per_task",
    "mem": "slurm.mem",
    "time": "slurm.time",
    "partition": "slurm.partition",
    "account": "slurm.account",
    "qos": "slurm.qos",
    "constraint": "slurm.constraint",
    "exclusive": "slurm.exclusive",
    "requeue": "slurm.requeue",
    "signal": "slurm.signal",
    "output": "(the run directory)",
    "error": "(the run directory)",
    "job-name": "experiment.name",
    "array": "launch.array",
    "wrap": "(nothing: jobgen writes the script)",
}


def load(path: str | Path) -> Experiment:
    """Read, parse and validate an experiment file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such experiment file; pass the path of a .toml file (see experiments/)")
    text, raw = read_toml(path, "it", "")
    return build(raw, path=path.resolve(), text=text, display=str(path))


def read_toml(path: Path, it: str, what: str) -> tuple[str, dict[str, Any]]:
    """(text, parsed) of a TOML file the user wrote (an experiment, the sites file); one-line errors
    that name the file (and the line of a syntax error). `it` and `what` name the file in them."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read {it} ({exc}); save it as UTF-8 text") from None
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = re.search(r"at line (\d+)", str(exc))
        where = f"{path}:{line.group(1)}" if line else str(path)
        raise ConfigError(f"{where}: TOML syntax error{what}: {exc}; fix that line") from None


def build(
    raw: dict[str, Any],
    *,
    path: Path,
    text: str = "",
    display: str | None = None,
    where: str = "",
    overrides: dict[str, Any] | None = None,
) -> Experiment:
    """Validate a parsed tree. `where` prefixes errors (e.g. the sweep point being checked); an error on
    one of its `overrides` cites the line in [sweep] that set it."""
    ctx = _Context(display or str(path), text, where, overrides=overrides)
    unknown = set(raw) - set(schema.SECTIONS)
    for key in sorted(unknown):
        ctx.fail(key, f"unknown section; valid sections: {', '.join(schema.SECTIONS)}{_suggest(key, schema.SECTIONS)}")
    sections = {}
    for name, cls in schema.SECTIONS.items():
        value = raw.get(name, {})
        if not isinstance(value, dict):
            ctx.fail(name, f"must be a table ([{name}]), got {_tname(value)}")
        sections[name] = _build_section(name, cls, value, ctx)
    exp = Experiment(path=path, text=text, raw=raw, display=ctx.display, **sections)
    if not exp.experiment.name:
        _check_stem(path, ctx)
    _check_paths(exp, ctx)
    _check_chain(exp, ctx)
    _check_retries(exp, ctx)
    _check_extra_clashes(exp, ctx)
    _check_random(exp, ctx)
    _check_halving(exp, ctx)
    for key, problem in container.problems(exp):
        ctx.fail(key, problem)
    return exp


def _check_random(exp: Experiment, ctx: _Context) -> None:
    """[sweep.random]: n, seed and each key's distribution; errors name sweep.random."KEY" and its line."""
    table = exp.sweep.random
    elsewhere = _swept_keys({"grid": exp.sweep.grid, "points": exp.sweep.points})
    for key in random_search.dist_keys(table):
        problem: str | None = _check_sweep_key(key)
        if not problem and key in elsewhere:
            where = "sweep.grid" if key in exp.sweep.grid else "sweep.points"
            problem = f"also set by {where}; vary a key in one place"
        if problem:
            ctx.fail(_random_name(key), problem, line=locate_random(ctx.text, key))
    for key, problem in random_search.problems(table):
        ctx.fail(_random_name(key), problem, line=locate_random(ctx.text, key))
    for key in random_search.dist_keys(table):
        problem = _random_value_problem(key, table[key])
        if problem:
            ctx.fail(_random_name(key), problem, line=locate_random(ctx.text, key))


def _check_halving(exp: Experiment, ctx: _Context) -> None:
    """[sweep.halving]: its keys, its rungs against train.epochs, and a sweep to halve."""
    swept = _swept_keys({"grid": exp.sweep.grid, "points": exp.sweep.points, "random": exp.sweep.random})
    has_sweep = bool(exp.sweep.grid or exp.sweep.points or exp.sweep.random)
    problems = halving_config.problems(
        exp.sweep.halving,
        exp.train.epochs,
        has_sweep=has_sweep,
        swept=swept,
        data=exp.data,
    )
    for key, problem in problems[:1]:
        ctx.fail(f"sweep.halving.{key}" if key else "sweep.halving", problem)


def _random_value_problem(key: str, spec: dict[str, Any]) -> str | None:
    """A distribution's bounds (a range's ends suffice for the key's min and max) or choices that the key
    itself refuses, so that the error does not depend on what the seed happens to draw."""
    section, name = key.split(".", 1)
    tp = _hints(schema.SECTIONS[section])[name]
    meta = schema.field_map(schema.SECTIONS[section])[name].metadata
    ((kind, args),) = spec.items()
    if kind in ("uniform", "loguniform") and tp is int:
        return f"{key} takes integers, and {kind} draws floats; use {{ int = [low, high] }} (or choice)"
    for value in args:
        try:
            value = _coerce(value, tp, key, _Silent())
        except _Mismatch as exc:
            return f"{kind} value {_show(value)} for {key}: {exc}"
        problem = contract.value_problem(value, meta, _KIND_CHECKS)
        if problem:
            return f"{kind} value {_show(value)} for {key}: {problem}"
    return None


def _random_name(key: str) -> str:
    return f"sweep.random.{key}" if key in random_search.SETTINGS else f'sweep.random."{key}"'


def _check_extra_clashes(exp: Experiment, ctx: _Context) -> None:
    """A slurm.extra flag must not ask again for a resource a [slurm] key asks for (GPUs twice)."""
    for flag, option in backends.extra_clashes(as_dict(exp.slurm), exp.slurm.extra):
        ctx.fail(
            f"slurm.extra.{flag}",
            f"{_show(exp.slurm.extra[flag])} asks for what {MANAGED_FLAGS[option]} already asks for "
            f"(sbatch --{option}); set it there only and remove {flag!r} from slurm.extra",
        )


def _check_stem(path: Path, ctx: _Context) -> None:
    """Without experiment.name the file's stem names the run folder and the Slurm jobs: check it as a name."""
    problem = _check_name(path.stem) if path.stem else "it is empty"
    if problem:
        raise ConfigError(
            f"{ctx.display}: the file name cannot name the experiment ({problem}); "
            "rename the file or set experiment.name"
        )


def control_char(value: Any) -> str | None:
    """The first control character (newline, carriage return, NUL, tab, ...) in a value, its keys
    and items; None when there is none. No such character belongs in a script line or a path."""
    if isinstance(value, str):
        if value.isprintable():  # no control or separator character (checked in C: this runs per value per job)
            return None
        return next((c for c in value if is_control(c)), None)
    if isinstance(value, dict):
        return next((c for k, v in value.items() if (c := control_char(k) or control_char(v))), None)
    if isinstance(value, list):
        return next((c for v in value if (c := control_char(v))), None)
    return None


def with_overrides(exp: Experiment, overrides: dict[str, Any], where: str) -> Experiment:
    """The experiment with dotted-key overrides applied (one sweep point), validated again."""
    # Shallow copies suffice: validation only reads the tree, and each touched table is copied.
    raw = {k: v for k, v in exp.raw.items() if k != "sweep"}
    for dotted, value in overrides.items():
        section, key = dotted.split(".", 1)
        raw[section] = {**raw.get(section, {}), key: value}
    point = build(raw, path=exp.path, text=exp.text, display=exp.label, where=where, overrides=overrides)
    return dataclasses.replace(point, site=exp.site)


def with_sets(exp: Experiment, sets: list[str]) -> Experiment:
    """The experiment with command-line `--set KEY=VALUE` items applied, validated again.

    VALUE is read as a TOML value (1, 2e-5, true, "text", [1, 2]); anything TOML cannot read, and
    dates or times (`01:00:00` is a Slurm time here), stays text.
    """
    if not sets:
        return exp
    raw = set_items(exp.raw, sets, exp.label)
    return build(raw, path=exp.path, text=exp.text, display=exp.label, where="--set")


def set_items(tree: dict[str, Any], sets: list[str], label: str) -> dict[str, Any]:
    """A copy of a parsed experiment with `--set KEY=VALUE` items applied, not validated; a key the
    sweep varies, or one below a value that is not a table, is a ConfigError naming `label`."""
    raw = _copy_tables(tree)
    swept = _swept_keys(raw.get("sweep"))
    for item in sets:
        key, value = parse_set(item)
        clash = next((s for s in swept if key == s or key.startswith(s + ".") or s.startswith(key + ".")), None)
        if clash:
            raise ConfigError(f"{label}: --set {key}: the sweep sets {clash!r} per job; change it in [sweep]")
        node = raw
        *parents, last = key.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{label}: --set {key}: {part!r} is not a table here")
            node = child
        node[last] = value
    return raw


def parse_set(item: str) -> tuple[str, Any]:
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or "." not in key or not all(key.split(".")):
        raise BadUsage(f"--set {item!r}: write KEY=VALUE with a dotted key, e.g. --set train.epochs=1")
    if key.split(".")[0] == "sweep":
        raise BadUsage(f"--set {key}: sweeps are edited in the experiment file's [sweep] table")
    return key, _set_value(text.strip())


def _set_value(text: str) -> Any:
    import datetime

    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    return text if isinstance(value, (datetime.date, datetime.time)) else value


def _copy_tables(tree: dict[str, Any]) -> dict[str, Any]:
    return {k: _copy_tables(v) if isinstance(v, dict) else v for k, v in tree.items()}


def _swept_keys(sweep: Any) -> set[str]:
    if not isinstance(sweep, dict):
        return set()
    keys = set(sweep.get("grid") or {}) if isinstance(sweep.get("grid"), dict) else set()
    for point in sweep.get("points") or []:
        if isinstance(point, dict):
            keys |= {k for k in point if k != "name"}
    if isinstance(sweep.get("random"), dict):
        keys |= set(random_search.dist_keys(sweep["random"]))
    return keys


def check_tables(tables: dict[str, dict[str, Any]], *, display: str, text: str, prefix: str) -> None:
    """Check tables of experiment keys that are not a whole experiment (a site's defaults) with the
    experiment's own checks; errors name `display:line: PREFIXsection.key`."""
    ctx = _Context(display, text, "", prefix)
    for name, values in tables.items():
        _build_section(name, schema.SECTIONS[name], values, ctx)


class _Context:
    def __init__(self, display: str, text: str, where: str, prefix: str = "", overrides: dict[str, Any] | None = None):
        self.display, self.text, self.where, self.prefix = display, text, where, prefix
        self.overrides = overrides or {}

    def fail(self, dotted: str, problem: str, line: int | None = None) -> typing.NoReturn:
        dotted = self.prefix + dotted
        if not self.where:
            line = line or locate(self.text, dotted)
        elif dotted in self.overrides:
            line = locate_in_sweep(self.text, dotted, self.overrides[dotted])
        else:
            line = None  # a key the point did not set: the error is the point's, not a line's
        dotted = dotted if len(dotted) <= 80 else dotted[:77] + "..."  # a key may be 5,000 characters long
        loc = f"{self.display}:{line}" if line else self.display
        prefix = f"{self.where}: " if self.where else ""
        raise ConfigError(f"{loc}: {prefix}{dotted}: {problem}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build_section(name: str, cls: type, values: dict[str, Any], ctx: _Context) -> Any:
    fields = schema.field_map(cls)
    hints = _hints(cls)
    for key in values:
        if key not in fields:
            valid = ", ".join(fields)
            ctx.fail(f"{name}.{key}", f"unknown key{_suggest(key, fields)}; valid keys in [{name}]: {valid}")
    kwargs = {}
    for key, value in values.items():
        dotted = f"{name}.{key}"
        value = _coerce(value, hints[key], dotted, ctx)
        char = control_char(value)
        if char:
            ctx.fail(
                dotted,
                f"contains the control character {char!r}; write the value on one line, without control characters",
            )
        _check_value(value, fields[key].metadata, dotted, ctx)
        kwargs[key] = value
    return cls(**kwargs)


def _coerce(value: Any, tp: Any, dotted: str, ctx: _Context) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(tp):
            try:
                return _coerce(value, option, dotted, _Silent())
            except _Mismatch:
                continue
        ctx.fail(dotted, f"expected {schema.type_name(tp)}, got {_tname(value)} {_show(value)}")
    if origin is list:
        if not isinstance(value, list):
            ctx.fail(dotted, f"expected a list, got {_tname(value)} {_show(value)}")
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, f"{dotted}[{i}]", ctx) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            ctx.fail(dotted, f"expected a table, got {_tname(value)} {_show(value)}")
        _, item = typing.get_args(tp)
        return {k: _coerce(v, item, f"{dotted}.{k}", ctx) for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > sys.float_info.max:
            ctx.fail(dotted, f"expected a finite number, got {_show(value)}")
        return float(value)
    if tp in (int, float) and isinstance(value, bool) or not isinstance(value, tp):
        ctx.fail(dotted, f"expected {schema.type_name(tp)}, got {_tname(value)} {_show(value)}")
    if tp is float and not math.isfinite(value):
        ctx.fail(dotted, f"expected a finite number, got {value!r}")
    return value


class _Mismatch(Exception):
    pass


class _Silent(_Context):
    def __init__(self) -> None:
        super().__init__("", "", "")

    def fail(self, dotted: str, problem: str, line: int | None = None) -> typing.NoReturn:
        raise _Mismatch(problem)


def _check_value(value: Any, meta: Any, dotted: str, ctx: _Context) -> None:
    problem = contract.value_problem(value, meta, _KIND_CHECKS)
    if problem:
        ctx.fail(dotted, problem)


def _check_time(v: str) -> str | None:
    if v == AUTO:  # chosen at submit from the newest probe (jobgen.commands.probe)
        return None
    if not _TIME_RE.fullmatch(v):
        return f"{v!r} is not a Slurm time; use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
    seconds = time_seconds(v)
    if seconds is not None and seconds > MAX_TIME_DAYS * 86400:
        return f"{v!r} is longer than {MAX_TIME_DAYS} days; ask for at most {MAX_TIME_DAYS}-00:00:00 (or UNLIMITED)"
    return None


def _check_mem(v: str) -> str | None:
    if v and v != AUTO and not _MEM_RE.fullmatch(v):
        return f"{v!r} is not a Slurm memory size; use a number with an optional K, M, G or T suffix, e.g. 64G"
    return None


def _check_word(v: str) -> str | None:
    if not _WORD_RE.fullmatch(v):
        return f"{v!r} has characters Slurm names do not use; use letters, digits and _ . , : + -"
    return None


def _check_words(v: list[str]) -> str | None:
    bad = [w for w in v if not w or any(c.isspace() for c in w) or "'" in w or '"' in w]
    return f"{bad[0]!r} is not a module name; give one name per list item" if bad else None


def _check_name(v: str) -> str | None:
    if v and not _NAME_RE.fullmatch(v):
        return f"{v!r}: use letters, digits, '_', '.' and '-', starting with a letter or digit"
    if len(v) > MAX_NAME:
        return f"{v[:20]!r}... is {len(v)} characters long; use at most {MAX_NAME}"
    return None


def _check_constraint(v: str) -> str | None:
    return None if _CONSTRAINT_RE.fullmatch(v) else f"{v!r} is not a Slurm constraint expression"


def _check_signal(v: str) -> str | None:
    name = signal_name(v)
    if name not in _SIGNALS:
        return f"{v!r} is not a signal Slurm sends; use one of {', '.join(_SIGNALS)}"
    return None


def _check_extra(v: dict[str, Any]) -> str | None:
    for flag in v:
        if flag in MANAGED_FLAGS:
            return f"{flag!r} is set by jobgen; use {MANAGED_FLAGS[flag]} instead"
        if not _FLAG_RE.fullmatch(flag):
            fixed = flag.lstrip("-").replace("_", "-").lower()
            hint = f"write {fixed}" if fixed in SBATCH_OPTIONS else "write mail-type, not --mail-type"
            return f"{flag!r} is not an sbatch long option name ({hint})"
        if flag not in SBATCH_OPTIONS:
            near = difflib.get_close_matches(flag, SBATCH_OPTIONS, n=1, cutoff=0.8)
            if near:
                return f"{flag!r} is not an sbatch option (did you mean '{near[0]}'?)"
    return None


def _check_grid(v: dict[str, list[Any]]) -> str | None:
    for key, values in v.items():
        problem = _check_sweep_key(key)
        if problem:
            return problem
        if not values:
            return f"{key!r} has no values; give at least one or remove it"
    return None


def _check_points(v: list[dict[str, Any]]) -> str | None:
    for i, point in enumerate(v):
        for key, value in point.items():
            if key == "name":
                if not isinstance(value, str) or not value or _check_name(value):
                    return f"[{i}].name {value!r}: use letters, digits, '_', '.' and '-' (at most {MAX_NAME})"
                continue
            problem = _check_sweep_key(key)
            if problem:
                return f"[{i}]: {problem}"
    return None


def _check_sweep_key(key: str) -> str | None:
    section, _, name = key.partition(".")
    if section not in schema.SWEEPABLE or not name:
        every = [f"{s}.{f}" for s in schema.SWEEPABLE for f in schema.field_map(schema.SECTIONS[s])]
        bare = [k for k in every if k.split(".", 1)[1] == key]  # "lr": the key without its section
        hint = f" (did you mean {bare[0]!r}?)" if bare else _suggest(key, every)
        return f"{key!r} is not a sweepable key; use section.key with section in {', '.join(schema.SWEEPABLE)}{hint}"
    fields = schema.field_map(schema.SECTIONS[section])
    if name not in fields:
        return f"{key!r} is not a key{_suggest(name, fields, prefix=section + '.')}"
    return None


_KIND_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "time": _check_time,
    "mem": _check_mem,
    "word": _check_word,
    "words": _check_words,
    "name": _check_name,
    "constraint": _check_constraint,
    "signal": _check_signal,
    "extra": _check_extra,
    "grid": _check_grid,
    "points": _check_points,
}
# Kinds of the [train] and [data] keys are checked by training/contract.py itself.


def _check_chain(exp: Experiment, ctx: _Context) -> None:
    if exp.slurm.chain == 1:
        return
    if not backends.get(exp.launch.backend).can_chain:
        able = " or ".join(repr(n) for n in backends.names() if backends.get(n).can_chain)
        ctx.fail(
            "slurm.chain", f"chains are Slurm dependencies: use launch.backend = {able}, not {exp.launch.backend!r}"
        )
    if exp.launch.array:
        ctx.fail("slurm.chain", "a job array cannot be chained: set launch.array = false (or slurm.chain = 1)")
    if exp.slurm.requeue:
        ctx.fail("slurm.chain", "slurm.requeue and slurm.chain both outlive the time limit: choose one")


def _check_retries(exp: Experiment, ctx: _Context) -> None:
    if exp.slurm.retries and not backends.get(exp.launch.backend).can_retry:
        able = " or ".join(repr(n) for n in backends.names() if backends.get(n).can_retry)
        ctx.fail(
            "slurm.retries",
            f"retries are requeued by jobgen's batch script on a Slurm node: use launch.backend = {able}, "
            f"not {exp.launch.backend!r} (or slurm.retries = 0)",
        )


def _is(test: str, path: Path) -> bool:
    """path.is_file() / path.exists(), False where the system cannot even look (a name too long, ...)."""
    try:
        return bool(getattr(path, test)())
    except (OSError, ValueError):
        return False


def _check_paths(exp: Experiment, ctx: _Context) -> None:
    if exp.launch.template and not _is("is_file", exp.base_dir / exp.launch.template):
        ctx.fail(
            "launch.template", f"{_show(exp.launch.template)} not found next to the experiment file ({exp.base_dir})"
        )
    for role, rel in exp.data.files.items():
        if not _is("exists", exp.base_dir / rel):
            ctx.fail(f"data.files.{role}", f"{_show(rel)} not found (paths are relative to {exp.base_dir})")
    model = exp.train.model
    if model.startswith(BUILTIN) and model not in BUILTIN_MODELS:
        ctx.fail("train.model", f"{_show(model)} is not a built-in model; use {', '.join(BUILTIN_MODELS)}")
    local = model_path(model, exp.base_dir)
    if local is not None and not _is("is_dir", local):
        ctx.fail(
            "train.model",
            f"{_show(model)}: no such model folder (paths are relative to {exp.base_dir}); "
            "give a folder that exists, a hub name such as 'org/name', or builtin:tiny",
        )
    # Data named by the sweep is checked in each job's own tree (`where` names its point).
    swept = _swept_keys({"grid": exp.sweep.grid, "points": exp.sweep.points, "random": exp.sweep.random})
    named = exp.data.dataset or exp.data.files or exp.data.preset or {"data.dataset", "data.preset"} & swept
    if not named:
        ctx.fail("data.dataset", "no data: set data.dataset (e.g. 'imdb'), data.files or data.preset")
    for name in exp.env.vars:
        if not ENV_NAME_RE.fullmatch(name):
            ctx.fail(f"env.vars.{name}", "not a valid environment variable name")
        if SECRET_RE.search(name):
            ctx.fail(
                f"env.vars.{name}",
                "looks like a secret; export it in your shell instead (jobs inherit it) so it never lands in files",
            )


def model_path(model: str, base: Path) -> Path | None:
    """The local folder train.model names, or None for a hub name ('name', 'org/name') or a built-in.

    ./x, ../x, /x and ~/x are paths, and so is anything with more than one '/', which no hub name has;
    'org/name' is a hub name unless that folder exists next to the experiment file."""
    if model.startswith(BUILTIN):
        return None
    path = base / Path(model).expanduser()
    if model.startswith(("/", "./", "../", "~")) or model.count("/") > 1 or model in (".", ".."):
        return path
    return path if "/" in model and _is("is_dir", path) else None


def locate(text: str, dotted: str) -> int | None:
    """Best-effort line number of a dotted key (or table header) in TOML text."""
    parts = dotted.split(".")
    for number, table, keys, _ in _assignments(text):
        if [p for name in table + (keys or []) for p in name.split(".")] == parts:
            return number
    return None


_PART_RE = re.compile(r'"([^"]*)"|([A-Za-z0-9_-]+)')


def _assignments(text: str) -> Iterator[tuple[int, list[str], list[str] | None, str]]:
    """(line number, table, key parts, value text) for each line of TOML text: a table header gives
    key parts None; the key parts of `a."b.c" = 1` are ["a", "b.c"]. Best effort, for error lines."""
    table: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        header = re.match(r"^\[\[?\s*([^\]]+?)\s*\]\]?", stripped)
        if header:
            table = [quoted or bare for quoted, bare in _PART_RE.findall(header.group(1))]
            yield number, table, None, ""
            continue
        assign = re.match(r'^((?:"[^"]*"|[A-Za-z0-9_-]+)(?:\s*\.\s*(?:"[^"]*"|[A-Za-z0-9_-]+))*)\s*=\s*(.*)$', stripped)
        if assign:
            yield number, table, [quoted or bare for quoted, bare in _PART_RE.findall(assign.group(1))], assign.group(2)


def locate_random(text: str, key: str) -> int | None:
    """Line that sets `key` (a dotted key such as train.lr, or n / seed) of [sweep.random]: in that
    table, a [sweep.random."KEY"] header, or `random."KEY" = ...` under [sweep]."""
    target = ["sweep", "random", key]
    for number, table, parts, _ in _assignments(text):
        if parts is None:
            if table == target:
                return number
        elif table + parts == target or table + [".".join(parts)] == target:
            return number
    return None


def locate_in_sweep(text: str, dotted: str, value: Any) -> int | None:
    """Line of the [sweep] entry that gave a point `dotted = value`: the [[sweep.points]] line with that
    value, or the [sweep.grid] line whose list holds it; else the first line that sets the key there."""
    first = None
    for number, table, parts, rhs in _assignments(text):
        if table[:1] != ["sweep"] or parts is None:
            continue
        where = table
        if table == ["sweep"] and len(parts) > 1 and parts[0] in ("grid", "points"):  # [sweep] grid."x" = [..]
            where, parts = ["sweep", parts[0]], parts[1:]
        if ".".join(parts) != dotted:
            continue
        first = first or number
        try:
            given = tomllib.loads(f"v = {rhs}")["v"]
        except tomllib.TOMLDecodeError:  # a value over several lines: not compared
            continue
        if (where == ["sweep", "points"] and given == value) or (
            where == ["sweep", "grid"] and isinstance(given, list) and value in given
        ):
            return number
    return first


def _tname(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "list", dict: "table"}.get(
        type(value), type(value).__name__
    )


def as_dict(section: Any) -> dict[str, Any]:
    """A section's values by key (shallow: the values are plain TOML data)."""
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}
