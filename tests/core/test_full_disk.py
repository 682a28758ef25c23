"""A full disk or an unwritable output root: a one-line error, no half-written run, nothing submitted, and
a job queued just before the disk filled is not lost. Each test mounts its own small tmpfs (needs root)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobgen.cli import main
from jobgen.record.store import compact, load_manifest

EXP = '[experiment]\nname = "full"\n[data]\ndataset = "imdb"\n[sweep.grid]\n"train.seed" = [1, 2]\n'
# sbatch queues the job (id|comment, as squeue shows it); once $FILL is set it fills the disk after,
# once $READ_ONLY is set it makes that file system read-only after (no write at all succeeds then).
SBATCH = """#!/bin/bash
n=$(( $(cat "$STATE/calls" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$STATE/calls"
echo "$(( 1000 + n ))|$(sed -n 's/^#SBATCH --comment=//p' "${@: -1}")" >> "$STATE/queue"
if [ -n "$FILL" ]; then cat /dev/zero > "$FILL/filler" 2>/dev/null; fi
if [ -n "$READ_ONLY" ]; then mount -o remount,ro "$READ_ONLY"; fi
echo "$(( 1000 + n ))"
"""
SQUEUE = '#!/bin/bash\ncat "$STATE/queue" 2>/dev/null\n'


def _can_mount() -> str | None:
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    return None


@pytest.fixture
def mount(tmp_path: Path) -> Iterator:
    reason = _can_mount()
    if reason:
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(f"CI=true: {reason}")
        pytest.skip(reason)
    mounted: list[Path] = []

    def make(name: str, options: str) -> Path:
        point = tmp_path / name
        point.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "jobgen-test", str(point)], check=True)
        mounted.append(point)
        return point

    yield make
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, text in {"sbatch": SBATCH, "squeue": SQUEUE}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755 | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("STATE", str(state))
    (tmp_path / "full.toml").write_text(EXP)
    return state


def _one_line_error(result, skip: int = 0) -> str:
    lines = result.output.strip().splitlines()[skip:]
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output and "rerun with --debug" not in lines[0], result.output
    return lines[0]


@pytest.mark.parametrize(("options", "words"), [("size=48k", "No space left"), ("ro,size=1m", "Read-only")])
def test_no_room_for_the_run(runner, tmp_path: Path, mount, slurm: Path, options: str, words: str):
    root = mount("small", options)
    result = runner.invoke(main, ["--output-root", str(root / "runs"), "submit", str(tmp_path / "full.toml")])
    line = _one_line_error(result)
    assert words in line and "output-root" in line, line
    assert list(root.rglob("*")) in ([], [root / "runs"]), list(root.rglob("*"))  # no half run, no hidden one
    assert not (slurm / "calls").exists()  # nothing submitted


def _dry_then_clear(runner, tmp_path: Path, runs: Path) -> None:
    # A dry run first, so the lazy imports and caches are warm; then the disk starts empty of runs.
    result = runner.invoke(main, ["--output-root", str(runs), "submit", str(tmp_path / "full.toml"), "--dry-run"])
    assert result.exit_code == 0, result.output
    for run in list((runs / "full").iterdir()):
        subprocess.run(["rm", "-rf", str(run)], check=True)


def test_disk_fills_after_a_job_is_queued(runner, tmp_path: Path, mount, slurm: Path, monkeypatch):
    """Each job's record is one short line appended to the run's journal: it still fits once the disk
    is full, so no job is lost, none is submitted twice, and the run reads whole."""
    root = mount("small", "size=2m")
    runs = root / "runs"
    _dry_then_clear(runner, tmp_path, runs)
    monkeypatch.setenv("FILL", str(root))
    result = runner.invoke(main, ["--output-root", str(runs), "submit", str(tmp_path / "full.toml")])
    (run_dir,) = (runs / "full").iterdir()
    assert result.exit_code == 0, result.output
    jobs = load_manifest(run_dir)["jobs"]  # manifest.json could not be rewritten: its journal says the rest
    assert [j["job_id"] for j in jobs] == ["1001", "1002"]
    assert (slurm / "calls").read_text().strip() == "2"
    # The disk was full indeed: manifest.json itself could not be rewritten.
    assert [j["job_id"] for j in json.loads((run_dir / "manifest.json").read_text())["jobs"]] == [None, None]
    (root / "filler").unlink()
    monkeypatch.delenv("FILL")
    compact(run_dir)  # once there is room, the journal folds into manifest.json
    assert [j["job_id"] for j in json.loads((run_dir / "manifest.json").read_text())["jobs"]] == ["1001", "1002"]


def test_no_write_succeeds_after_a_job_is_queued(runner, tmp_path: Path, mount, slurm: Path, monkeypatch):
    root = mount("small", "size=2m")
    runs = root / "runs"
    _dry_then_clear(runner, tmp_path, runs)
    monkeypatch.setenv("READ_ONLY", str(root))
    result = runner.invoke(main, ["--output-root", str(runs), "submit", str(tmp_path / "full.toml")])
    (run_dir,) = (runs / "full").iterdir()
    assert result.output.startswith(f"run: {run_dir}\n"), result.output  # said first, then the one-line error
    line = _one_line_error(result, skip=1)
    assert "Read-only" in line and ".journal-" in line and f"submit --resume {run_dir}" in line, line
    jobs = load_manifest(run_dir)["jobs"]  # still whole
    assert jobs[0]["job_id"] is None and jobs[0]["submit_tried_at"], jobs[0]  # queued, not recorded

    subprocess.run(["mount", "-o", "remount,rw", str(root)], check=True)
    monkeypatch.delenv("READ_ONLY")
    result = runner.invoke(main, ["--output-root", str(runs), "submit", "--resume", str(run_dir)])
    assert result.exit_code == 0, result.output
    jobs = json.loads((run_dir / "manifest.json").read_text())["jobs"]  # compacted at the end of the submission
    assert [j["job_id"] for j in jobs] == ["1001", "1002"] and jobs[0]["found_on_cluster"]
    assert (slurm / "calls").read_text().strip() == "2"  # the first job was not submitted twice
