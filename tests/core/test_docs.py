"""The documentation says what the code does: the README stays one screen long, the generated reference
pages are what the code makes today, and every command example of the getting-started page that runs
without a cluster prints what the page shows."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from jobgen.cli import main
from tests.data.summary.synth import FakeJob, write_run

REPO = Path(__file__).resolve().parents[2]
GETTING_STARTED = REPO / "docs" / "getting-started.md"
RUN_ID = re.compile(r"\b\d{8}-\d{6}-[0-9a-f]{4}\b")


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_one_screen_and_keeps_the_demo_table():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200, "README.md is over 200 lines: move the details into a page of docs/"
    # scripts/update_readme_demo.py pastes the demo's real summary between these markers.
    block = readme.split("<!-- demo-summary:start -->\n", 1)[1].split("<!-- demo-summary:end -->", 1)[0]
    assert "| engine-torch | torch |" in block and "| engine-hf-trainer | hf_trainer |" in block


def test_the_reference_pages_are_what_the_code_makes():
    gen = _gen_docs()
    for path, text in gen.pages().items():
        committed = (REPO / path).read_text(encoding="utf-8") if (REPO / path).exists() else None
        assert committed == text, f"{path} is out of date: run `{gen.COMMAND}` and commit it"


def test_the_reference_pages_name_every_key_and_command():
    from jobgen.experiment.schema import schema_rows

    pages = _gen_docs().pages()
    keys = pages["docs/reference/experiment-keys.md"]
    assert all(f"| `{row[0]}` |" in keys for row in schema_rows())
    commands = pages["docs/reference/commands.md"]
    for name, command in main.commands.items():
        assert f"## `jobgen {name}`" in commands
        for param in command.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("-"):
                    assert opt in commands, (name, opt)


def test_a_stale_reference_page_fails_the_check_with_the_command_to_run(tmp_path, monkeypatch, capsys):
    gen = _gen_docs()
    for path in gen.PAGES:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, tmp_path / path)
    (tmp_path / "docs/reference/experiment-keys.md").write_text("# Experiment keys\n")
    monkeypatch.setattr(gen, "REPO", tmp_path)
    assert gen.main(["--check"]) == 1
    assert "docs/reference/experiment-keys.md" in capsys.readouterr().err
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0


# The runs `status`, `summary`, `logs` and `report` read on the getting-started page: one sweep of
# experiments/imdb_deepspeed.toml that went well, and one where a job failed.
REQUEST = {"nodes": 1, "gpus_per_node": 4, "ntasks_per_node": 4, "cpus_per_task": 8, "time": "02:00:00"}
COMMON = dict(engine="lightning", precision="16-mixed", devices=4, slurm=REQUEST, gpus=["NVIDIA A100-SXM4-80GB"] * 4)
STAGE_2 = dict(
    name="strategy-deepspeed-stage-2",
    sweep={"train.strategy": "deepspeed_stage_2"},
    strategy="deepspeed_stage_2",
    queue_s=95,
    train_s=1312.0,
    total_s=1460.0,
    samples_per_s=106.7,
    peak_gpu_mb=9120.0,
    best_val_acc=0.9288,
    test_acc=0.9301,
    test_f1=0.9305,
    ran_s=1530,
    state="COMPLETED",
)
STAGE_3 = dict(
    name="strategy-deepspeed-stage-3",
    sweep={"train.strategy": "deepspeed_stage_3"},
    strategy="deepspeed_stage_3",
    queue_s=140,
    train_s=1688.0,
    total_s=1850.0,
    samples_per_s=82.9,
    peak_gpu_mb=6480.0,
    best_val_acc=0.9274,
    test_acc=0.9296,
    test_f1=0.9290,
    ran_s=1925,
    state="COMPLETED",
)
FAILED_LOG = (
    "0: training: data for strategy-deepspeed-stage-3 ready: train 35000, validation 5000, test 10000 (from the cache)\n"
    "0: training: starting the lightning engine, 41 s so far\n"
    "0: training: epoch 1/3 9% step 50/547 loss 0.5123 (mean of 50 batches) samples/s 81.6 (timing window so far)\n"
    "0: [rank0]:[E1202 10:20:44 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds "
    "before timing out.\n"
    "srun: error: gpu012: task 0: Exited with exit code 1\n"
)
RECORDED = {
    "sweep": [("20261201-093015-5c1e", [FakeJob(**STAGE_2, **COMMON), FakeJob(**STAGE_3, **COMMON)])],
    "failed": [
        (
            "20261202-101500-9d2f",
            [
                FakeJob(**STAGE_2, **COMMON),
                FakeJob(
                    **{
                        **STAGE_3,
                        "ran_s": 320,
                        "state": "FAILED",
                        "result": None,
                        "logs": {"slurm-4001.out": FAILED_LOG},
                    },
                    **COMMON,
                ),
            ],
        )
    ],
}


def examples(text: str) -> list[tuple[str, str]]:
    """(what the marker says, the console block) of every `<!-- checked... -->` block of a page."""
    return re.findall(r"<!-- checked(?:: (\S+))? -->\n```console\n(.*?)```\n", text, re.S)


def _steps(block: str) -> list[tuple[str, str]]:
    """The block's commands (`$ ` lines) with the output shown under each."""
    steps: list[tuple[str, str]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], ""))
        else:
            assert steps, f"output before the first command: {line!r}"
            steps[-1] = (steps[-1][0], steps[-1][1] + line + "\n")
    return steps


def _normalized(text: str, home: Path) -> str:
    return RUN_ID.sub("<run id>", text.replace(str(home), "/home/me")).strip()


def test_the_getting_started_examples_print_what_the_page_shows(tmp_path: Path, runner, monkeypatch):
    found = examples(GETTING_STARTED.read_text(encoding="utf-8"))
    assert len(found) >= 6, "the markers of the checked examples are gone from docs/getting-started.md"
    for n, (marker, block) in enumerate(found):
        home = tmp_path / f"example-{n}"
        checkout = home / "jobgen"
        shutil.copytree(REPO / "experiments", checkout / "experiments")
        if marker:
            for run_id, jobs in RECORDED[marker.removeprefix("recorded=")]:
                write_run(checkout / "runs", "imdb_deepspeed", jobs, run_id=run_id)
        monkeypatch.chdir(checkout)
        for command, shown in _steps(block):
            argv = shlex.split(command)
            assert argv[0] == "jobgen", command
            result = runner.invoke(main, argv[1:])
            assert result.exception is None or isinstance(result.exception, SystemExit), result.output
            assert _normalized(result.output, home) == _normalized(shown, home), f"$ {command}\n{result.output}"


def test_the_checked_examples_cover_the_commands_that_need_no_cluster():
    commands = [cmd for _, block in examples(GETTING_STARTED.read_text()) for cmd, _ in _steps(block)]
    for verb in ("validate", "submit", "status", "summary", "logs", "report"):
        assert any(cmd.split()[1] == verb for cmd in commands), verb
    assert any("--dry-run" in cmd for cmd in commands)


@pytest.mark.parametrize("broken", ["output", "command"])
def test_the_example_check_fails_when_a_page_is_wrong(tmp_path: Path, runner, monkeypatch, broken: str):
    """The check above is worth something only if a changed output or a failing command fails it."""
    page = GETTING_STARTED.read_text(encoding="utf-8")
    if broken == "output":
        page = page.replace(
            "ok: experiments/imdb_deepspeed.toml (2 jobs)", "ok: experiments/imdb_deepspeed.toml (3 jobs)"
        )
    else:
        page = page.replace("$ jobgen validate experiments/imdb_deepspeed.toml\n", "$ jobgen validate nothing.toml\n")
    monkeypatch.setattr(f"{__name__}.GETTING_STARTED", tmp_path / "page.md")
    (tmp_path / "page.md").write_text(page)
    with pytest.raises(AssertionError):
        test_the_getting_started_examples_print_what_the_page_shows(tmp_path / "t", runner, monkeypatch)


def _build(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(root / "site")],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )


def test_the_strict_build_refuses_a_broken_link_and_a_page_outside_the_navigation(tmp_path: Path):
    """scripts/test.sh counts on `mkdocs build --strict` (without --quiet, which hides the warnings it
    counts) to fail on these; the site as committed builds."""
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    assert _build(tmp_path).returncode == 0
    (tmp_path / "docs" / "stray.md").write_text("# A page nobody links to\n")
    page = tmp_path / "docs" / "getting-started.md"
    page.write_text(page.read_text().replace("(guides/sites.md)", "(guides/site.md)", 1))
    anchor = tmp_path / "docs" / "guides" / "sweeps.md"
    anchor.write_text(anchor.read_text() + "\n[gone](../contracts.md#no-such-heading)\n")
    built = _build(tmp_path)
    assert built.returncode == 1
    for named in ("stray.md", "guides/site.md", "#no-such-heading"):
        assert named in built.stderr, (named, built.stderr)
