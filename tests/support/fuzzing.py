"""Hostile experiment files, built from the schema, and the rule every one of them must keep.

Used by tests/core/test_fuzz.py (a few hundred cases in CI) and bench/fuzz.py (10,000 and more).
A case is an experiment file whose keys get hostile values (unicode, control characters, quotes,
`$()`, backticks, globs, very long strings, huge and negative numbers, wrong types, deep tables) and
whose file name may be hostile too. Submitted as a dry run it must either

- end in a one-line error (exit 1, no traceback, nothing written), or
- write scripts that pass `bash -n` and shellcheck, keep every `#SBATCH` line before the first
  command, and, run with stub srun/python/scontrol/module/conda, run no command jobgen did not mean:
  no marker file appears, and python (when reached) gets exactly `-u -m training --spec SPEC`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import typing
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from jobgen.experiment import schema

MARKER = "PWNED"
# Attacks: each would create a marker file if it ever ran.
ATTACKS = [
    f"$(touch {MARKER}1)",
    f"`touch {MARKER}2`",
    f";touch {MARKER}3",
    f"\ntouch {MARKER}4 #",
    f"'; touch {MARKER}5; '",
    f'"; touch {MARKER}6; "',
    f"\r\ntouch {MARKER}7",
    f"$(touch {MARKER}8)\n",
    f"a\x00$(touch {MARKER}9)",
    f'"\n#SBATCH --x\ntouch {MARKER}10\n"',
    f"\u2028touch {MARKER}11",
    f"x\\\ntouch {MARKER}12",
]
# Odd values: expansions, globs, separators, invisible and line-breaking characters, size.
ODD = [
    "${HOME}",
    "$HOME",
    "*",
    "?",
    "[a-z]*",
    "~",
    "~/x",
    "-rf",
    "--",
    "\\",
    "\\\n",
    "!!",
    "%j %%",
    "\u202e",
    "\u200b",
    "\u2028",
    "\x85",
    "é",
    "😀",
    "\x00",
    "\r",
    "\x1b[31m",
    "\t",
    "\x7f",
    "a" * 5000,
    "",
    " ",
    "#",
    "#SBATCH --x",
    "..",
    "../..",
    "/",
    "=",
    ",",
    ";",
    "&&",
    "|",
    ">",
    "<",
    "'",
    '"',
    "{{ x }}",
]
PAYLOADS = ATTACKS + ODD
STUBS = {
    # srun: drop its own options, run the command.
    "srun": '#!/bin/bash\nwhile [[ "$1" == -* ]]; do shift; done\nexec "$@"\n',
    "python": '#!/bin/bash\nprintf \'%s\\n\' "$@" > "$STUB_LOG/python.$$"\n',
    "scontrol": "#!/bin/bash\necho localhost\n",
    "module": "#!/bin/bash\nexit 0\n",
    "conda": "#!/bin/bash\nexit 0\n",
}
# Three of shellcheck's notes guess at intent from what a quoted value holds, and a hostile value is
# quoted on purpose: SC2016 ("expressions don't expand in single quotes": `$(...)` must not), SC1003
# ("want to escape a single quote?": a value that ends in a backslash) and SC2088 ("tilde does not expand
# in quotes": a variable's value is literal; paths (venv, python) keep ~/ as $HOME through shpath).
SHELLCHECK = ["shellcheck", "--severity=style", "--exclude=SC2016,SC1003,SC2088", "--shell=bash"]
SKIPPED_KEYS = {"env.setup"}  # shell lines the user writes on purpose, run as written (trusted)

# --- strategies -------------------------------------------------------------------------------------

hostile_text = st.one_of(
    st.sampled_from(PAYLOADS),
    st.text(max_size=30),
    st.lists(st.one_of(st.sampled_from(PAYLOADS), st.text(max_size=6)), min_size=2, max_size=4).map("".join),
)
plain_text = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,12}", fullmatch=True)
text_values = st.sampled_from([st.sampled_from(ATTACKS), st.sampled_from(ODD), hostile_text, plain_text]).flatmap(
    lambda chosen: chosen
)
numbers = st.one_of(
    st.integers(-3, 8),
    st.integers(-(2**80), 2**80),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
)
scalars = st.one_of(text_values, numbers, st.booleans())
any_value = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_text, inner, max_size=3), max_leaves=8
)


@st.composite
def deep_table(draw: st.DrawFn) -> Any:
    value: Any = draw(scalars)
    for _ in range(draw(st.integers(2, 60))):
        value = {draw(st.sampled_from(["a", "name", "x y", "\n"])): value}
    return value


def _dotted_keys() -> list[str]:
    return [f"{s}.{f.name}" for s in schema.SWEEPABLE for f in dataclasses.fields(schema.SECTIONS[s])]


def value_for(tp: Any, key: str) -> st.SearchStrategy[Any]:
    """Mostly values of the right type (hostile where the type allows), sometimes any other TOML value."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    wrong = st.one_of(any_value, deep_table())
    if key == "slurm.extra":
        flag = st.sampled_from(["comment", "mail-type", "mail-user", "reservation", "hint", "wckey"])
        flags = st.sampled_from([flag, flag, flag, hostile_text]).flatmap(lambda chosen: chosen)
        values = st.sampled_from([text_values, text_values, st.booleans(), numbers]).flatmap(lambda chosen: chosen)
        good = st.dictionaries(flags, values, min_size=1, max_size=3)
    elif key == "sweep.grid":
        good = st.dictionaries(
            st.one_of(st.sampled_from(_dotted_keys()), hostile_text),
            st.lists(scalars, min_size=1, max_size=3),
            max_size=2,
        )
    elif key == "sweep.points":
        point = st.dictionaries(
            st.one_of(st.sampled_from(["name", *_dotted_keys()]), hostile_text), scalars, max_size=3
        )
        good = st.lists(point, max_size=3)
    elif tp is str:
        good = text_values
    elif tp is bool:
        good = st.booleans()
    elif tp in (int, float) or origin in (typing.Union, __import__("types").UnionType):
        good = numbers
    elif origin is list:
        good = st.lists(text_values if args[0] is str else numbers, max_size=4)
    elif origin is dict:
        name = st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True)
        names = st.sampled_from([name, name, name, hostile_text]).flatmap(lambda chosen: chosen)
        good = st.dictionaries(names, text_values, min_size=1, max_size=3)
    else:
        good = any_value
    return st.sampled_from([good, good, good, good, wrong]).flatmap(lambda chosen: chosen)


def _meta(section: str, name: str) -> Any:
    return schema.field_map(schema.SECTIONS[section])[name].metadata


FIELDS = [
    (s, f.name, typing.get_type_hints(cls)[f.name])
    for s, cls in schema.SECTIONS.items()
    for f in dataclasses.fields(cls)
    if f"{s}.{f.name}" not in SKIPPED_KEYS
]
# Keys whose values jobgen takes as free text (quoted on their way into a script, or only copied into
# spec.json): hostile values there are accepted, and their scripts get run.
FREE_TEXT = [
    (s, n, tp)
    for s, n, tp in FIELDS
    if tp is str
    and not _meta(s, n)["kind"]
    and not _meta(s, n)["choices"]
    and f"{s}.{n}" not in ("launch.template", "experiment.output_root")
] + [(s, n, tp) for s, n, tp in FIELDS if f"{s}.{n}" in ("env.vars", "slurm.extra")]
SCRIPT_KEYS = [
    (s, n, tp)
    for s, n, tp in FIELDS
    if f"{s}.{n}"
    in (
        "env.vars",
        "slurm.extra",
        "env.venv",
        "env.python",
        "env.modules",
        "env.conda",
        "experiment.name",
        "slurm.partition",
        "slurm.account",
        "slurm.qos",
        "slurm.gpu_type",
        "slurm.mem",
        "slurm.time",
        "slurm.constraint",
        "slurm.signal",
        "slurm.requeue",
        "launch.array",
    )
]
stems = st.one_of(
    st.just("exp"),
    st.just("exp"),
    st.just("exp"),
    st.sampled_from(["..", ".", "-x", "a b", "x\ntouch PWNED11 #", "é", "a" * 200]),
    st.text(st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)), min_size=1, max_size=40),
)


@st.composite
def experiments(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """(TOML tree, file stem): a valid base with one to three keys made hostile, now and then more."""
    doc: dict[str, Any] = {"data": {"dataset": "imdb"}, "launch": {"backend": draw(st.sampled_from(schema.BACKENDS))}}
    # A third of the cases aim at the keys that reach a script, a third at free text (mostly accepted:
    # their scripts are run), a third at any key.
    keys = st.sampled_from(draw(st.sampled_from([SCRIPT_KEYS, FREE_TEXT, FIELDS])))
    for section, name, tp in draw(st.lists(keys, min_size=1, max_size=3, unique=True)):
        doc.setdefault(section, {})[name] = draw(value_for(tp, f"{section}.{name}"))
    if draw(st.integers(0, 9)) == 7:  # unknown keys and sections, wrong shapes of whole sections
        section = draw(st.sampled_from(["train", "nonsense", "slurm", "x y", "\n"]))
        doc[section] = draw(st.one_of(any_value, deep_table()))
    stem = draw(stems)
    return doc, stem


# --- TOML ---------------------------------------------------------------------------------------


def toml_string(text: str) -> str:
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif unicodedata.category(c) in ("Cc", "Zl", "Zp"):
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def to_toml(doc: dict[str, Any]) -> str:
    return "".join(f"{toml_string(k)} = {toml_value(v)}\n" for k, v in doc.items())


# --- one case -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Counts:
    counts: Counter = dataclasses.field(default_factory=Counter)
    scripts: list[Path] = dataclasses.field(default_factory=list)


def stub_dir(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in STUBS.items():
        path = folder / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return folder


def run_case(doc: dict[str, Any], stem: str, base: Path, stubs: Path, tally: Counts) -> None:
    """Submit one case as a dry run and check the rule; raises AssertionError when it is broken."""
    from click.testing import CliRunner

    from jobgen.cli import main

    case = Path(tempfile.mkdtemp(dir=base))
    folder, out = case / "exp", case / "out"
    folder.mkdir()
    try:
        exp = folder / f"{stem}.toml"
        exp.write_text(to_toml(doc), encoding="utf-8")
    except (OSError, UnicodeEncodeError):
        tally.counts["file name the file system refuses"] += 1
        return
    result = CliRunner().invoke(main, ["--output-root", str(out), "submit", str(exp), "--dry-run"])
    tally.counts["cases"] += 1
    if result.exit_code != 0:
        _check_refused(result, out)
        tally.counts["refused"] += 1
        shutil.rmtree(case)
        return
    tally.counts["accepted"] += 1
    tally.counts["accepted with a payload"] += f"touch {MARKER}" in to_toml(doc)
    (experiment_dir,) = out.iterdir()
    (run_dir,) = experiment_dir.iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    for entry in manifest.get("arrays") or []:
        _check_sbatch_block(run_dir / entry["script"])
        tally.scripts.append(run_dir / entry["script"])
    for job in manifest["jobs"]:
        script = run_dir / job["script"]
        if script.suffix == ".sbatch":
            _check_sbatch_block(script)
        tally.scripts.append(script)
        tally.counts["scripts executed"] += 1
        tally.counts["python reached"] += _execute(script, run_dir / job["spec"], case, stubs)
    markers = [p for p in case.rglob(f"{MARKER}*") if p.suffix != ".toml"]
    tally.counts["markers found"] += len(markers)
    assert not markers, f"a value escaped its quoting: {markers}"


def _check_refused(result: Any, out: Path) -> None:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output and "rerun with --debug" not in lines[0], lines[0]
    assert not out.exists() or not any(out.rglob("*")), f"a refused case wrote {list(out.rglob('*'))}"


def _check_sbatch_block(script: Path) -> None:
    """sbatch reads #SBATCH lines only until the first command: all of them must come before it."""
    lines = script.read_text(encoding="utf-8").splitlines()
    first = next(i for i, line in enumerate(lines) if i and line.strip() and not line.lstrip().startswith("#"))
    late = [line for line in lines[first:] if line.startswith("#SBATCH")]
    assert not late, f"{script}: #SBATCH after the first command: {late}"
    assert all(not line.strip() or line.startswith("#") for line in lines[:first])


def _execute(script: Path, spec: Path, case: Path, stubs: Path) -> int:
    """Run a script with the stubs; 1 when it got as far as python (whose arguments are checked)."""
    work, home, log = case / "work", case / "home", case / "log"
    for folder in (work, home, log):
        folder.mkdir(exist_ok=True)
    text = script.read_text(encoding="utf-8")
    runnable = script.with_name(script.name + ".stubbed")
    # The local backend runs this very interpreter by its absolute path: point it at the stub.
    runnable.write_text(text.replace(shlex.quote(sys.executable), "python"), encoding="utf-8")
    env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "HOME": str(home),
        "STUB_LOG": str(log),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_CPUS_PER_TASK": "2",
        "SLURM_ARRAY_TASK_ID": "0",
        "SLURM_ARRAY_JOB_ID": "4242",
        "LANG": "C.UTF-8",
    }
    try:
        subprocess.run(["bash", str(runnable)], cwd=work, env=env, capture_output=True, timeout=20)
    finally:
        runnable.unlink()
    calls = sorted(log.glob("python.*"))
    for call in calls:
        args = call.read_text(encoding="utf-8", errors="replace").splitlines()
        assert args == ["-u", "-m", "training", "--spec", str(spec)], f"{script}: python got {args}"
        call.unlink()
    return len(calls)


def lint(scripts: list[Path]) -> list[str]:
    """bash -n and shellcheck over every accepted script (shellcheck in batches: it starts slowly); one
    line per finding."""
    found = []
    for script in scripts:
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        if done.returncode:
            found.append(f"{script}: bash -n: {done.stderr.strip()}")
    for start in range(0, len(scripts), 100):
        batch = [str(s) for s in scripts[start : start + 100]]
        done = subprocess.run([*SHELLCHECK, "--format=gcc", *batch], capture_output=True, text=True)
        found += done.stdout.splitlines()
        if done.returncode and not done.stdout:
            found.append(f"shellcheck failed: {done.stderr.strip()}")
    return found
