"""The CLI door: help everywhere, version, schema, dry-run output, secrets, import cost, the installed script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

import jobgen
from jobgen.cli import main

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "experiments" / "local_demo.toml"
HEAVY = {
    "torch",
    "lightning",
    "transformers",
    "datasets",
    "deepspeed",
    "submitit",
    "matplotlib",
    "tensorboard",
    "wandb",
    "mlflow",
}


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["submit"],
        ["validate"],
        ["schema"],
        ["status"],
        ["logs"],
        ["cancel"],
        ["requeue"],
        ["runs"],
        ["clean"],
        ["prefetch"],
        ["summary"],
        ["report"],
        ["sync"],
        ["diff"],
    ],
)
def test_help(runner, command):
    result = runner.invoke(main, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_version(runner):
    from jobgen import __version__

    result = runner.invoke(main, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_schema_lists_every_key_with_default_and_doc(runner):
    from jobgen.experiment.schema import schema_rows

    result = runner.invoke(main, ["schema"])
    assert result.exit_code == 0
    for key, _, default, valid, doc in schema_rows():
        assert key in result.output and doc in result.output and default in result.output and valid in result.output
    md = runner.invoke(main, ["schema", "--format", "markdown"]).output
    assert '| `train.strategy` | `str` | `"auto"` |' in md
    assert "| `slurm.nodes` | `int` | `1` | positive and at most 10000 |" in md


def test_schema_lists_the_choices_of_every_key_that_has_them(runner):
    """Every key validation checks against a list (strategy, precision, compile_mode, data.format, ...)
    names that list in `schema`, as it is in the contract."""
    import dataclasses

    from jobgen.experiment.schema import SECTIONS

    out = runner.invoke(main, ["schema"]).output.splitlines()
    with_choices = [
        (f"{name}.{f.name}", f.metadata["choices"])
        for name, section in SECTIONS.items()
        for f in dataclasses.fields(section)
        if f.metadata.get("choices")
    ]
    assert len(with_choices) >= 6
    for key, choices in with_choices:
        line = next(ln for ln in out if ln.startswith(key + " "))
        assert f"(one of {', '.join(choices)})" in line, (key, line)


def test_dry_run_prints_scripts_and_commands(runner, out_root: Path):
    result = runner.invoke(main, ["--output-root", str(out_root), "submit", str(DEMO), "--dry-run", "--show"])
    assert result.exit_code == 0, result.output
    (run_dir,) = (out_root / "local_demo").iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [j["name"] for j in manifest["jobs"]] == [
        "engine-torch",
        "engine-lightning",
        "engine-fabric",
        "engine-hf-trainer",
    ]
    for job in manifest["jobs"]:
        assert f"$ bash {run_dir / job['script']}" in result.output
        assert job["state"] == "DRY_RUN" and job["job_id"] is None
    assert "exec " in result.output and "dry run: 4 job(s) written, nothing submitted" in result.output
    assert (run_dir / "experiment.toml").read_text() == DEMO.read_text()
    assert (run_dir / "code" / "training" / "__main__.py").exists()
    assert (run_dir / "code.patch").exists()
    assert manifest["git"]["sha"] is None or len(manifest["git"]["sha"]) == 40


def test_runs_lists_every_run_oldest_first(runner, out_root: Path):
    root = ["--output-root", str(out_root)]
    assert runner.invoke(main, [*root, "runs"]).output.strip() == f"no runs under {out_root}"
    for exp in ("local_demo", "imdb_ddp", "local_demo"):
        assert (
            runner.invoke(main, [*root, "submit", str(REPO / "experiments" / f"{exp}.toml"), "--dry-run"]).exit_code
            == 0
        )
    lines = runner.invoke(main, [*root, "runs"]).output.splitlines()
    assert lines[0].split()[:4] == ["run", "created", "backend", "jobs"] and len(lines) == 4
    demo_runs = sorted(p.name for p in (out_root / "local_demo").iterdir())
    only_demo = runner.invoke(main, [*root, "runs", str(REPO / "experiments" / "local_demo.toml")]).output
    assert [line.split()[0] for line in only_demo.splitlines()[1:]] == [f"local_demo/{r}" for r in demo_runs]
    assert all(line.split()[-4:] == ["local", "4", "4", "DRY_RUN"] for line in only_demo.splitlines()[1:])
    missing = runner.invoke(main, [*root, "runs", "imdb_fsdp"])
    assert missing.exit_code == 1 and "no runs of 'imdb_fsdp'" in missing.output and "imdb_ddp" in missing.output


def test_set_overrides_keys_and_is_recorded(runner, out_root: Path):
    exp = REPO / "experiments" / "imdb_ddp.toml"
    sets = [
        "train.epochs=1",
        "train.lr=2e-5",
        "train.compile=true",
        "slurm.time=00:30:00",
        "slurm.partition=debug",
        "env.vars.WANDB_MODE=offline",
        'experiment.description="quick check"',
    ]
    argv = ["--output-root", str(out_root), "submit", str(exp), "--dry-run", *[a for s in sets for a in ("--set", s)]]
    result = runner.invoke(main, argv)
    assert result.exit_code == 0, result.output
    (run_dir,) = (out_root / "imdb_ddp").iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["overrides"] == sets
    assert (run_dir / "experiment.toml").read_text() == exp.read_text()  # the file as written, beside them
    spec = json.loads((run_dir / manifest["jobs"][0]["spec"]).read_text())
    assert (spec["train"]["epochs"], spec["train"]["lr"], spec["train"]["compile"]) == (1, 2e-5, True)
    assert spec["env"]["vars"] == {"WANDB_MODE": "offline"} and spec["slurm"]["time"] == "00:30:00"
    script = (run_dir / manifest["jobs"][0]["script"]).read_text()
    assert "#SBATCH --time=00:30:00" in script and "#SBATCH --partition=debug" in script
    assert "export WANDB_MODE=offline" in script
    assert runner.invoke(main, ["validate", str(exp), "--set", "train.epochs=1"]).output == f"ok: {exp} (1 job)\n"
    both = runner.invoke(main, ["submit", "--resume", str(run_dir), "--set", "train.epochs=2"])
    assert both.exit_code == 2 and "no EXPERIMENT or --set" in both.output


def test_sbatch_dry_run_command_is_exact(runner, out_root: Path):
    exp = REPO / "experiments" / "imdb_deepspeed.toml"
    result = runner.invoke(main, ["--output-root", str(out_root), "submit", str(exp), "--dry-run"])
    assert result.exit_code == 0, result.output
    (run_dir,) = (out_root / "imdb_deepspeed").iterdir()
    for job in json.loads((run_dir / "manifest.json").read_text())["jobs"]:
        assert job["submit_command"] == ["sbatch", "--parsable", str(run_dir / job["script"])]


def test_secrets_never_land_in_files(runner, out_root: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("HF_TOKEN", "hf_supersecretvalue123")
    monkeypatch.setenv("WANDB_API_KEY", "wandbsecretvalue456")
    monkeypatch.setenv("MY_DB_PASSWORD", "hunter2hunter2")
    result = runner.invoke(main, ["--output-root", str(out_root), "submit", str(DEMO), "--dry-run", "--show"])
    assert result.exit_code == 0
    for path in out_root.rglob("*"):
        if path.is_file():
            text = path.read_bytes()
            assert b"supersecret" not in text and b"wandbsecret" not in text and b"hunter2" not in text, path
    # A secret's value pasted into the experiment under another name is refused too.
    exp = tmp_path / "leak.toml"
    exp.write_text(DEMO.read_text() + '\n[env]\nvars = { HF_HOME_X = "hf_supersecretvalue123" }\n')
    result = runner.invoke(main, ["--output-root", str(tmp_path / "o2"), "submit", str(exp), "--dry-run"])
    assert result.exit_code == 1 and "$HF_TOKEN" in result.output
    assert not (tmp_path / "o2").exists() or not any((tmp_path / "o2").rglob("*.json"))


@pytest.mark.parametrize("module", ["jobgen.cli", "jobgen.api"])
def test_cli_import_stays_light(module: str):
    code = f"import {module}, sys; print(sorted({{m.split('.')[0] for m in sys.modules}}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(eval(out))
    assert not HEAVY & loaded, HEAVY & loaded


def test_installed_script_runs(tmp_path: Path):
    script = Path(sys.executable).parent / "jobgen"
    assert script.exists(), "the console script is not installed (pip install -e .)"
    env = {**os.environ, "JOBGEN_OUTPUT_ROOT": str(tmp_path)}
    done = subprocess.run([str(script), "submit", str(DEMO), "--dry-run"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "4 job(s) written" in done.stdout
    bad = subprocess.run([str(script), "validate", str(tmp_path / "nope.toml")], capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.strip().startswith("Error:") and "Traceback" not in bad.stderr


def test_installed_script_ends_as_python_would(runner, tmp_path: Path):
    """The console script leaves without Python's teardown (jobgen.cli.entry): every byte of its output
    still arrives, and its statuses are click's: 0, 1 for an error, 2 for a usage error."""
    script = str(Path(sys.executable).parent / "jobgen")
    assert "entry()" in Path(script).read_text(), "reinstall jobgen (pip install -e .): the script predates entry()"
    out = tmp_path / "schema.txt"
    with out.open("w") as fh:  # a file: fully buffered, all of it flushed at the end
        done = subprocess.run([script, "schema", "--format", "markdown"], stdout=fh, stderr=subprocess.PIPE, text=True)
    assert done.returncode == 0 and done.stderr == ""
    assert out.read_text() == runner.invoke(main, ["schema", "--format", "markdown"]).output
    assert len(out.read_text()) > 8192  # more than one buffer's worth
    usage = subprocess.run([script, "status", "--no-such-flag"], capture_output=True, text=True)
    assert usage.returncode == 2 and "No such option" in usage.stderr


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`jobgen schema | head -1`: the first line, then status 1 and nothing on stderr (no one-line error
    about a broken pipe, no traceback)."""
    import fcntl

    script = str(Path(sys.executable).parent / "jobgen")
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, 1031, 4096)  # F_SETPIPE_SZ: one page, less than the schema's 13 KB
    proc = subprocess.Popen([script, "schema"], stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    assert proc.stderr is not None
    with os.fdopen(read_end, "rb") as reader:
        first = reader.readline()  # the reader goes away with most of the output unread
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 1 and first.startswith(b"experiment.name"), (first, err)
    assert err == b""


def test_the_script_ends_as_python_does_running_a_callers_exit_handlers():
    """`entry()` is main() and Python's usual exit: what a caller registered with atexit still runs
    after the command has printed, and the exit status is the command's."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('handler ran'))\n"
        "sys.argv = ['jobgen', sys.argv[1]]\n"
        "from jobgen.cli import entry\n"
        "entry()\n"
    )
    done = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.splitlines() == [f"jobgen, version {jobgen.__version__}", "handler ran"]
    bad = subprocess.run([sys.executable, "-c", code, "--no-such-option"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no such option" in bad.stderr.lower() and bad.stdout == "handler ran\n"


def test_templates_ship_in_the_wheel(tmp_path: Path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:  # no setuptools in this venv: build in an isolated env instead
        done = subprocess.run(
            ["uv", "build", "--wheel", "-o", str(tmp_path), str(REPO)], capture_output=True, text=True
        )
    assert done.returncode == 0, done.stderr
    import zipfile

    (wheel,) = tmp_path.glob("jobgen-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = ("base.sbatch.j2", "srun.sbatch.j2", "local.sh.j2", "_environment.j2", "_header.j2")
    for template in (*shipped, "_container_apptainer.j2", "_container_pyxis.j2", "_container_charliecloud.j2"):
        assert f"jobgen/templates/{template}" in names
    assert "training/__main__.py" in names


def test_output_root_goes_before_or_after_the_command(runner, tmp_path: Path):
    """`jobgen submit X --output-root DIR` as users write it (and scripts/demo.sh passes it on): every
    command takes it after its name too, with the same effect as before it."""
    for name, command in main.commands.items():
        if isinstance(command, click.Group):
            continue
        assert "--output-root" in runner.invoke(main, [name, "--help"]).output, name
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    before = runner.invoke(main, ["--output-root", str(empty), "runs"])
    after = runner.invoke(main, ["runs", "--output-root", str(empty)])
    assert before.exit_code == after.exit_code and before.output == after.output
    assert f"no runs under {empty}" in after.output
    dry = runner.invoke(main, ["submit", str(DEMO), "--dry-run", "--output-root", str(tmp_path / "r")])
    assert dry.exit_code == 0, dry.output
    assert len(list((tmp_path / "r" / "local_demo").iterdir())) == 1
