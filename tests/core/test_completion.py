"""Shell completion through Click's own mechanism, as the shell calls it: the real `jobgen` entry point
with _JOBGEN_COMPLETE and COMP_WORDS/COMP_CWORD set (bash), in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from jobgen.cli import main
from tests.data.summary.synth import FakeJob, write_run

REPO = Path(__file__).resolve().parents[2]


def _complete(words: str, cwd: Path, root: Path | None = None) -> list[tuple[str, str]]:
    """(type, value) pairs that bash would be offered for the last word of `words`."""
    env = {
        **os.environ,
        "_JOBGEN_COMPLETE": "bash_complete",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split(" ")) - 1),
        "PYTHONPATH": str(REPO),
    }
    if root is not None:
        env["JOBGEN_OUTPUT_ROOT"] = str(root)
    code = "import sys; from jobgen.cli import main; sys.argv[0] = 'jobgen'; main()"
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return [tuple(line.split(",", 1)) for line in done.stdout.splitlines()]


def test_commands_complete(tmp_path: Path) -> None:
    offered = _complete("jobgen re", tmp_path)
    assert [v for _, v in offered] == ["report", "requeue", "rerun"]


def test_experiment_files_complete(tmp_path: Path) -> None:
    (tmp_path / "experiments").mkdir()
    for name in ("imdb_ddp.toml", "imdb_fsdp.toml", "notes.txt"):
        (tmp_path / "experiments" / name).write_text("")
    offered = _complete("jobgen submit experiments/imdb", tmp_path)
    assert offered == [("plain", "experiments/imdb_ddp.toml"), ("plain", "experiments/imdb_fsdp.toml")]
    assert ("plain", "experiments/") in _complete("jobgen validate exp", tmp_path)


def test_run_ids_and_experiment_names_complete(tmp_path: Path, runner) -> None:
    root = tmp_path / "runs"
    write_run(root, "sweep", [FakeJob("a")], run_id="20261201-000000-ab12")
    write_run(root, "sweep", [FakeJob("a")], run_id="20261201-010000-cd34")
    write_run(root, "other", [FakeJob("b")], run_id="20261130-000000-ef56")
    values = [v for _, v in _complete("jobgen status ", tmp_path, root)]
    assert values == ["other", "sweep", "20261201-010000-cd34", "20261201-000000-ab12", "20261130-000000-ef56"]
    assert [v for _, v in _complete("jobgen summary sweep 202612", tmp_path, root)] == [
        "20261201-010000-cd34",
        "20261201-000000-ab12",
    ]
    # What completion offers, the commands take: a bare run id names its run.
    done = runner.invoke(main, ["--output-root", str(root), "status", "20261201-000000-ab12"])
    assert done.exit_code == 0 and "sweep/20261201-000000-ab12" in done.output, done.output
    # What `jobgen runs` lists, the commands take too, from any folder: EXPERIMENT/RUN_ID under the root.
    listed = runner.invoke(main, ["--output-root", str(root), "runs"])
    assert "sweep/20261201-000000-ab12" in listed.output, listed.output
    done = runner.invoke(main, ["--output-root", str(root), "status", "sweep/20261201-000000-ab12"])
    assert done.exit_code == 0 and "run: " + str(root / "sweep" / "20261201-000000-ab12") in done.output, done.output
    done = runner.invoke(main, ["--output-root", str(root), "status", "sweep/20261201-000000-zz99"])
    assert done.exit_code != 0 and "no run found for 'sweep/20261201-000000-zz99'" in done.output, done.output
