"""Dry runs (`--dry-run`, `--test-only`) are listed, but never stand for an experiment's results: an
experiment name (or no name) means its latest submitted run, and --all-runs leaves dry runs out."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from jobgen.cli import main
from jobgen.record.lookup import every_run_of, find_runs, latest_real
from tests.data.summary.synth import FakeJob, write_run

REAL_ID, DRY_ID, LATER_DRY_ID = "20261129-200000-aaaa", "20261129-210000-bbbb", "20261129-220000-cccc"


def _dry(root: Path, run_id: str, experiment: str = "exp") -> Path:
    """A run as `submit --dry-run` leaves it: dry_run set, every job DRY_RUN, nothing queued."""
    run_dir = write_run(root, experiment, [FakeJob("j", state="DRY_RUN", submitted_s=None, result=None)], run_id)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (run_dir / "manifest.json").write_text(json.dumps({**manifest, "dry_run": True}))
    return run_dir


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A real run with a completed job, then two dry runs after it."""
    real = write_run(tmp_path, "exp", [FakeJob("j", state="COMPLETED", logs={"slurm-1.out": "0: trained\n"})], REAL_ID)
    return real, _dry(tmp_path, DRY_ID), _dry(tmp_path, LATER_DRY_ID)


def test_the_latest_run_of_an_experiment_is_its_latest_real_one(tmp_path: Path, runs):
    real, dry, later = runs
    assert find_runs(["exp"], tmp_path) == [real.resolve()]
    assert find_runs([], tmp_path) == [real.resolve()]
    assert latest_real([real, dry, later]) == real


def test_a_dry_run_named_by_its_folder_or_id_is_read(tmp_path: Path, runs):
    _, dry, _ = runs
    assert find_runs([str(dry)], tmp_path) == [dry.resolve()]
    assert find_runs([DRY_ID], tmp_path) == [dry.resolve()]


def test_all_runs_leaves_dry_runs_out_unless_named(tmp_path: Path, runs):
    real, dry, later = runs
    assert every_run_of([real.resolve()]) == [real.resolve()]
    assert every_run_of([dry.resolve()]) == [real.resolve(), dry.resolve()]


@pytest.mark.parametrize(
    "argv",
    [["summary", "exp"], ["summary"], ["status", "exp"], ["status"], ["logs", "exp", "j"], ["logs"]],
    ids=lambda a: "-".join(a),
)
def test_every_command_that_wants_results_skips_dry_runs(runner, tmp_path: Path, runs, argv: list[str]):
    result = runner.invoke(main, ["--output-root", str(tmp_path), *argv])
    assert result.exit_code == 0, result.output
    assert "DRY_RUN" not in result.output
    assert argv[0] != "status" or REAL_ID in result.output
    assert argv[0] != "logs" or "trained" in result.output


def test_summary_all_runs_does_not_average_dry_jobs_with_real_ones(runner, tmp_path: Path, runs):
    result = runner.invoke(main, ["--output-root", str(tmp_path), "summary", "exp", "--all-runs", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert "DRY_RUN" not in result.output and '"n": 2' not in result.output


def test_runs_lists_dry_runs_too(runner, tmp_path: Path, runs):
    result = runner.invoke(main, ["--output-root", str(tmp_path), "runs"])
    assert all(run_id in result.output for run_id in (REAL_ID, DRY_ID, LATER_DRY_ID)), result.output


@pytest.mark.parametrize("argv", [["summary", "exp"], ["summary"], ["requeue", "exp"], ["logs", "exp"]])
def test_an_experiment_with_only_dry_runs_says_so(runner, tmp_path: Path, argv: list[str]):
    dry = _dry(tmp_path, DRY_ID)
    result = runner.invoke(main, ["--output-root", str(tmp_path), *argv])
    assert result.exit_code == 1, result.output
    (line,) = result.output.strip().splitlines()
    assert "only dry runs" in line and "Traceback" not in line
    assert argv == ["summary"] or str(dry) in line


class _Clock:
    """datetime.datetime for jobgen.record.store, stopped at one moment until `sleep` moves it on."""

    moment = __import__("datetime").datetime(2026, 12, 2, 6, 8, 44, 500000)

    @classmethod
    def now(cls):
        return cls.moment

    @classmethod
    def sleep(cls, seconds: float) -> None:
        cls.moment += __import__("datetime").timedelta(seconds=seconds)


def test_runs_made_in_one_second_sort_in_the_order_they_were_made(tmp_path: Path, monkeypatch):
    """`jobgen status exp` reads the last run by id: a rerun submitted in the same second as its run
    (scripts do that) must sort after it, whatever the random digits draw."""
    from jobgen.record import store

    monkeypatch.setattr(store.dt, "datetime", _Clock)
    monkeypatch.setattr(store.time, "sleep", _Clock.sleep)
    made = []
    for i in range(300):  # two experiments in turn: `jobgen status` (no name) reads the last of all
        run_id = store.new_run_id(tmp_path)
        assert store.reserve_run(tmp_path, f"exp{i % 2}", run_id), run_id
        made.append(run_id)
    assert {m[:15] for m in made} == {"20261202-060844"} and sorted(made) == made
    (tmp_path / "exp1" / made[-1]).rename(tmp_path / "exp1" / "20261202-060844-ffff")  # this second is spent
    assert store.new_run_id(tmp_path).startswith("20261202-060845-")


# --- the kind kept in the index: naming an experiment parses no settled manifest twice ---------------------------------------


def _count_parses(monkeypatch) -> list[bytes]:
    """Each manifest run_kind parses, from now on (its bytes)."""
    from jobgen.record import store

    parsed: list[bytes] = []
    real_kind = store._kind

    def counting(raw: bytes) -> str:
        parsed.append(raw)
        return real_kind(raw)

    monkeypatch.setattr(store, "_kind", counting)
    return parsed


def _settle(*run_dirs: Path) -> None:
    """Each run's manifest as written a minute ago: old enough for the index to keep what it says."""
    for run_dir in run_dirs:
        os.utime(run_dir / "manifest.json", (time.time() - 60, time.time() - 60))


def test_a_runs_kind_is_kept_in_its_index_by_the_manifests_stamp(tmp_path: Path, runs, monkeypatch):
    from jobgen.record.index import INDEX
    from jobgen.record.store import run_kind

    real, dry, _ = runs
    _settle(real, dry)
    parsed = _count_parses(monkeypatch)
    assert (run_kind(real), run_kind(dry)) == ("", "dry") and len(parsed) == 2
    assert (run_kind(real), run_kind(dry)) == ("", "dry") and len(parsed) == 2  # kept: nothing parsed
    assert (dry / INDEX).is_file()
    # Another manifest in its place (a real run's bytes under the dry run's folder): parsed again.
    (dry / "manifest.json").write_bytes((real / "manifest.json").read_bytes())
    _settle(dry)
    assert run_kind(dry) == "" and len(parsed) == 3
    assert run_kind(dry) == "" and len(parsed) == 3


def test_a_manifest_written_a_moment_ago_is_parsed_until_it_settles(tmp_path: Path, runs, monkeypatch):
    """A rewrite within one tick of a coarse clock could keep the stamp: a fresh manifest's kind is not kept."""
    from jobgen.record.store import run_kind

    _, dry, _ = runs
    os.utime(dry / "manifest.json")
    parsed = _count_parses(monkeypatch)
    assert run_kind(dry) == "dry" and run_kind(dry) == "dry" and len(parsed) == 2
    _settle(dry)
    assert run_kind(dry) == "dry" and run_kind(dry) == "dry" and len(parsed) == 3


@pytest.mark.parametrize("damage", ["deleted", "empty", "cut-short", "garbage", "a-folder"])
def test_a_damaged_index_costs_a_parse_never_a_wrong_kind(tmp_path: Path, runs, monkeypatch, damage):
    from jobgen.record.index import INDEX
    from jobgen.record.store import run_kind

    real, dry, _ = runs
    _settle(real, dry)
    assert run_kind(dry) == "dry" and run_kind(real) == ""
    index = dry / INDEX
    raw = index.read_bytes()
    index.unlink()
    if damage == "empty":
        index.write_bytes(b"")
    elif damage == "cut-short":
        index.write_bytes(raw[: len(raw) // 2])
    elif damage == "garbage":
        index.write_bytes(random.Random(7).randbytes(len(raw)))
    elif damage == "a-folder":
        index.mkdir()  # nothing can be written in its place
    parsed = _count_parses(monkeypatch)
    assert run_kind(dry) == "dry" and len(parsed) == 1
    if damage == "a-folder":
        assert run_kind(dry) == "dry" and len(parsed) == 2
        assert sorted(p.name for p in dry.iterdir()) == [INDEX, "jobs", "manifest.json"]  # no temp left
    else:
        assert run_kind(dry) == "dry" and len(parsed) == 1  # written again, sound
    # Another run's index in its place: its stamps are another manifest's, nothing of it is taken.
    (dry / INDEX).unlink() if (dry / INDEX).is_file() else (dry / INDEX).rmdir()
    (dry / INDEX).write_bytes((real / INDEX).read_bytes())
    assert run_kind(dry) == "dry" and run_kind(real) == ""


def test_a_damaged_manifest_is_a_submitted_run_kept_or_not(tmp_path: Path, runs, monkeypatch):
    from jobgen.record.store import run_kind

    _, dry, _ = runs
    (dry / "manifest.json").write_text('{"schema": 1, "dry_run": true, "jobs": [')  # cut short
    assert run_kind(dry) == "" and run_kind(dry) == ""
    assert find_runs(["exp"], tmp_path) == [dry.resolve()]  # the latest: its reader names the damage


def test_the_latest_run_is_found_asking_the_newest_runs_only(tmp_path: Path, runs, monkeypatch):
    """An experiment's older runs (thousands of jobs each) are not asked their kind: the newest real
    run ends the search."""
    real, dry, later = runs
    newer = write_run(tmp_path, "exp", [FakeJob("j", state="COMPLETED")], "20261129-230000-dddd")
    _settle(real, dry, later, newer)
    parsed = _count_parses(monkeypatch)
    assert find_runs(["exp"], tmp_path) == [newer.resolve()] and len(parsed) == 1
    assert find_runs([], tmp_path) == [newer.resolve()] and len(parsed) == 1  # kept
    for run in (newer, real, dry, later):
        (run / "index.sqlite").unlink(missing_ok=True)
    (newer / "manifest.json").write_text(json.dumps({**json.loads((dry / "manifest.json").read_text())}))
    assert find_runs(["exp"], tmp_path) == [real.resolve()]
    assert [json.loads(raw).get("run_id") for raw in parsed[1:]] == [
        json.loads((r / "manifest.json").read_text()).get("run_id") for r in (newer, later, dry, real)
    ]
