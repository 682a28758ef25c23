"""Options that depend on another, or exclude one, are refused as usage errors (exit 2), from the one
table of such rules in jobgen/cli.py; files a command writes go into folders that exist."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from jobgen import cli
from jobgen.cli import EXCLUSIVE, NEEDS, main
from tests.data.summary.synth import FakeJob, write_run


def _param(command: str, name: str) -> click.Parameter:
    return next(p for p in main.commands[command].params if p.name == name)


def _argv(command: str, name: str) -> list[str]:
    """The option on a command line: a flag alone, an option with a value it accepts."""
    param = _param(command, name)
    assert isinstance(param, click.Option)
    # A required argument is given a placeholder: the rule is checked before the command reads it.
    needed = ["x" for p in main.commands[command].params if isinstance(p, click.Argument) and p.required]
    return [*needed, *([param.opts[0]] if param.is_flag else [param.opts[0], "1"])]


RULES = [(cmd, name, needs) for cmd, rules in NEEDS.items() for name, needs in rules.items()]


@pytest.mark.parametrize(("command", "name", "needs"), RULES, ids=[f"{c}-{n}" for c, n, _ in RULES])
def test_every_option_that_needs_another_is_refused_without_it(runner, tmp_path: Path, command, name, needs):
    result = runner.invoke(main, ["--output-root", str(tmp_path), command, *_argv(command, name)])
    assert result.exit_code == 2, result.output
    flag = _param(command, name).opts[0]
    assert f"{flag} goes with {_param(command, needs[0]).opts[0]}" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("command", "name", "needs"), RULES, ids=[f"{c}-{n}" for c, n, _ in RULES])
def test_every_option_that_needs_another_passes_beside_it(runner, tmp_path: Path, command, name, needs):
    for need in needs:
        argv = [command, *_argv(command, name), *_argv(command, need)]
        result = runner.invoke(main, ["--output-root", str(tmp_path), *argv])
        assert "goes with" not in result.output, result.output  # it fails later (no run, no file), not here


GROUPS = [(cmd, group) for cmd, groups in EXCLUSIVE.items() for group in groups]


@pytest.mark.parametrize(("command", "group"), GROUPS, ids=[f"{c}-{'-'.join(g)}" for c, g in GROUPS])
def test_options_that_exclude_each_other_are_refused_together(runner, tmp_path: Path, command, group):
    argv = [arg for name in group for arg in _argv(command, name)]
    result = runner.invoke(main, ["--output-root", str(tmp_path), command, *argv])
    assert result.exit_code == 2 and "cannot go together" in result.output, result.output


def test_every_option_whose_help_says_with_another_is_in_the_table():
    """An option documented as 'With --x: ...' depends on --x: the table must say so, or it is ignored."""
    for name, command in main.commands.items():
        for param in command.params:
            help_text = getattr(param, "help", None) or ""
            if help_text.startswith("With --"):
                assert param.name in NEEDS.get(name, {}), f"{name} {param.opts[0]}: help says {help_text!r}"


@pytest.mark.parametrize("interval", ["0", "-1"])
def test_status_interval_must_be_positive(runner, tmp_path: Path, interval: str):
    result = runner.invoke(main, ["--output-root", str(tmp_path), "status", "--watch", "--interval", interval])
    assert result.exit_code == 2 and "--interval" in result.output, result.output


def _run_with_logs(tmp_path: Path) -> Path:
    job = FakeJob("j", state="COMPLETED", logs={"slurm-1.out": "0: hello\n1: world\n", "slurm-1.err": "0: oops\n"})
    return write_run(tmp_path, "exp", [job])


def test_logs_rank_without_lines_says_so_and_fails(runner, tmp_path: Path):
    run_dir = _run_with_logs(tmp_path)
    result = runner.invoke(main, ["logs", str(run_dir), "j", "--rank", "5"])
    assert result.exit_code == 1, result.output
    assert "no line of rank 5" in result.stderr and "ranks with lines: 0, 1" in result.stderr
    assert "Traceback" not in result.output


def test_logs_rank_and_streams(runner, tmp_path: Path):
    run_dir = _run_with_logs(tmp_path)
    assert runner.invoke(main, ["logs", str(run_dir), "j", "--rank", "1"]).output == "[rank 1] world\n"
    assert runner.invoke(main, ["logs", str(run_dir), "j", "--err"]).output == "[rank 0] oops\n"
    assert runner.invoke(main, ["logs", str(run_dir), "j", "--out"]).output == "[rank 0] hello\n[rank 1] world\n"


# --- files a command writes, and --set items --------------------------------------------------------


def test_every_file_option_is_an_out_file():
    """Options that name a file to write use cli._OutFile (its folder must exist)."""
    out_files = [
        (name, p.name) for name, c in main.commands.items() for p in c.params if isinstance(p.type, cli._OutFile)
    ]
    assert {("report", "output"), ("summary", "plot")} <= set(out_files)


@pytest.mark.parametrize("argv", [["report", "-o"], ["summary", "--plot"]])
def test_an_output_file_in_a_missing_folder_is_refused(runner, tmp_path: Path, argv: list[str]):
    run_dir = _run_with_logs(tmp_path)
    missing = tmp_path / "missing" / "dir"
    result = runner.invoke(main, [argv[0], str(run_dir), argv[1], str(missing / "out.file")])
    assert result.exit_code == 2, result.output
    assert f"the folder {missing} does not exist" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("item", ["train.epochs", "epochs=1", "train..epochs=1", "sweep.grid=1"])
def test_a_malformed_set_is_a_usage_error(runner, item: str):
    demo = Path(__file__).resolve().parents[2] / "experiments" / "local_demo.toml"
    result = runner.invoke(main, ["validate", str(demo), "--set", item])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("Error: --set") and "Traceback" not in line
