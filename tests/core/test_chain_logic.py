"""slurm.chain without a cluster: what is refused, what is rendered and submitted, how segments combine.

tests/slurm/test_chain.py runs chains on the real cluster; these pin the logic.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobgen.cli import main
from jobgen.results.state_rule import chain_info
from jobgen.states import JobInfo, State
from tests.core.test_bad_input import with_lines
from tests.core.test_sbatch_fake import fake_slurm  # noqa: F401 - a fixture


@pytest.mark.parametrize(
    ("lines", "words"),
    [
        ({"slurm": "chain = 3", "launch": 'backend = "local"'}, ["slurm.chain", "'sbatch'", "'local'"]),
        ({"slurm": "chain = 3", "launch": "array = true"}, ["slurm.chain", "launch.array"]),
        ({"slurm": "chain = 3\nrequeue = true"}, ["slurm.chain", "choose one"]),
        ({"slurm": "chain = 0"}, ["slurm.chain", "positive"]),
    ],
)
def test_chains_that_cannot_work_are_refused(tmp_path: Path, runner, lines: dict, words: list[str]) -> None:
    exp = tmp_path / "e.toml"
    exp.write_text(with_lines(**lines))
    done = runner.invoke(main, ["validate", str(exp)])
    assert done.exit_code == 1 and len(done.output.strip().splitlines()) == 1
    assert all(w in done.output for w in words), done.output


def test_only_chained_scripts_carry_the_guard(tmp_path: Path, runner) -> None:
    for chain in (1, 3):
        exp = tmp_path / f"c{chain}.toml"
        exp.write_text(
            with_lines(slurm=f"chain = {chain}", experiment=f'name = "c{chain}"').replace('name = "bad"\n', "")
        )
        done = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "submit", str(exp), "--dry-run"])
        assert done.exit_code == 0, done.output
        (script,) = (tmp_path / "runs").glob(f"c{chain}/*/jobs/*/job.sbatch")
        text = script.read_text()
        guard = f"if [ -f {script.parent / 'result.json'} ]; then"
        assert (guard in text) is (chain > 1)
        assert ("--dependency=afterany:<previous id>" in done.output) is (chain > 1)
        if chain > 1:  # before the launch: a finished chain starts no training
            assert text.index(guard) < text.index("srun --label")


def test_a_chain_is_submitted_segment_after_segment(tmp_path: Path, runner, fake_slurm: Path) -> None:  # noqa: F811
    exp = tmp_path / "c.toml"
    exp.write_text(with_lines(slurm="chain = 3"))
    done = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "submit", str(exp)])
    assert done.exit_code == 0, done.output
    assert "submitted as a chain of 3 jobs 1001 -> 1002 -> 1003" in done.output
    argv = (fake_slurm / "argv").read_text().splitlines()
    assert argv[0].startswith("--parsable /") and argv[1].startswith("--parsable --dependency=afterany:1001 /")
    assert argv[2].startswith("--parsable --dependency=afterany:1002 /")
    (manifest,) = (tmp_path / "runs").glob("bad/*/manifest.json")
    (job,) = json.loads(manifest.read_text())["jobs"]
    assert job["job_id"] == "1001" and job["segments"] == ["1001", "1002", "1003"] and job["chain"] == 3


def _info(state: State, start: str = "") -> JobInfo:
    return JobInfo(state, start=start, nodelist="n1" if start else "")


@pytest.mark.parametrize(
    ("states", "finished", "expected", "segment"),
    [
        ([(State.RUNNING, "t"), (State.PENDING, ""), (State.PENDING, "")], False, State.RUNNING, 1),
        ([(State.TIMEOUT, "t"), (State.PENDING, ""), (State.PENDING, "")], False, State.PENDING, 1),
        ([(State.TIMEOUT, "t"), (State.RUNNING, "t"), (State.PENDING, "")], False, State.RUNNING, 2),
        ([(State.TIMEOUT, "t"), (State.COMPLETED, "t"), (State.PENDING, "")], True, State.COMPLETED, 2),
        ([(State.TIMEOUT, "t"), (State.TIMEOUT, "t"), (State.TIMEOUT, "t")], False, State.TIMEOUT, 3),
        ([(State.TIMEOUT, "t"), (State.CANCELLED, "t"), (State.CANCELLED, "")], False, State.CANCELLED, 2),
        ([(State.FAILED, "t"), (State.FAILED, "t"), (State.FAILED, "t")], False, State.FAILED, 3),
    ],
)
def test_segments_make_one_job(states: list, finished: bool, expected: State, segment: int) -> None:
    ids = ["1", "2", "3"]
    info = chain_info(ids, {i: _info(*s) for i, s in zip(ids, states, strict=True)}, finished)
    assert info is not None and info.state is expected
    assert info.extra == {"segments": [s.value for s, _ in states], "segment": segment}


def test_a_chain_adds_up_its_segments_elapsed_times() -> None:
    infos = {
        "1": JobInfo(State.TIMEOUT, "01:01:21", start="t"),
        "2": JobInfo(State.TIMEOUT, "1-00:00:39", start="t"),
        "3": JobInfo(State.RUNNING, "12:00", start="t"),
    }
    assert chain_info(["1", "2", "3"], infos, finished=False).elapsed == "1-01:14:00"


def test_a_chain_slurm_forgot_is_left_to_the_files() -> None:
    assert chain_info(["1", "2"], {}, finished=False) is None
