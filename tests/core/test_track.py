"""Status logic against stub sacct/squeue/scontrol: accounting, no accounting, forgotten jobs, arrays."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobgen.backends import _slurm as track
from jobgen.results.logs import label
from jobgen.results.status import progress
from jobgen.run.model import RunJob
from jobgen.states import State, from_slurm
from tests.core.conftest import stub_tool


def test_sacct_rows_map_to_states(bin_dir: Path):
    stub_tool(
        bin_dir,
        "sacct",
        "printf '%s\\n' '11|COMPLETED|0:0|00:01:02|2|n[1-2]|x|2026-01-01T00:00:00|2026-01-01T00:01:02' "
        "'12|CANCELLED by 0|0:15|00:00:05|1|n1|x|2026-01-01T00:00:00|Unknown' '13_[0-2%1]|PENDING|0:0|00:00:00|1|None assigned|x|Unknown|Unknown'\n",
    )
    info = track.query(["11", "12", "13_1"])
    assert info["11"].state is State.COMPLETED and info["11"].nodelist == "n[1-2]" and info["11"].elapsed == "00:01:02"
    assert info["12"].state is State.CANCELLED and info["12"].end == ""
    assert info["13_1"].state is State.PENDING


def test_without_accounting_falls_back_to_squeue_then_scontrol(bin_dir: Path):
    stub_tool(bin_dir, "sacct", "echo 'sacct: error: Slurm accounting storage is disabled' >&2; exit 1\n")
    stub_tool(
        bin_dir,
        "squeue",
        # Asked once for every job it holds (-t all), not once per id.
        'echo "$*" >> "$(dirname "$0")/squeue.calls"; echo "21|RUNNING|0:07|1|n2|2026-01-01T00:00:00"\n',
    )
    stub_tool(
        bin_dir,
        "scontrol",
        'echo "$*" >> "$(dirname "$0")/scontrol.calls"; echo "JobId=22 JobState=TIMEOUT RunTime=00:01:12 NumNodes=1 '
        'NodeList=n3 ExitCode=0:0 StartTime=2026-01-01T00:00:00 EndTime=2026-01-01T00:01:12"; '
        'echo "JobId=31 ArrayJobId=30 ArrayTaskId=1 JobState=RUNNING RunTime=00:00:09 NumNodes=1 NodeList=n1"\n',
    )
    info = track.query(["21", "22", "23", "30_1"])
    assert info["21"].state is State.RUNNING and info["21"].source == "squeue"
    assert info["22"].state is State.TIMEOUT and info["22"].source == "scontrol"
    assert info["30_1"].state is State.RUNNING  # an array task, by <array id>_<task>
    assert "23" not in info
    # One process per tool for the whole list, never one per job.
    assert (bin_dir / "squeue.calls").read_text().splitlines() == ["-h -r -t all -o %i|%T|%M|%D|%N|%S"]
    assert (bin_dir / "scontrol.calls").read_text().splitlines() == ["show job -o"]


def test_the_controller_wins_over_a_lagging_accounting_database(bin_dir: Path):
    # slurmdbd is written after slurmctld: under load sacct still calls ended jobs pending or running.
    stub_tool(
        bin_dir,
        "sacct",
        "printf '%s\\n' '41|RUNNING|0:0|00:00:09|1|n1|x|2026-01-01T00:00:00|Unknown' "
        "'42_[0-1]|PENDING|0:0|00:00:00|1|None assigned|x|Unknown|Unknown' "
        "'43|COMPLETED|0:0|00:00:03|1|n2|x|2026-01-01T00:00:00|2026-01-01T00:00:03' "
        "'44|PENDING|0:0|00:00:00|1|None assigned|x|Unknown|Unknown'\n",
    )
    stub_tool(
        bin_dir,
        "squeue",
        'echo "$*" >> "$(dirname "$0")/squeue.calls"; printf "%s\\n" "41|COMPLETED|0:11|1|n1|2026-01-01T00:00:00" '
        '"42_0|COMPLETED|0:05|1|n1|2026-01-01T00:00:00" "42_1|RUNNING|0:04|1|n3|2026-01-01T00:00:01" '
        '"43|COMPLETED|0:03|1|n2|2026-01-01T00:00:00"\n',
    )
    stub_tool(
        bin_dir,
        "scontrol",
        'echo "JobId=41 JobState=COMPLETED RunTime=00:00:11 NumNodes=1 NodeList=n1 ExitCode=0:0 '
        'StartTime=2026-01-01T00:00:00 EndTime=2026-01-01T00:00:11"; '
        'echo "JobId=50 ArrayJobId=42 ArrayTaskId=0 JobState=FAILED RunTime=00:00:05 NumNodes=1 NodeList=n1 '
        'ExitCode=1:0"\n',
    )
    info = track.query(["41", "42_0", "42_1", "43", "44"])
    assert info["41"].state is State.COMPLETED and info["41"].exit_code == "0:0" and info["41"].source == "scontrol"
    assert info["42_0"].state is State.FAILED and info["42_0"].exit_code == "1:0"
    assert info["42_1"].state is State.RUNNING and info["42_1"].source == "squeue"
    assert info["43"].source == "sacct"  # ended with an exit code: accounting's answer stands
    assert info["44"].state is State.PENDING and info["44"].source == "sacct"  # the controller does not hold it
    assert len((bin_dir / "squeue.calls").read_text().splitlines()) == 1


def test_jobs_accounting_says_ended_are_not_asked_again(bin_dir: Path):
    stub_tool(bin_dir, "sacct", "echo '61|COMPLETED|0:0|00:00:03|1|n2|x|2026-01-01T00:00:00|2026-01-01T00:00:03'\n")
    for tool in ("squeue", "scontrol"):
        stub_tool(bin_dir, tool, f'echo "$*" >> "$(dirname "$0")/{tool}.calls"\n')
    assert track.query(["61"])["61"].state is State.COMPLETED
    assert not (bin_dir / "squeue.calls").exists() and not (bin_dir / "scontrol.calls").exists()


def test_expand_array_ids():
    assert track.expand_array_id("7_[0-2,5%2]") == ["7_0", "7_1", "7_2", "7_5"]
    assert track.expand_array_id("7_3") == ["7_3"]


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("CANCELLED by 0", State.CANCELLED),
        ("CD", State.COMPLETED),
        ("OUT_OF_MEMORY", State.OUT_OF_MEMORY),
        ("RUNNING", State.RUNNING),
        ("PD", State.PENDING),
        ("REQUEUED", State.REQUEUED),
        ("weird", State.UNKNOWN),
    ],
)
def test_state_table(text, state):
    assert from_slurm(text) is state


def test_rank_labels():
    assert label("3: hello", None) == "[rank 3] hello"
    assert label("3: hello", 2) is None and label("plain line", None) == "plain line"
    # torchrun --tee, alone or behind srun's label of the node's one launcher task: the rank is torchrun's.
    assert label("[rank5]: hello", None) == "[rank 5] hello"
    assert label("1: [rank5]: hello", 5) == "[rank 5] hello" and label("1: [rank5]: hello", 1) is None


@pytest.mark.parametrize(
    ("backend", "out", "err"),
    [
        ("sbatch", ["slurm-7.out", "slurm-9_1.out"], ["slurm-7.err"]),
        ("submitit", ["submitit/7_0_log.out", "submitit/7_1_log.out"], ["submitit/7_0_log.err"]),
        ("local", ["local.out"], []),
    ],
)
def test_each_backend_says_where_its_logs_are(tmp_path: Path, backend: str, out: list[str], err: list[str]):
    from jobgen.results import logs

    decoys = ["spec.json", "result.json", "submitit/7_submission.sh", "notes.out", "x.err"]
    for i, name in enumerate([*decoys, *out, *err]):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, (1000 + i, 1000 + i))  # written in this order
    assert logs.files(backend, tmp_path, "out") == [tmp_path / n for n in out]
    assert logs.files(backend, tmp_path, "err") == [tmp_path / n for n in err]
    assert logs.files(backend, tmp_path) == [tmp_path / n for n in [*out, *err]]


@pytest.mark.parametrize(
    ("doc", "state", "shown"),
    [
        ('{"epoch": 1, "epochs": 3, "batch": 45, "batches": 100, "step": 145}', State.RUNNING, "epoch 2/3 45%"),
        ('{"epoch": 0, "epochs": 3, "batch": 100, "batches": 100, "step": 100}', State.FAILED, "epoch 1/3 100%"),
        ('{"epoch": 2, "epochs": 3, "batch": 100, "batches": 100, "step": 300}', State.COMPLETED, "done"),
        ('{"epoch": 1, "epochs": 3, "batch": 4', State.RUNNING, "-"),  # torn by hand: never a crash
        (None, State.PENDING, "-"),
    ],
)
def test_progress_column(tmp_path: Path, doc: str | None, state: State, shown: str):
    if doc is not None:
        (tmp_path / "jobs" / "a").mkdir(parents=True)
        (tmp_path / "jobs" / "a" / "progress.json").write_text(doc)
    job = RunJob.from_entry(tmp_path, {"name": "a", "state": state.value})
    job.state = state
    assert progress(job) == shown


def test_a_local_job_shows_its_elapsed_time_and_exit_code(tmp_path: Path, runner) -> None:
    """The local backend records start, end and exit code, not Slurm's elapsed: status works it out."""
    import json

    from jobgen.cli import main
    from tests.data.summary.synth import FakeJob, write_run

    run = write_run(tmp_path, "exp", [FakeJob("a", state="COMPLETED", logs={"local.out": "hi\n"})])
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["jobs"][0].update(
        submitted_at="2026-11-29T20:00:00+00:00", ended_at="2026-11-29T21:02:05+00:00", exit_code=0
    )
    (run / "manifest.json").write_text(json.dumps(manifest))
    out = runner.invoke(main, ["--output-root", str(tmp_path), "status", str(run)])
    assert out.exit_code == 0, out.output
    line = next(ln for ln in out.output.splitlines() if ln.startswith("a "))
    assert " 01:02:05 " in line and " 0 " in line, line


def test_array_tasks_are_asked_of_sacct_by_their_array(bin_dir: Path):
    """sacct -j <array id> answers a line per task: 10,000 tasks in a few arrays are one short question."""
    stub_tool(
        bin_dir,
        "sacct",
        'echo "$*" >> "$(dirname "$0")/sacct.calls"; '
        "printf '%s\\n' '70_0|COMPLETED|0:0|00:00:03|1|n1|x|2026-01-01T00:00:00|2026-01-01T00:00:03' "
        "'70_1|FAILED|1:0|00:00:04|1|n2|x|2026-01-01T00:00:00|2026-01-01T00:00:04' "
        "'70_2|COMPLETED|0:0|00:00:03|1|n1|x|2026-01-01T00:00:00|2026-01-01T00:00:03' "
        "'71|TIMEOUT|0:0|00:00:09|1|n1|x|2026-01-01T00:00:00|2026-01-01T00:00:09'\n",
    )
    info = track.query(["70_0", "70_1", "71"])
    assert sorted(info) == ["70_0", "70_1", "71"]  # 70_2 was not asked about
    assert info["70_1"].state is State.FAILED and info["71"].state is State.TIMEOUT
    assert (bin_dir / "sacct.calls").read_text().split()[-1] == "70,71"
    (bin_dir / "sacct.calls").unlink()
    stub_tool(
        bin_dir,
        "sacct",
        'echo "$*" >> "$(dirname "$0")/sacct.calls"; '
        "printf '%s\\n' '70_0|2026-01-01T00:00:00|3|10|billing=1,cpu=1,node=1||COMPLETED' "
        "'70_2|2026-01-01T00:00:00|3|10|billing=1,cpu=1,node=1||COMPLETED'\n",
    )
    used = track.usage(["70_0", "70_1"])
    assert sorted(used) == ["70_0"] and used["70_0"][0].cpus == 1
    assert (bin_dir / "sacct.calls").read_text().split()[-1] == "70"
