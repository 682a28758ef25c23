"""Damaged records, as a table: each file a run holds x each kind of damage x each command that reads a
run. The command names the damaged file in one line, reports the other jobs as usual, and never shows a
traceback; a damaged manifest is an error that names it (and `runs`, `summary` list the other runs)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import stat
from pathlib import Path

import pytest

from jobgen.cli import main

RESULT = {
    "schema": 1,
    "job": "x",
    "engine": "torch",
    "times_s": {"train": 10.0, "total": 12.0},
    "test_acc": 0.9,
    "best_val_acc": 0.9,
    "finished_at": "2026-11-29T20:00:00+00:00",
}
METRICS = "epoch,step,split,loss,acc,f1,lr,samples_per_s,time_s\n0,10,validation,0.5,0.8,,,,\n"
PROGRESS = {"epoch": 0, "epochs": 1, "batch": 3, "batches": 4, "step": 3}
DAMAGE = {
    "empty": lambda good: b"",
    "truncated": lambda good: good[: len(good) // 2],
    "garbage": lambda good: b"\xff\xfe\x00garbage\x9c" * 3,
    "wrong type": lambda good: b"[1, 2]\n" if good.lstrip().startswith(b"{") else b"a;b\n1\n",
    "unknown schema": lambda good: json.dumps({**json.loads(good), "schema": 99}).encode(),
}
JOB_FILES = ["spec.json", "result.json", "progress.json", "metrics.csv", "retries.json"]
RETRIES = {"schema": 1, "retries": 1, "limit": 2, "excluded": ["n1"], "stopped": None}
COMMANDS = {
    "status": ["status", "{run}"],
    "logs": ["logs", "{run}", "hurt"],
    "summary": ["summary", "{run}"],
    "requeue": ["requeue", "{run}"],
    "clean": ["clean", "{run}"],
    "runs": ["runs"],
}
# What each command shows of the jobs it did not lose: `runs` counts them, `logs` shows one job's log.
OTHERS = {
    "status": ["fine", "broken"],
    "logs": ["hello from hurt"],
    "summary": ["fine", "broken"],
    "requeue": ["broken"],
    "clean": ["jobs/fine/checkpoints"],
    "runs": ["3 "],
}
STUB_SCONTROL = '#!/bin/bash\n[ "$1" = requeue ] && exit 0\necho "slurm_load_jobs error: Invalid job id" >&2\nexit 1\n'


def _job(run: Path, name: str, index: int, state: str, result: bool) -> dict:
    folder = run / "jobs" / name
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"x" * 1000)
    spec = {"schema": 1, "job": name, "train": {"engine": "torch"}, "requeue": {"enabled": False}}
    (folder / "spec.json").write_text(json.dumps(spec))
    (folder / "progress.json").write_text(json.dumps(PROGRESS))
    (folder / "metrics.csv").write_text(METRICS)
    (folder / "retries.json").write_text(json.dumps(RETRIES))
    (folder / f"slurm-{100 + index}.out").write_text(f"0: hello from {name}\n")
    (folder / "job.sbatch").write_text("#!/bin/bash\n")
    if result:
        (folder / "result.json").write_text(json.dumps({**RESULT, "job": name}))
    return {
        "name": name,
        "index": index,
        "sweep": {},
        "dir": f"jobs/{name}",
        "spec": f"jobs/{name}/spec.json",
        "script": f"jobs/{name}/job.sbatch",
        "submit_command": ["sbatch", "--parsable", "x"],
        "job_id": str(100 + index),
        "array_index": None,
        "submitted_at": "2026-11-29T20:00:00+00:00",
        "state": state,
        "error": None,
    }


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run of three jobs: `hurt` (completed; its records get damaged), `fine` (completed, with checkpoints
    to clean) and `broken` (failed: requeue picks it). Slurm has forgotten them all (stub tools)."""
    run = tmp_path / "runs" / "exp" / "20261129-201500-ab12"
    jobs = [
        _job(run, "hurt", 0, "COMPLETED", True),
        _job(run, "fine", 1, "COMPLETED", True),
        _job(run, "broken", 2, "FAILED", False),
    ]
    manifest = {
        "schema": 1,
        "run_id": run.name,
        "experiment": "exp",
        "experiment_file": "/x/exp.toml",
        "backend": "sbatch",
        "dry_run": False,
        "created": "2026-11-29T20:15:00+00:00",
        "jobs": jobs,
    }
    (run / "manifest.json").write_text(json.dumps(manifest, indent=2))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, text in {
        "scontrol": STUB_SCONTROL,
        "sacct": "#!/bin/bash\nexit 1\n",
        "squeue": "#!/bin/bash\nexit 1\n",
    }.items():
        (bin_dir / tool).write_text(text)
        (bin_dir / tool).chmod(0o755 | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return run


def _invoke(runner, run: Path, command: str):
    args = [a.format(run=run) for a in COMMANDS[command]]
    result = runner.invoke(main, ["--output-root", str(run.parent.parent), *args])
    assert "Traceback" not in result.output and "rerun with --debug" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


# Only spec.json, result.json and retries.json carry a schema version.
CASES = [
    (name, damage)
    for name in JOB_FILES
    for damage in DAMAGE
    if damage != "unknown schema" or name in ("spec.json", "result.json", "retries.json")
]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("name", "damage"), CASES)
def test_damaged_job_file(runner, run: Path, name: str, damage: str, command: str):
    path = run / "jobs" / "hurt" / name
    path.write_bytes(DAMAGE[damage](path.read_bytes()))
    result = _invoke(runner, run, command)
    assert result.exit_code == 0, result.output
    for other in OTHERS[command]:
        assert other in result.output, result.output
    if command != "runs":  # `runs` reads manifests only
        warnings = [line for line in result.output.splitlines() if line.startswith("warning: ")]
        assert [w for w in warnings if f"jobs/hurt/{name}: " in w], result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_job_folder_deleted(runner, run: Path, command: str):
    import shutil

    shutil.rmtree(run / "jobs" / "hurt")
    result = _invoke(runner, run, command)
    if command == "logs":  # the one job asked for has no log left: said in one line
        assert result.exit_code == 1 and "jobs/hurt" in result.output.strip().splitlines()[-1], result.output
        return
    assert result.exit_code == 0, result.output
    for other in OTHERS[command]:
        assert other in result.output, result.output
    if command != "runs":
        assert "warning: " in result.output and "jobs/hurt/: the job's folder is missing" in result.output


MANIFEST_DAMAGE = {
    **DAMAGE,
    "wrong shape": lambda good: b'{"schema": 1, "backend": "sbatch", "jobs": "x"}',
    "path outside the run": lambda good: good.replace(b'"jobs/hurt"', b'"../../../etc"'),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("damage", MANIFEST_DAMAGE)
def test_damaged_manifest(runner, run: Path, tmp_path: Path, damage: str, command: str):
    path = run / "manifest.json"
    good = path.read_bytes()
    # A second, intact run of the same experiment (older): `runs` and `summary --all-runs` still list it.
    older = run.parent / "20261128-000000-0000"
    older.mkdir()
    (older / "manifest.json").write_bytes(good.replace(run.name.encode(), older.name.encode()))
    path.write_bytes(MANIFEST_DAMAGE[damage](good))
    result = _invoke(runner, run, command)
    if command in ("runs", "summary"):
        assert result.exit_code == 0, result.output
        assert "manifest.json" in result.output and older.name in result.output or command == "summary"
        assert "manifest.json" in result.output
        return
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith("Error: ") and str(path) in lines[0] and "damaged" in lines[0], lines[0]


# --- what the run's index keeps of the damage checks (jobgen.record.index) ---------------------------------------


def _settle(run: Path) -> None:
    """Every job file as if written a minute ago: old enough for its verdict to be kept."""
    import os
    import time

    for path in (run / "jobs").rglob("*"):
        if path.is_file():
            os.utime(path, (time.time() - 60, time.time() - 60))


def _warnings(runner, run: Path) -> list[str]:
    return [ln for ln in _invoke(runner, run, "status").stderr.splitlines() if ln.startswith("warning:")]


def test_a_second_status_checks_no_job_file_again_and_still_sees_each_change(runner, run: Path, monkeypatch) -> None:
    import os

    from jobgen.record import model

    hurt = run / "jobs" / "hurt" / "result.json"
    hurt.write_bytes(DAMAGE["truncated"](hurt.read_bytes()))
    _settle(run)
    first = _warnings(runner, run)
    assert len(first) == 1 and "hurt/result.json: truncated" in first[0], first
    assert (run / "index.sqlite").is_file()

    def no_checking(*_a, **_k):
        raise AssertionError("a settled job file was checked again")

    with monkeypatch.context() as m:  # nothing changed: every verdict comes from the cache
        m.setattr(model, "json_problem", no_checking)
        m.setattr(model, "metrics_problem", no_checking)
        assert _warnings(runner, run) == first

    # Repaired the way jobs write (a new file put in place): the old verdict is not used.
    fixed = hurt.with_suffix(".tmp")
    fixed.write_text(json.dumps({**RESULT, "job": "hurt"}))
    os.replace(fixed, hurt)
    _settle(run)
    assert _warnings(runner, run) == []
    # Damaged in place, same size, one second later: mtime and ctime differ, so it is checked again.
    good = (run / "jobs" / "fine" / "spec.json").read_bytes()
    (run / "jobs" / "fine" / "spec.json").write_bytes(b"\xff" * len(good))
    _settle(run)
    assert any("fine/spec.json: not UTF-8" in ln for ln in _warnings(runner, run))


def test_a_file_that_just_changed_is_checked_again_next_time(runner, run: Path) -> None:
    """Written a moment ago, a file's stamp may not show the next rewrite (1 s timestamps): no verdict kept."""
    _settle(run)
    (run / "jobs" / "hurt" / "progress.json").write_text(json.dumps(PROGRESS))  # now
    assert _warnings(runner, run) == []
    with contextlib.closing(sqlite3.connect(run / "index.sqlite")) as db:
        kept = {record for (record,) in db.execute("SELECT record FROM facts")}
    assert "jobs/hurt/progress.json" not in kept and "jobs/hurt/spec.json" in kept


@pytest.mark.parametrize("index", [b"", b"{not json", b"SQLite format 3\x00" + b"\x01" * 200])
def test_a_damaged_index_is_ignored(runner, run: Path, index: bytes) -> None:
    hurt = run / "jobs" / "hurt" / "result.json"
    hurt.write_bytes(b"")
    (run / "index.sqlite").write_bytes(index)
    assert any("hurt/result.json: empty" in ln for ln in _warnings(runner, run))


def test_an_index_that_cannot_be_written_keeps_nothing(runner, run: Path) -> None:
    """A run folder that takes no new file (read-only, full disk): the command works as without an index."""
    (run / "index.sqlite").mkdir()  # neither opened nor replaced, as in a read-only folder
    hurt = run / "jobs" / "hurt" / "result.json"
    hurt.write_bytes(b"")
    _settle(run)
    for _ in range(2):
        assert [ln for ln in _warnings(runner, run) if "hurt/result.json: empty" in ln]
    assert not list(run.glob("index.sqlite.*.tmp")) and (run / "index.sqlite").is_dir()


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 65535, 65536, 65537, 3 * 1024 * 1024 + 7])
def test_a_record_is_read_whole_with_the_stamp_of_the_version_read(tmp_path: Path, size: int) -> None:
    """The read of a job's record (jobgen.record.model.read_with_stamp) gives every byte, at sizes around
    a page and past one read, and the stat stamp of that version."""
    import os

    from jobgen.record.index import stamp
    from jobgen.record.model import read_with_stamp

    path = tmp_path / "result.json"
    data = bytes(i % 251 for i in range(size))
    path.write_bytes(data)
    got, mark = read_with_stamp(str(path))
    assert got == data and mark == stamp(os.stat(path))
    with pytest.raises(FileNotFoundError):
        read_with_stamp(str(tmp_path / "absent.json"))
    with pytest.raises(IsADirectoryError):
        read_with_stamp(str(tmp_path))
