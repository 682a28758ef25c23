"""Hostile values in experiment files and paths render into scripts that run no injected command.

The scripts are executed for real with stub srun/scontrol/python on PATH: the stubs record what
they were given, and files named INJECTED* appear only if some value escaped its quoting.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from jobgen.cli import main

HOSTILE = "a b;$(touch INJECTED1)`touch INJECTED2`'q'\"dq\"\\"

STUB_PYTHON = """#!/bin/bash
printf '%s\\n' "$@" > "$STUB_LOG/args"
printf '%s' "$A" > "$STUB_LOG/A"
printf '%s' "$B" > "$STUB_LOG/B"
printf '%s' "$PYTHONPATH" > "$STUB_LOG/pythonpath"
"""
STUB_SRUN = """#!/bin/bash
# Drop srun's own options, run the command.
while [[ "$1" == -* ]]; do shift; done
exec "$@"
"""
STUB_SCONTROL = """#!/bin/bash
echo localhost
"""


def _stub(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def hostile(tmp_path: Path):
    base = tmp_path / f"exp dir {HOSTILE}"
    base.mkdir()
    python = _stub(base / "bin dir $(touch INJECTED3)" / "python", STUB_PYTHON)
    venv = base / "venv 'x' $(touch INJECTED4)"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("export VENV_ACTIVATED=1\n")
    (base / "train data.csv").write_text("text,label\nx,0\n")
    exp = base / "exp.toml"
    exp.write_text(
        '[experiment]\nname = "inj"\n'
        "[slurm]\nextra = { comment = " + json.dumps(HOSTILE) + " }\n"
        "[env]\n"
        f"python = {json.dumps(str(python))}\n"
        f"venv = {json.dumps(str(venv))}\n"
        "vars = { A = " + json.dumps(HOSTILE) + ', B = "$(touch INJECTED5); `touch INJECTED6` ${HOME}" }\n'
        "[train]\nmodel = " + json.dumps("m" + HOSTILE) + "\n"
        '[data]\nfiles = { train = "train data.csv" }\ntext_field = ' + json.dumps(HOSTILE) + "\n"
    )
    stubs = tmp_path / "stubs"
    _stub(stubs / "srun", STUB_SRUN)
    _stub(stubs / "scontrol", STUB_SCONTROL)
    return exp, tmp_path / f"out {HOSTILE}", stubs


@pytest.mark.parametrize("backend", ["sbatch", "local"])
def test_hostile_values_run_no_injected_command(hostile, runner, tmp_path: Path, backend: str):
    exp, root, stubs = hostile
    result = runner.invoke(main, ["--output-root", str(root), "submit", str(exp), "--dry-run", "--backend", backend])
    assert result.exit_code == 0, result.output
    (run_dir,) = (root / "inj").iterdir()
    job = json.loads((run_dir / "manifest.json").read_text())["jobs"][0]
    script = run_dir / job["script"]
    log = tmp_path / "log"
    log.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    env = {
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "STUB_LOG": str(log),
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_CPUS_PER_TASK": "2",
    }
    done = subprocess.run(["bash", str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.rglob("INJECTED*")), "a value escaped its quoting"
    args = (log / "args").read_text().splitlines()
    assert args == ["-u", "-m", "training", "--spec", str(run_dir / job["spec"])]
    assert (log / "A").read_text() == HOSTILE
    assert (log / "B").read_text() == "$(touch INJECTED5); `touch INJECTED6` ${HOME}"
    assert (log / "pythonpath").read_text().startswith(str(run_dir / "code"))
    spec = json.loads((run_dir / job["spec"]).read_text())
    assert spec["train"]["model"] == "m" + HOSTILE and spec["data"]["text_field"] == HOSTILE


def test_sbatch_lines_quote_hostile_values(hostile, runner):
    exp, root, _ = hostile
    result = runner.invoke(main, ["--output-root", str(root), "submit", str(exp), "--dry-run"])
    assert result.exit_code == 0, result.output
    (script,) = root.rglob("job.sbatch")
    lines = [line for line in script.read_text().splitlines() if line.startswith("#SBATCH --comment")]
    escaped = HOSTILE.replace("\\", "\\\\").replace('"', '\\"')
    run_id = script.parents[2].name  # the user's comment follows jobgen's tag (at-most-once submission)
    assert lines == [f'#SBATCH --comment="jobgen:{run_id}:inj {escaped}"']


def test_newline_in_output_root_is_refused(hostile, runner, tmp_path: Path):
    exp, _, _ = hostile
    root = tmp_path / "two\nlines"
    result = runner.invoke(main, ["--output-root", str(root), "submit", str(exp), "--dry-run"])
    assert result.exit_code == 1 and "line break" in result.output
    assert not root.exists()


def test_newline_in_experiment_path_stays_in_the_comment(tmp_path: Path, runner):
    folder = tmp_path / "x\ntouch INJECTED7"
    folder.mkdir()
    exp = folder / "e.toml"
    exp.write_text('[launch]\nbackend = "local"\n[data]\ndataset = "builtin:synthetic"\n')
    result = runner.invoke(main, ["--output-root", str(tmp_path / "o"), "submit", str(exp), "--dry-run"])
    assert result.exit_code == 0, result.output
    (script,) = (tmp_path / "o").rglob("job.sh")
    header = script.read_text().splitlines()[2]
    assert header.startswith("# experiment:") and "\\ntouch INJECTED7" in header
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True)
    assert done.returncode == 0
