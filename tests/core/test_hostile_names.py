"""Names and paths a new user can type: the file's stem, a trailing newline, `..`. Each is refused in
one line before anything is written, and the render filters refuse what validation would have missed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from jobgen.cli import main
from jobgen.errors import JobgenError, TemplateError
from jobgen.experiment import config
from jobgen.plan.plan import plan
from jobgen.plan.render import RunInfo, render_job, sbatch_value, shpath, shquote
from jobgen.record import store as record

DATA = '[data]\ndataset = "imdb"\n'


def _submit(runner, tmp_path: Path, exp: Path, *extra: str):
    return runner.invoke(main, ["--output-root", str(tmp_path / "out"), "submit", str(exp), "--dry-run", *extra])


def _one_line_error(result, *words: str) -> str:
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in result.output, result.output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("backend", ["sbatch", "local", "submitit"])
def test_file_stem_with_a_newline_is_refused(runner, tmp_path: Path, backend: str):
    exp = tmp_path / "x\ntouch PWNED #.toml"
    exp.write_text(DATA)
    line = _one_line_error(_submit(runner, tmp_path, exp, "--backend", backend), "file name", "experiment.name")
    assert "x\\ntouch PWNED #" in line  # the name, shown escaped
    assert not (tmp_path / "out").exists() and not list(tmp_path.rglob("PWNED"))


def test_file_stem_is_fine_when_the_file_names_the_experiment(runner, tmp_path: Path):
    exp = tmp_path / "x\ntouch PWNED #.toml"
    exp.write_text('[experiment]\nname = "ok"\n' + DATA)
    assert _submit(runner, tmp_path, exp).exit_code == 0


@pytest.mark.parametrize("value", ["inj\\n", "inj\\r", "in\\u0000j", "inj\\t", "\\ninj"])
def test_experiment_name_with_a_control_character_is_refused(runner, tmp_path: Path, value: str):
    exp = tmp_path / "e.toml"
    exp.write_text(f'[experiment]\nname = "{value}"\n' + DATA)
    _one_line_error(_submit(runner, tmp_path, exp), "e.toml:2", "experiment.name", "control character")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("slurm.partition", "debug\\n"),
        ("slurm.time", "01:00:00\\n"),
        ("slurm.mem", "4G\\n"),
        ("env.vars", '{ A = "x\\n" }'),
        ("env.vars", '{ "A\\n" = "x" }'),
        ("slurm.extra", '{ "mail-type\\n" = "END" }'),
        ("train.model", "m\\u0000"),
        ("env.python", "py\\rthon"),
        ("env.modules", '["cuda\\n"]'),
        ("experiment.description", "two\\nlines"),
        ("data.text_field", "t\\u001b[31m"),
    ],
)
def test_control_characters_are_refused_in_every_value(runner, tmp_path: Path, key: str, value: str):
    section, name = key.split(".")
    literal = value if value.startswith(("{", "[")) else f'"{value}"'
    exp = tmp_path / "e.toml"
    exp.write_text(f"[{section}]\n{name} = {literal}\n" + ("" if section == "data" else DATA))
    _one_line_error(_submit(runner, tmp_path, exp), key)
    assert not (tmp_path / "out").exists()


def test_a_stem_of_dot_dot_is_refused(runner, tmp_path: Path):
    (tmp_path / "inner").mkdir()
    exp = tmp_path / "inner" / "...toml"
    exp.write_text(DATA)
    root = tmp_path / "inner" / "out"
    result = runner.invoke(main, ["--output-root", str(root), "submit", str(exp), "--dry-run"])
    _one_line_error(result, "'..'", "rename the file or set experiment.name")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["...toml", "inner"]


@pytest.mark.parametrize("name", ["..", ".", "a/b", ""])
def test_a_run_never_lands_outside_the_output_root(tmp_path: Path, name: str):
    with pytest.raises(JobgenError, match="outside"):
        record.inside(tmp_path / "out", name, "20260101-000000-abcd")
    assert not (tmp_path / "out").exists()


def test_long_names_are_refused(runner, tmp_path: Path):
    exp = tmp_path / "e.toml"
    exp.write_text(f'[experiment]\nname = "{"a" * 101}"\n' + DATA)
    _one_line_error(_submit(runner, tmp_path, exp), "experiment.name", "at most 100")


def test_set_cannot_smuggle_a_newline(runner, tmp_path: Path):
    exp = tmp_path / "e.toml"
    exp.write_text(DATA)
    _one_line_error(_submit(runner, tmp_path, exp, "--set", 'slurm.partition="a\\ntouch X"'), "slurm.partition")


# --- the filters: a value that got past validation stops the render ------------------------------


def _job(tmp_path: Path):
    exp_file = tmp_path / "e.toml"
    exp_file.write_text(DATA)
    (job,) = plan(config.load(exp_file))
    return job, RunInfo(run_id="RUN", run_dir=tmp_path / "run")


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [
        ("slurm", "partition", "debug\ntouch PWNED"),
        ("slurm", "time", "1\n"),
        ("slurm", "extra", {"comment": "a\rb"}),
        ("slurm", "extra", {"mail-type\ntouch PWNED": "END"}),
        ("env", "vars", {"A\ntouch PWNED": "x"}),
        ("env", "vars", {"A": "x\0y"}),
        ("env", "venv", "v\n"),
        ("env", "python", "py\nthon"),
        ("experiment", "name", "inj\n"),
    ],
)
def test_filters_refuse_what_they_cannot_write(tmp_path: Path, section: str, field: str, value):
    job, run = _job(tmp_path)
    exp = dataclasses.replace(job.exp, **{section: dataclasses.replace(getattr(job.exp, section), **{field: value})})
    with pytest.raises(TemplateError, match="refusing to"):
        render_job(dataclasses.replace(job, exp=exp), run)


def test_filters_write_what_they_can():
    assert sbatch_value("a b") == '="a b"' and sbatch_value('q"\\') == '="q\\"\\\\"'
    assert shquote("$(x) `y`") == "'$(x) `y`'" and shpath("~/v e") == "\"${HOME}\"/'v e'"
    assert shquote("=") == "'='" and shquote("a=b") == "'a=b'" and shquote("plain") == "plain"
    assert shpath("=") == "'='" and shpath("~/=") == "\"${HOME}\"/'='"
    for bad in ("a\nb", "a\rb", "a\0b", "a\x1bb"):
        for quote in (sbatch_value, shquote, shpath):
            with pytest.raises(TemplateError):
                quote(bad)


def test_errors_are_always_one_line():
    assert str(JobgenError("a\nb\rc\0d")) == "a\\nb\\rc\\x00d"


@pytest.mark.parametrize(
    ("literal", "word"),
    [
        ("nan", "finite"),
        ("inf", "finite"),
        ("-inf", "finite"),
        ("1" + "0" * 400, "finite"),
        ("{ a = { b = { c = 1 } } }", "table"),
    ],
)
def test_numbers_and_tables_that_are_not_numbers(runner, tmp_path: Path, literal: str, word: str):
    exp = tmp_path / "e.toml"
    exp.write_text(f"[train]\nlr = {literal}\n" + DATA)
    _one_line_error(_submit(runner, tmp_path, exp), "train.lr", word)


@pytest.mark.parametrize(
    "body",
    [
        f'[train]\nstrategy = "{"x" * 5000}"\n',
        f'[launch]\ntemplate = "{"x" * 5000}"\n',
        f'[data]\nfiles = {{ train = "{"x" * 5000}" }}\n',
        f'[env]\nvars = {{ "-{"X" * 5000}" = "1" }}\n',
    ],
)
def test_long_values_and_names_are_refused_and_cut_short_in_the_message(runner, tmp_path: Path, body: str):
    exp = tmp_path / "e.toml"
    exp.write_text(body + DATA)
    assert len(_one_line_error(_submit(runner, tmp_path, exp))) < 400
