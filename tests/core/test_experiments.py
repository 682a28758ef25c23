"""Every shipped experiment validates, renders through the real submit path, and passes bash -n + shellcheck."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from jobgen.cli import main
from tests.support.golden import experiments

EXPERIMENTS = experiments()


def test_the_issue_names_are_all_shipped():
    names = {p.stem for p in EXPERIMENTS}
    wanted = {
        "imdb_ddp",
        "imdb_fsdp",
        "imdb_deepspeed",
        "imdb_fabric",
        "mrpc_bert",
        "speedup_sweep",
        "fsdp_2node",
        "local_demo",
    }
    assert wanted <= names


@pytest.mark.parametrize("experiment", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_experiment_validates_renders_and_lints(experiment: Path, runner, out_root: Path):
    result = runner.invoke(main, ["validate", str(experiment)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["--output-root", str(out_root), "submit", str(experiment), "--dry-run"])
    assert result.exit_code == 0, result.output
    (run_dir,) = (out_root / experiment.stem).iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["dry_run"] is True and manifest["jobs"]
    for job in manifest["jobs"]:
        script = run_dir / job["script"]
        spec = json.loads((run_dir / job["spec"]).read_text())
        assert spec["job"] == job["name"] and spec["schema"] == 1
        assert str(script) in result.output
        check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        lint = subprocess.run([_shellcheck(), "--severity=style", str(script)], capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout


def _shellcheck() -> str:
    path = shutil.which("shellcheck")
    assert path, "shellcheck is missing: apt-get install shellcheck (tests/cluster/up.sh installs it)"
    return path
