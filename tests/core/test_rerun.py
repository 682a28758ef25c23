"""`jobgen rerun RUN [JOB...]`: a new run from the old run's record (specs, scripts, code snapshot), not
from today's files; --set changes a key on purpose; what cannot be repeated as recorded is drift.

The jobs here run a stand-in for the training entrypoint (a copy of training/ whose __main__ writes a
result from a constant in the package), so a test sees in a second which code a job ran. The real
training, to 6 decimals, is tests/training/test_rerun.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from jobgen.cli import main
from jobgen.commands import rerun as rerun_mod
from jobgen.commands import submit as sub
from tests.data.summary.synth import FakeJob, result_json

REPO = Path(__file__).resolve().parents[2]
EXP = """
[experiment]
name = "exp"

[launch]
backend = "local"

[train]
model = "builtin:tiny"
accelerator = "cpu"
epochs = 1
seed = 5

[data]
dataset = "builtin:synthetic"
"""
SWEPT = EXP + '\n[sweep.grid]\n"train.lr" = [0.001, 0.002]\n'  # two jobs: lr-0.001, lr-0.002
STAND_IN = """import json, sys
from pathlib import Path

from training import stand_in
from training.results import installed_packages

spec = json.loads(Path(sys.argv[sys.argv.index("--spec") + 1]).read_text())
result = json.loads({template!r})
result.update(job=spec["job"], test_acc=stand_in.VALUE + spec["train"]["epochs"] / 100)
result["ran_on"] = {{"packages": installed_packages()}}
Path(spec["job_dir"], "result.json").write_text(json.dumps(result))
print("stand-in: wrote its result")
"""


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout's training/ (a copy, with the stand-in entrypoint) that submit snapshots into each run."""
    code = tmp_path / "checkout" / "training"
    shutil.copytree(REPO / "training", code, ignore=shutil.ignore_patterns("__pycache__"))
    (code / "__main__.py").write_text(STAND_IN.format(template=json.dumps(result_json(FakeJob("x"), "exp"))))
    (code / "stand_in.py").write_text("VALUE = 0.5\n")
    monkeypatch.setattr(sub, "training_package_dir", lambda: code)
    monkeypatch.setattr(rerun_mod, "training_package_dir", lambda: code)
    return code


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "runs"


def _cli(runner, root: Path, *args: str):
    return runner.invoke(main, ["--output-root", str(root), *args])


def _submit(runner, root: Path, tmp_path: Path, text: str = EXP) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(text)
    result = _cli(runner, root, "submit", str(path))
    assert result.exit_code == 0, result.output
    return _newest(root)


def _newest(root: Path) -> Path:
    # By the manifest's last write: two runs made in one second tie on their ids' time part.
    return max((root / "exp").iterdir(), key=lambda p: (p / "manifest.json").stat().st_mtime_ns)


def _acc(run: Path, job: str) -> float:
    return float(json.loads((run / "jobs" / job / "result.json").read_text())["test_acc"])


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def test_a_rerun_runs_the_snapshot_not_the_edited_checkout(runner, root: Path, tmp_path: Path, checkout: Path):
    old = _submit(runner, root, tmp_path, SWEPT)
    assert _acc(old, "lr-0.001") == 0.51
    (checkout / "stand_in.py").write_text("VALUE = 0.25\n")  # training/ edited after the run

    result = _cli(runner, root, "rerun", str(old))
    assert result.exit_code == 0, result.output
    new = _newest(root)
    assert new != old and f"rerun of {old}" in result.output
    assert _acc(new, "lr-0.001") == _acc(new, "lr-0.002") == 0.51
    assert (new / "code" / "training" / "stand_in.py").read_text() == "VALUE = 0.5\n"
    doc = _manifest(new)
    assert doc["rerun"] == {
        "of": old.name,
        "run_dir": str(old),
        "jobs": ["lr-0.001", "lr-0.002"],
        "sets": [],
        "drift": [],
    }
    assert [j["state"] for j in doc["jobs"]] == ["COMPLETED", "COMPLETED"]
    for job in ("lr-0.001", "lr-0.002"):
        # The same script but for the run's folder and id; its PYTHONPATH names the new run's copy.
        script = (new / "jobs" / job / "job.sh").read_text()
        assert script == (old / "jobs" / job / "job.sh").read_text().replace(old.name, new.name)
        assert f"export PYTHONPATH={new / 'code'}" in script
        spec, was = (json.loads((run / "jobs" / job / "spec.json").read_text()) for run in (new, old))
        assert spec == {**was, "run_dir": str(new), "job_dir": str(new / "jobs" / job)}

    # The edit does change what a job computes: a new submit of the checkout runs it.
    fresh = _submit(runner, root, tmp_path)
    assert _acc(fresh, "exp") == 0.26


def test_named_jobs_only_and_set_changes_that_key_on_purpose(runner, root: Path, tmp_path: Path, checkout: Path):
    old = _submit(runner, root, tmp_path, SWEPT)
    result = _cli(runner, root, "rerun", old.name, "lr-0.002", "--set", "train.epochs=3")
    assert result.exit_code == 0, result.output
    new = _newest(root)
    assert [j["name"] for j in _manifest(new)["jobs"]] == ["lr-0.002"]
    assert not (new / "jobs" / "lr-0.001").exists()
    assert _acc(new, "lr-0.002") == 0.53
    spec, was = (json.loads((run / "jobs" / "lr-0.002" / "spec.json").read_text()) for run in (new, old))
    assert spec["train"] == {**was["train"], "epochs": 3}
    assert {k: v for k, v in spec.items() if k not in ("train", "run_dir", "job_dir")} == {
        k: v for k, v in was.items() if k not in ("train", "run_dir", "job_dir")
    }
    doc = _manifest(new)
    assert doc["rerun"]["sets"] == ["train.epochs=3"] and doc["overrides"] == ["train.epochs=3"]
    assert doc["rerun"]["jobs"] == ["lr-0.002"]


def test_dry_run_shows_what_would_run_and_runs_nothing(runner, root: Path, tmp_path: Path, checkout: Path):
    old = _submit(runner, root, tmp_path)
    result = _cli(runner, root, "rerun", str(old), "--dry-run", "--show")
    assert result.exit_code == 0, result.output
    new = _newest(root)
    assert "dry run: 1 job(s) written, nothing submitted" in result.output
    assert f"bash {new}/jobs/exp/job.sh" in result.output and f"--spec {new}/jobs/exp/spec.json" in result.output
    assert not (new / "jobs" / "exp" / "result.json").exists()
    assert _manifest(new)["dry_run"] is True


def test_a_missing_snapshot_is_drift(runner, root: Path, tmp_path: Path, checkout: Path):
    old = _submit(runner, root, tmp_path)
    shutil.rmtree(old / "code" / "training")
    result = _cli(runner, root, "rerun", str(old))
    assert result.exit_code == 1
    assert "code snapshot is missing" in result.output and "--allow-drift" in result.output
    assert "Traceback" not in result.output
    assert _newest(root) == old, "a refused rerun wrote a run"

    result = _cli(runner, root, "rerun", str(old), "--allow-drift")
    assert result.exit_code == 0, result.output
    new = _newest(root)
    assert "drift (allowed)" in result.output
    assert _manifest(new)["rerun"]["drift"][0].startswith(f"{old}/code/training: the code snapshot is missing")
    assert _acc(new, "exp") == 0.51  # today's checkout, as the drift line warned


def test_a_package_version_that_differs_is_drift(runner, root: Path, tmp_path: Path, checkout: Path):
    old = _submit(runner, root, tmp_path, SWEPT)
    path = old / "jobs" / "lr-0.001" / "result.json"
    doc = json.loads(path.read_text())
    click = next(p for p in doc["ran_on"]["packages"] if p.lower().startswith("click=="))
    doc["ran_on"]["packages"] = [p if p != click else "click==0.0.1" for p in doc["ran_on"]["packages"]]
    path.write_text(json.dumps(doc))
    result = _cli(runner, root, "rerun", str(old))
    assert result.exit_code == 1
    assert f"drift: click 0.0.1 recorded, {click.split('==')[1]} here" in result.output
    assert "cannot be repeated as recorded" in result.output.splitlines()[-1]
    # The other job recorded the versions there are: it alone repeats without drift.
    assert _cli(runner, root, "rerun", str(old), "lr-0.002").exit_code == 0


def test_with_set_a_script_this_jobgen_renders_differently_is_drift(runner, root: Path, tmp_path: Path, checkout: Path):
    old = _submit(runner, root, tmp_path)
    script = old / "jobs" / "exp" / "job.sh"
    script.write_text(script.read_text().replace("set -euo pipefail", "set -eu"))  # as an older jobgen wrote it
    result = _cli(runner, root, "rerun", str(old), "--set", "train.epochs=2", "--dry-run")
    assert result.exit_code == 1
    assert "renders its script differently" in result.output and "'set -eu' -> 'set -euo pipefail'" in result.output
    # Without --set the recorded script is what runs: nothing is rendered, nothing differs.
    assert _cli(runner, root, "rerun", str(old), "--dry-run").exit_code == 0


@pytest.mark.parametrize("backend", ["local", "sbatch", "submitit"])
def test_every_backend_gets_the_recorded_files_moved(tmp_path: Path, backend: str):
    """A run written (not submitted) with each backend: its rerun's files are the old ones, moved."""
    path = tmp_path / "exp.toml"
    path.write_text(SWEPT.replace('backend = "local"', f'backend = "{backend}"'))
    old = sub.prepare(path, tmp_path / "runs", dry_run=False).run_dir
    done = rerun_mod.rerun(old, [], dry_run=True)
    assert done.run_dir.parent == old.parent and done.jobs == ["lr-0.001", "lr-0.002"]
    for entry in done.manifest["jobs"]:
        new_script = (done.run_dir / entry["script"]).read_text()
        assert new_script == (old / entry["script"]).read_text().replace(old.name, done.run_dir.name)
        assert old.name not in new_script and str(done.run_dir / "code") in new_script
        command = " ".join(entry["submit_command"])
        assert f"{done.run_dir}/jobs/{entry['name']}/" in command and old.name not in command
    if backend == "sbatch":
        assert (
            f"--comment=jobgen:{done.run_dir.name}:lr-0.001" in (done.run_dir / "jobs/lr-0.001/job.sbatch").read_text()
        )


@pytest.mark.parametrize("backend", ["local", "sbatch", "submitit"])
def test_every_backend_reruns_with_set_without_drift(tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch):
    """With --set the scripts are rendered again and compared with the recorded ones: a run written by this
    jobgen, here, renders the same (its interpreter for `jobgen top-up`, its $HF_HOME), so nothing drifts."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    path = tmp_path / "exp.toml"
    path.write_text(SWEPT.replace('backend = "local"', f'backend = "{backend}"'))
    old = sub.prepare(path, tmp_path / "runs", dry_run=False).run_dir
    done = rerun_mod.rerun(old, ["lr-0.002"], ["train.epochs=2"], dry_run=True)
    assert done.jobs == ["lr-0.002"] and not done.manifest["rerun"].get("drift"), done.manifest["rerun"]
    spec = json.loads((done.run_dir / "jobs" / "lr-0.002" / "spec.json").read_text())
    assert spec["train"]["epochs"] == 2


def test_a_moved_run_is_rerun_where_it_is_now(runner, root: Path, tmp_path: Path, checkout: Path):
    old = _submit(runner, root, tmp_path)
    moved = tmp_path / "elsewhere"
    shutil.move(root, moved)
    here = moved / "exp" / old.name
    result = _cli(runner, moved, "rerun", str(here))
    assert result.exit_code == 0, result.output
    new = _newest(moved)
    script = (new / "jobs" / "exp" / "job.sh").read_text()
    assert str(root) not in script and f"export PYTHONPATH={new / 'code'}" in script
    assert _acc(new, "exp") == 0.51


HALVED = SWEPT.replace("epochs = 1", "epochs = 3") + "\n[sweep.halving]\nrungs = [1]\neta = 2\n"


def test_a_halving_run_is_rerun_with_its_halving(runner, root: Path, tmp_path: Path, checkout: Path):
    """The new run halves its sweep as the old one did: its manifest (what status and summary read) and
    its jobs' specs (what the jobs apply) carry [sweep.halving], with --set too."""
    old = _submit(runner, root, tmp_path, HALVED)
    want = {"rungs": [1], "eta": 2, "metric": "primary", "mode": "max"}
    assert _manifest(old)["halving"] == want
    for args in ([], ["--set", "train.epochs=4"]):
        result = _cli(runner, root, "rerun", str(old), "--dry-run", *args)
        assert result.exit_code == 0, result.output
        new = _newest(root)
        assert new != old and _manifest(new)["halving"] == want
        for job in ("lr-0.001", "lr-0.002"):
            assert json.loads((new / "jobs" / job / "spec.json").read_text())["halving"] == want
    # One job of a sweep halved with eta 2 would stop at its first rung: refused, in one line.
    result = _cli(runner, root, "rerun", str(old), "lr-0.002")
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert "halves its sweep (eta = 2)" in result.output and "rerun at least 2 of its jobs" in result.output
