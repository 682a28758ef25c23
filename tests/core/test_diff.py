"""`jobgen diff A B`: what differs between two runs (or two jobs), grouped, the rest folded away."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobgen.cli import main
from jobgen.commands import submit as sub
from jobgen.commands.submit import load_experiment
from jobgen.experiment import resolved
from tests.core.conftest import stub_tool
from tests.core.test_rerun import EXP, checkout  # noqa: F401 - the fixture: a checkout with the stand-in entrypoint
from tests.data.summary.synth import FakeJob, write_run

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TOML = '[experiment]\nname = "exp"\n\n[train]\nepochs = 2\nlr = 0.001\n\n[slurm]\npartition = "gpu"\n'
CODE = "def train():\n    return 1\n"
ID_A, ID_B = "20261129-200000-aaaa", "20261129-210000-bbbb"


def _run(root: Path, run_id: str, toml: str = TOML, code: str = CODE, **job: object) -> Path:
    jobs = [FakeJob("a", state="COMPLETED", **job), FakeJob("b", state="COMPLETED")]  # type: ignore[arg-type]
    run = write_run(root, "exp", jobs, run_id=run_id)
    (run / "experiment.toml").write_text(toml)
    (run / "code.patch").write_text("")
    (run / "code" / "training").mkdir(parents=True)
    (run / "code" / "training" / "x.py").write_text(code)
    return run


def _diff(runner, root: Path, *args: str):
    return runner.invoke(main, ["--output-root", str(root), "diff", *args])


def _json(runner, root: Path, *args: str) -> dict:
    result = _diff(runner, root, *args, "--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "runs"


def test_one_key_and_one_code_line_show_exactly_those(runner, root: Path):
    a = _run(root, ID_A)
    b = _run(root, ID_B, toml=TOML.replace("epochs = 2", "epochs = 3"), code=CODE.replace("1", "2"), test_acc=0.91)
    doc = _json(runner, root, str(a), str(b))
    assert doc["experiment"] == {"train.epochs": [2, 3]}
    assert doc["code"]["git"] == {} and doc["code"]["patch"] == "same"
    assert list(doc["code"]["files"]) == ["x.py"]
    changed = [
        ln for ln in doc["code"]["files"]["x.py"].splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")
    ]
    assert changed == ["-    return 1", "+    return 2"]
    assert doc["packages"] == {} and doc["cluster"] == {}
    assert [r["job"] for r in doc["results"]] == ["a", "b"]
    assert doc["results"][0]["test_acc"] == [0.87, 0.91]

    text = _diff(runner, root, str(a), str(b)).stdout
    assert "train.epochs  2  ->  3" in text
    assert "-    return 1" in text and "+    return 2" in text
    for group in ("packages", "cluster and nodes"):
        assert f"{group}: no differences" in text
    assert "test acc (%)" in text and "87.0" in text and "91.0" in text


def test_identical_runs_of_different_ids_show_no_differences(runner, root: Path):
    _run(root, ID_A)
    _run(root, ID_B)
    result = _diff(runner, root, ID_A, ID_B)
    assert result.exit_code == 0, result.output
    for group in ("experiment keys", "code", "packages", "cluster and nodes"):
        assert f"{group}: no differences" in result.stdout
    doc = _json(runner, root, ID_A, ID_B)
    assert doc["experiment"] == doc["packages"] == doc["cluster"] == {}
    assert doc["code"] == {"git": {}, "patch": "same", "files": {}}


def test_package_versions_host_and_nodes_that_differ(runner, root: Path):
    a, b = _run(root, ID_A), _run(root, ID_B)
    result = json.loads((b / "jobs" / "a" / "result.json").read_text())
    result["versions"]["torch"] = "2.6.0"
    result["slurm"]["nodelist"] = "gpu[002-003]"
    result["ran_on"] = {"host": "gpu002", "packages": ["numpy==2.1.0", "torch==2.6.0"]}
    (b / "jobs" / "a" / "result.json").write_text(json.dumps(result))
    doc = _json(runner, root, str(a), str(b))
    assert doc["packages"] == {"numpy": [None, "2.1.0"], "torch": ["2.5.0", "2.5.0, 2.6.0"]}
    assert doc["cluster"]["nodelist"] == ["gpu001", "gpu001, gpu[002-003]"]
    assert doc["cluster"]["host"] == [None, "gpu002"]
    assert set(doc["experiment"]) == set()
    # Two jobs: only that job's records count.
    doc = _json(runner, root, f"{a}:a", f"{b}:a")
    assert doc["packages"] == {"numpy": [None, "2.1.0"], "torch": ["2.5.0", "2.6.0"]}


def test_two_jobs_compare_their_resolved_specs(runner, root: Path):
    _run(root, ID_A)
    b = _run(root, ID_B)
    spec = json.loads((b / "jobs" / "a" / "spec.json").read_text())
    spec["train"]["devices"] = 4
    spec["slurm"] = {"partition": "big", "time": "01:00:00"}
    (b / "jobs" / "a" / "spec.json").write_text(json.dumps(spec))
    doc = _json(runner, root, ID_A, ID_B, "--job", "a")
    assert doc["a"]["job"] == doc["b"]["job"] == "a"
    assert doc["experiment"] == {"train.devices": [2, 4]}
    assert doc["cluster"] == {"slurm.partition": [None, "big"], "slurm.time": [None, "01:00:00"]}
    assert [r["job"] for r in doc["results"]] == ["a"]
    # Two jobs of one run are two different jobs.
    doc = _json(runner, root, f"{b}:a", f"{b}:b")
    assert doc["results"][0]["job"] == "a | b"


def test_json_shape_is_stable(runner, root: Path):
    _run(root, ID_A)
    _run(root, ID_B)
    doc = _json(runner, root, ID_A, ID_B)
    assert list(doc) == [
        "a",
        "b",
        "not_run",
        "experiment",
        "experiment_defaults",
        "code",
        "packages",
        "cluster",
        "results",
    ]
    assert doc["not_run"] == {"a": None, "b": None}
    assert doc["a"] == {"run": str((root / "exp" / ID_A).resolve()), "run_id": ID_A, "job": None}
    assert set(doc["results"][0]) == {"job", "state", "train_s", "samples_per_s", "test_acc", "best_val_acc", "test_f1"}
    assert doc["results"][0]["state"] == ["COMPLETED", "COMPLETED"]


def test_the_latest_run_of_an_experiment(runner, root: Path):
    _run(root, ID_A)
    _run(root, ID_B, toml=TOML.replace("lr = 0.001", "lr = 0.01"))
    doc = _json(runner, root, ID_A, "exp")
    assert doc["b"]["run_id"] == ID_B and doc["experiment"] == {"train.lr": [0.001, 0.01]}


def test_long_file_diffs_are_capped_with_a_note(runner, root: Path):
    a = _run(root, ID_A, code="".join(f"a{i}\n" for i in range(300)))
    b = _run(root, ID_B, code="".join(f"b{i}\n" for i in range(300)))
    text = _json(runner, root, str(a), str(b))["code"]["files"]["x.py"]
    assert len(text.splitlines()) == 201 and text.endswith("more diff lines not shown")


def test_a_run_with_itself_is_one_line_error(runner, root: Path):
    a = _run(root, ID_A)
    for args in ([str(a), ID_A], [f"{a}:a", f"{ID_A}:a"], [ID_A, ID_A, "--job", "b"]):
        result = _diff(runner, root, *args)
        assert result.exit_code == 1, result.output
        assert "is both A and B" in result.output and len(result.output.strip().splitlines()) == 1


def test_a_job_not_in_the_run(runner, root: Path):
    _run(root, ID_A)
    _run(root, ID_B)
    for args in ([f"{ID_A}:nope", f"{ID_B}:a"], [ID_A, ID_B, "--job", "nope"]):
        result = _diff(runner, root, *args)
        assert result.exit_code == 1
        assert "no job 'nope' in" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "args",
    [[f"{ID_A}:a", ID_B], [f"{ID_A}:a", f"{ID_B}:a", "--job", "a"], [f"{ID_A}:", ID_B]],
    ids=["one-side-a-job", "both-forms", "empty-job"],
)
def test_usage_errors(runner, root: Path, args):
    _run(root, ID_A)
    _run(root, ID_B)
    result = _diff(runner, root, *args)
    assert result.exit_code == 2, result.output


def test_an_unknown_run(runner, root: Path):
    _run(root, ID_A)
    result = _diff(runner, root, ID_A, "nothing")
    assert result.exit_code == 1 and "no run found for 'nothing'" in result.output


def test_damaged_records_are_warnings_not_tracebacks(runner, root: Path):
    a, b = _run(root, ID_A), _run(root, ID_B)
    (b / "jobs" / "a" / "result.json").write_text('{"schema": 1, "times')
    (b / "jobs" / "b" / "spec.json").write_bytes(b"\xff\xfe garbage")
    (b / "experiment.toml").write_text("[train\nepochs = ")
    (a / "code.patch").write_bytes(b"\xff\xfe")
    result = _diff(runner, root, str(a), str(b))
    assert result.exit_code == 0, result.output
    warnings = [ln for ln in result.stderr.splitlines() if ln.startswith("warning:")]
    assert any("jobs/a/result.json" in ln for ln in warnings)
    assert any("jobs/b/spec.json" in ln for ln in warnings)
    assert any("experiment.toml" in ln and "not TOML" in ln for ln in warnings)
    assert any("code.patch" in ln for ln in warnings)
    assert "Traceback" not in result.output
    assert "results (A -> B):" in result.stdout


def test_a_damaged_manifest_is_one_line_error(runner, root: Path):
    a, b = _run(root, ID_A), _run(root, ID_B)
    (b / "manifest.json").write_text("{")
    result = _diff(runner, root, str(a), str(b))
    assert result.exit_code == 1 and "manifest.json" in result.output
    assert "Traceback" not in result.output


def test_the_readme_example_is_what_diff_prints(runner, tmp_path: Path):
    """The runs behind the docs' "Comparing two runs" (docs/guides/diff-rerun-api.md): one key, one code
    line and torch differ."""
    root = tmp_path / "runs"
    toml = '[experiment]\nname = "local_demo"\n\n[train]\nepochs = 2\n'

    def run(run_id: str, toml: str, code: str, **job: object) -> Path:
        folder = write_run(root, "local_demo", [FakeJob("torch_fp32", state="COMPLETED", **job)], run_id=run_id)  # type: ignore[arg-type]
        (folder / "experiment.toml").write_text(toml)
        (folder / "code.patch").write_text("")
        (folder / "code" / "training").mkdir(parents=True)
        (folder / "code" / "training" / "optim.py").write_text(code)
        return folder

    run("20261129-200000-ab12", toml, "WARMUP_STEPS = 100\n")
    b = run("20261130-091500-cd34", toml.replace("2", "3"), "WARMUP_STEPS = 50\n", test_acc=0.89, train_s=151.0)
    result = json.loads((b / "jobs/torch_fp32/result.json").read_text())
    result["versions"]["torch"] = "2.6.0"
    (b / "jobs/torch_fp32/result.json").write_text(json.dumps(result))
    shown = _diff(runner, root, "20261129-200000-ab12", "local_demo").stdout.replace(str(root), "runs")
    page = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "diff-rerun-api.md").read_text()
    block = page.split("    $ jobgen diff 20261129-200000-ab12 local_demo\n", 1)[1].split("\n\n#", 1)[
        0
    ]  # to the next heading
    assert shown.strip() == "\n".join(line[4:] for line in block.splitlines()).strip()


# --- real runs: the resolved experiment ------------------------------------------------------------------
# Made by `jobgen submit` with the local backend and the stand-in entrypoint of test_rerun (a job writes
# its result in a second), by dry runs, and by `jobgen rerun`.

LOCAL = EXP.replace("seed = 5", "seed = 5\nlr = 0.003")


def _submit(runner, root: Path, tmp_path: Path, *extra: str, text: str = LOCAL) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(text)
    result = runner.invoke(main, ["--output-root", str(root), "submit", str(path), *extra])
    assert result.exit_code == 0, result.output
    return max((root / "exp").iterdir(), key=lambda p: (p / "manifest.json").stat().st_mtime_ns)


@pytest.mark.usefixtures("checkout")
def test_one_set_item_is_the_one_experiment_key_that_differs(runner, root: Path, tmp_path: Path):
    a = _submit(runner, root, tmp_path)
    b = _submit(runner, root, tmp_path, "--set", "train.lr=0.001")
    assert (a / "experiment.toml").read_text() == (b / "experiment.toml").read_text()
    doc = _json(runner, root, str(a), str(b))
    assert doc["experiment"] == {"train.lr": [0.003, 0.001]}
    assert doc["not_run"] == {"a": None, "b": None}
    text = _diff(runner, root, str(a), str(b))
    assert "experiment keys: 1 differs\n  train.lr  0.003  ->  0.001\n" in text.stdout
    assert "note:" not in text.stderr
    # A key one side leaves out counts at its default, said so; set to its default, it is no difference.
    c = _submit(runner, root, tmp_path, "--set", "train.warmup_ratio=0.2", "--set", "train.weight_decay=0.01")
    assert "weight_decay" in (c / "experiment.resolved.toml").read_text()
    doc = _json(runner, root, str(a), str(c))
    assert doc["experiment"] == {"train.warmup_ratio": [0.0, 0.2]}
    assert doc["experiment_defaults"] == {"a": ["train.warmup_ratio"], "b": []}
    assert (
        "experiment keys: 1 differs\n  train.warmup_ratio  0.0 (default)  ->  0.2\n"
        in _diff(runner, root, str(a), str(c)).stdout
    )


@pytest.mark.usefixtures("checkout")
def test_one_site_value_is_the_one_experiment_key_that_differs(
    runner, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    sites_file = tmp_path / "sites.toml"
    monkeypatch.setenv("JOBGEN_SITES_FILE", str(sites_file))
    sites_file.write_text('[sites.here.slurm]\npartition = "small"\n')
    a = _submit(runner, root, tmp_path, "--site", "here")
    sites_file.write_text('[sites.here.slurm]\npartition = "big"\n')
    b = _submit(runner, root, tmp_path, "--site", "here")
    doc = _json(runner, root, str(a), str(b))
    assert doc["experiment"] == {"slurm.partition": ["small", "big"]}
    assert doc["cluster"] == {"slurm.partition": ["small", "big"]}  # each job's Slurm resources, as before


@pytest.mark.usefixtures("checkout")
def test_a_rerun_with_one_set_item_differs_by_that_key(runner, root: Path, tmp_path: Path):
    a = _submit(runner, root, tmp_path, "--set", "train.lr=0.001")
    result = runner.invoke(main, ["--output-root", str(root), "rerun", str(a), "exp", "--set", "train.epochs=2"])
    assert result.exit_code == 0, result.output
    b = max((root / "exp").iterdir(), key=lambda p: (p / "manifest.json").stat().st_mtime_ns)
    assert b != a
    doc = _json(runner, root, str(a), str(b))
    assert doc["experiment"] == {"train.epochs": [1, 2]}  # train.lr=0.001 of the first run is on both sides
    assert doc["results"][0]["test_acc"] == [0.51, 0.52]


@pytest.mark.usefixtures("checkout")
def test_a_side_that_has_not_run_says_so_in_one_line(runner, root: Path, tmp_path: Path, bin_dir: Path):
    ran = _submit(runner, root, tmp_path)
    dry = _submit(runner, root, tmp_path, "--dry-run")
    packages = json.loads((ran / "jobs" / "exp" / "result.json").read_text())["ran_on"]["packages"]
    assert len(packages) > 20  # what the old diff listed as "-> (none)", one line each

    text = _diff(runner, root, str(ran), str(dry)).stdout
    assert "packages and hosts: not compared (B has not run: a dry run, none of its jobs ran)\n" in text
    assert "(none)" not in text and "packages:" not in text
    assert "experiment keys: no differences" in text and "cluster and nodes: no differences" in text
    assert "exp: COMPLETED -> DRY_RUN" in text
    doc = _json(runner, root, str(ran), str(dry))
    assert doc["not_run"] == {"a": None, "b": "a dry run, none of its jobs ran"}
    assert doc["packages"] == {} and doc["cluster"] == {} and doc["experiment"] == {}

    # A job Slurm has not started: submitted to a stand-in sbatch, no result yet.
    stub_tool(bin_dir, "sbatch", "echo 4242\n")
    queued = _submit(runner, root, tmp_path, text=LOCAL.replace('backend = "local"', 'backend = "sbatch"'))
    text = _diff(runner, root, f"{ran}:exp", f"{queued}:exp").stdout
    assert "packages and hosts: not compared (B has not run: job exp is SUBMITTED, with no result yet)\n" in text
    assert "(none)" not in text.split("cluster and nodes")[0]
    doc = _json(runner, root, str(ran), str(queued))
    assert doc["not_run"] == {"a": None, "b": "its one job is SUBMITTED, with no result yet"}
    doc = _json(runner, root, f"{queued}:exp", f"{ran}:exp")
    assert doc["not_run"] == {"a": "job exp is SUBMITTED, with no result yet", "b": None}
    assert doc["packages"] == {} and "host" not in doc["cluster"] and "nodelist" not in doc["cluster"]


@pytest.mark.usefixtures("checkout")
def test_a_run_recorded_before_the_resolved_experiment_is_rebuilt_from_its_manifest(runner, root: Path, tmp_path: Path):
    old = _submit(runner, root, tmp_path, "--set", "train.lr=0.001")
    (old / "experiment.resolved.toml").unlink()  # as a run written before runs kept it
    same = _submit(runner, root, tmp_path, "--set", "train.lr=0.001")
    result = _diff(runner, root, str(old), str(same))
    assert result.exit_code == 0, result.output
    assert "experiment keys: no differences" in result.stdout  # its --set item, read from the manifest
    notes = [ln for ln in result.stderr.splitlines() if ln.startswith("note:")]
    assert notes == [
        "note: A was recorded before runs kept experiment.resolved.toml: its experiment keys are its "
        "experiment.toml with the --set items and site values its manifest names"
    ]
    plain = _submit(runner, root, tmp_path)
    assert _json(runner, root, str(old), str(plain))["experiment"] == {"train.lr": [0.001, 0.003]}


def test_the_resolved_experiment_is_what_the_jobs_were_planned_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The file holds experiment.toml + site values + --set items, and reads back as the same tree."""
    sites_file = tmp_path / "sites.toml"
    sites_file.write_text('[sites.here.slurm]\npartition = "small"\naccount = "abc"\n')
    monkeypatch.setenv("JOBGEN_SITES_FILE", str(sites_file))
    path = tmp_path / "exp.toml"
    path.write_text(LOCAL.replace("[train]", '[slurm]\naccount = "mine"\n\n[train]') + SWEEP_GRID)
    prepared = sub.prepare(path, tmp_path / "runs", dry_run=True, sets=["train.lr=0.001"], site="here")
    text = (prepared.run_dir / "experiment.resolved.toml").read_text()
    tree = tomllib.loads(text)
    assert tree["train"]["lr"] == 0.001 and tree["train"]["seed"] == 5
    assert tree["slurm"] == {"account": "mine", "partition": "small"}  # site < file
    assert tree["sweep"] == {"grid": {"train.epochs": [1, 2]}}
    assert tree == load_experiment(path, sets=["train.lr=0.001"], site="here").raw
    assert text.startswith("# What this run's jobs were planned from")


SWEEP_GRID = '\n[sweep.grid]\n"train.epochs" = [1, 2]\n'
_KEYS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)
_SCALARS = (
    st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
)
_VALUES = st.recursive(
    _SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=3), max_leaves=8
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_KEYS, st.dictionaries(_KEYS, _VALUES, max_size=4), max_size=4))
def test_the_toml_writer_gives_back_the_same_tree(tree: dict):
    assert tomllib.loads(resolved.dumps(tree)) == tree
