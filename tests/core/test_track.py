"""Status logic against stub sacct/squeue/scontrol: accounting, no accounting, forgotten jobs, arrays."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobgen.backends import _slurm as track
from jobgen.record.model import RunJob
from jobgen.results.logs import label
from jobgen.results.state_rule import progress
from jobgen.states import State, from_slurm
from tests.core.conftest import stub_tool


def _squeue_lines(*lines: str) -> str:
    """A squeue stub that writes down its arguments and prints these lines (the -O fields, each ended by "|")."""
    printed = " ".join(f"'{line}'" for line in lines)
    return 'echo "$*" >> "$(dirname "$0")/squeue.calls"; ' + (f"printf '%s\\n' {printed}\n" if lines else "\n")


def _calls(bin_dir: Path, tool: str) -> list[str]:
    path = bin_dir / f"{tool}.calls"
    return path.read_text().splitlines() if path.exists() else []


def _logged(tool: str, body: str) -> str:
    return f'echo "$*" >> "$(dirname "$0")/{tool}.calls"; {body}'


def test_sacct_rows_map_to_states(bin_dir: Path):
    stub_tool(bin_dir, "squeue", _squeue_lines())  # the controller has forgotten them all
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
    # Asked once for every job it holds (-t all), not once per id.
    stub_tool(bin_dir, "squeue", _squeue_lines("21|RUNNING|0:07|1|n2|2026-01-01T00:00:00|2026-01-01T00:10:00|0|"))
    stub_tool(
        bin_dir,
        "scontrol",
        'echo "$*" >> "$(dirname "$0")/scontrol.calls"; echo "JobId=22 JobState=TIMEOUT RunTime=00:01:12 NumNodes=1 '
        'NodeList=n3 ExitCode=0:0 StartTime=2026-01-01T00:00:00 EndTime=2026-01-01T00:01:12"; '
        'echo "JobId=31 ArrayJobId=30 ArrayTaskId=1 JobState=RUNNING RunTime=00:00:09 NumNodes=1 NodeList=n1"\n',
    )
    info = track.query(["21", "22", "23", "30_1"])
    assert info["21"].state is State.RUNNING and info["21"].source == "squeue"
    assert info["21"].elapsed == "00:00:07" and info["21"].end == ""  # sacct's format; a running job has no end yet
    assert info["22"].state is State.TIMEOUT and info["22"].source == "scontrol"
    assert info["30_1"].state is State.RUNNING  # an array task, by <array id>_<task>
    assert "23" not in info
    # One process per tool for the whole list, never one per job.
    fields = "JobArrayID:|,State:|,TimeUsed:|,NumNodes:|,NodeList:|,StartTime:|,EndTime:|,exit_code:|"
    # This user's jobs only: the controller holds every user's (a run's jobs are its submitter's).
    me = pwd.getpwuid(os.getuid()).pw_name
    assert _calls(bin_dir, "squeue") == [f"-h -r -t all -u {me} -O {fields}"]
    assert _calls(bin_dir, "scontrol") == ["show job -o"]


def test_the_controller_wins_over_a_lagging_accounting_database(bin_dir: Path):
    # slurmdbd is written after slurmctld: under load sacct still calls ended jobs pending or running.
    stub_tool(
        bin_dir,
        "sacct",
        _logged(
            "sacct",
            "printf '%s\\n' '41|RUNNING|0:0|00:00:09|1|n1|x|2026-01-01T00:00:00|Unknown' "
            "'42_[0-1]|PENDING|0:0|00:00:00|1|None assigned|x|Unknown|Unknown' "
            "'43|COMPLETED|0:0|00:00:03|1|n2|x|2026-01-01T00:00:00|2026-01-01T00:00:03' "
            "'44|PENDING|0:0|00:00:00|1|None assigned|x|Unknown|Unknown'\n",
        ),
    )
    stub_tool(
        bin_dir,
        "squeue",
        _squeue_lines(
            "41|COMPLETED|0:11|1|n1|2026-01-01T00:00:00|2026-01-01T00:00:11|0|",
            "42_0|FAILED|0:05|1|n1|2026-01-01T00:00:00|2026-01-01T00:00:05|256|",  # exit status 1
            "42_1|RUNNING|0:04|1|n3|2026-01-01T00:00:01|2026-01-01T01:00:01|0|",
            "43|CANCELLED|1:02:03|1|n2|2026-01-01T00:00:00|2026-01-01T01:02:03|15|",  # killed by SIGTERM
        ),
    )
    stub_tool(bin_dir, "scontrol", _logged("scontrol", "exit 0\n"))
    info = track.query(["41", "42_0", "42_1", "43", "44"])
    assert info["41"].state is State.COMPLETED and info["41"].exit_code == "0:0" and info["41"].source == "squeue"
    assert info["41"].end == "2026-01-01T00:00:11" and info["41"].elapsed == "00:00:11"
    assert info["42_0"].state is State.FAILED and info["42_0"].exit_code == "1:0"
    assert info["42_1"].state is State.RUNNING and info["42_1"].exit_code == "" and info["42_1"].end == ""
    assert info["43"].state is State.CANCELLED and info["43"].exit_code == "0:15" and info["43"].elapsed == "01:02:03"
    assert info["44"].state is State.PENDING and info["44"].source == "sacct"  # the controller does not hold it
    # sacct is asked only about the job the controller has forgotten; every ended job had its exit code.
    assert len(_calls(bin_dir, "squeue")) == 1 and _calls(bin_dir, "sacct")[0].split()[-1] == "44"
    assert _calls(bin_dir, "scontrol") == []


def test_a_sweep_the_controller_holds_costs_one_squeue(bin_dir: Path):
    """10,000 queued, running and just-ended jobs: one squeue, and neither sacct nor scontrol."""
    lines = [f"{100 + i}|PENDING|0:00|1||N/A|N/A|0|" for i in range(5000)]
    lines += [f"9_{i}|COMPLETED|0:03|1|n1|2026-01-01T00:00:00|2026-01-01T00:00:03|0|" for i in range(5000)]
    (bin_dir / "queue.txt").write_text("\n".join(lines) + "\n")
    stub_tool(bin_dir, "squeue", 'echo "$*" >> "$(dirname "$0")/squeue.calls"; cat "$(dirname "$0")/queue.txt"\n')
    for tool in ("sacct", "scontrol"):
        stub_tool(bin_dir, tool, _logged(tool, "exit 0\n"))
    ids = [f"{100 + i}" for i in range(5000)] + [f"9_{i}" for i in range(5000)]
    info = track.query(ids)
    assert len(info) == 10_000 and info["9_4999"].exit_code == "0:0" and info["100"].state is State.PENDING
    assert len(_calls(bin_dir, "squeue")) == 1 and _calls(bin_dir, "sacct") == [] and _calls(bin_dir, "scontrol") == []


def _answers_made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """From now on, the state of each answer (JobInfo) squeue's lines are read into."""
    made: list[str] = []
    real_info = track.JobInfo

    def counting(state, *more):
        made.append(state.value)
        return real_info(state, *more)

    monkeypatch.setattr(track, "JobInfo", counting)
    return made


def test_the_users_other_jobs_in_squeue_are_passed_over(bin_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """squeue -u lists every job of the user the controller holds (other sweeps within MinJobAge): only
    the lines that name an asked id, a pending array's range among them, are read into answers."""
    lines = [f"{5000 + i}|COMPLETED|0:03|1|n1|2026-01-01T00:00:00|2026-01-01T00:00:03|0|" for i in range(300)]
    lines += ["7_[4-9]|PENDING|0:00|1||N/A|N/A|0|", "8_[0-3]|PENDING|0:00|1||N/A|N/A|0|"]
    lines += [
        "71|RUNNING|0:07|1|n2|2026-01-01T00:00:00|2026-01-01T00:10:00|0|",
        "7_2|FAILED|0:02|1|n1|2026-01-01T00:00:00|2026-01-01T00:00:02|256|",
    ]
    (bin_dir / "queue.txt").write_text("\n".join(lines) + "\n")
    stub_tool(bin_dir, "squeue", 'cat "$(dirname "$0")/queue.txt"\n')
    made = _answers_made(monkeypatch)
    info = track.query(["71", "7_2", "7_5"])
    assert sorted(made) == ["FAILED", "PENDING", "RUNNING"], made  # 3 lines read of 304
    assert (info["71"].state, info["7_2"].exit_code, info["7_5"].state) == (State.RUNNING, "1:0", State.PENDING)
    assert set(info) == {"71", "7_2", "7_5"}


def test_jobs_the_controller_forgot_are_asked_of_sacct_alone(bin_dir: Path):
    stub_tool(bin_dir, "squeue", _squeue_lines())
    stub_tool(bin_dir, "sacct", "echo '61|COMPLETED|0:0|00:00:03|1|n2|x|2026-01-01T00:00:00|2026-01-01T00:00:03'\n")
    stub_tool(bin_dir, "scontrol", _logged("scontrol", "exit 0\n"))
    assert track.query(["61"])["61"].state is State.COMPLETED
    assert len(_calls(bin_dir, "squeue")) == 1 and _calls(bin_dir, "scontrol") == []


def test_an_ended_job_squeue_gives_no_exit_code_is_asked_of_scontrol(bin_dir: Path):
    """A squeue that prints no exit code (an older Slurm, or the no-value marker): scontrol says it."""
    stub_tool(
        bin_dir, "squeue", _squeue_lines("71|FAILED|0:02|1|n1|2026-01-01T00:00:00|2026-01-01T00:00:02|4294967294|")
    )
    stub_tool(bin_dir, "sacct", _logged("sacct", "exit 1\n"))
    stub_tool(bin_dir, "scontrol", _logged("scontrol", 'echo "JobId=71 JobState=FAILED ExitCode=137:0 NumNodes=1"\n'))
    info = track.query(["71"])
    assert info["71"].exit_code == "9:0" and info["71"].source == "scontrol"  # as sacct would say it
    assert _calls(bin_dir, "sacct") == []  # the controller holds it: accounting is not asked


@given(st.integers(0, 255), st.integers(0, 127))
def test_squeue_wait_statuses_read_as_sacct_writes_them(status: int, signal: int):
    """What exits with a status (status << 8) or dies of a signal reads as sacct's "<status>:<signal>"."""
    # sacct reports a status of 128 + n (a shell's word for "killed by signal n") as n
    assert track.exit_code(str(status << 8)) == f"{status - 128 if status >= 128 else status}:0"
    assert track.exit_code(str(signal)) == f"0:{signal}"


@given(st.integers(0, 400 * 86400))
def test_squeue_elapsed_times_read_as_sacct_writes_them(seconds: int):
    days, rest = divmod(seconds, 86400)
    hours, minutes, secs = rest // 3600, rest % 3600 // 60, rest % 60
    squeue = (f"{days}-{hours:02d}:" if days else f"{hours}:" if hours else "") + (
        f"{minutes:02d}:{secs:02d}" if days or hours else f"{minutes}:{secs:02d}"
    )
    shown = track.sacct_elapsed(squeue)
    assert track._duration(shown) == seconds  # noqa: SLF001 (the reading sbatch's times share)
    assert shown == (f"{days}-" if days else "") + f"{hours:02d}:{minutes:02d}:{secs:02d}"


def test_expand_array_ids():
    assert track.expand_array_id("7_[0-2,5%2]") == ["7_0", "7_1", "7_2", "7_5"]
    assert track.expand_array_id("7_3") == ["7_3"]


@given(st.integers(1, 10**7), st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 3)), min_size=1, max_size=6))
def test_an_array_id_expands_to_its_tasks_and_a_task_to_itself(base: int, ranges: list[tuple[int, int]]):
    parts = [f"{low}-{low + extra}" if extra else f"{low}" for low, extra in ranges]
    tasks = [f"{base}_{i}" for low, extra in ranges for i in range(low, low + extra + 1)]
    assert track.expand_array_id(f"{base}_[{','.join(parts)}]") == tasks
    assert track.expand_array_id(f"{base}_[{','.join(parts)}%4]") == tasks
    for task in tasks:
        assert track.expand_array_id(task) == [task]
    assert track.expand_array_id(str(base)) == [str(base)]


def test_tasks_that_print_the_same_fields_each_get_their_answer(bin_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """An ended sweep's tasks mostly share their fields after the id (same second, same node): every task
    gets its own id's answer, and a line of another shape is none."""
    same = "|COMPLETED|0:03|1|n1|2026-01-01T00:00:00|2026-01-01T00:00:03|0|"
    lines = [f"9_{i}{same}" for i in range(500)]
    lines += ["9_500|FAILED|0:02|1|n2|2026-01-01T00:00:00|2026-01-01T00:00:02|256|", "9_501|bad line"]
    lines += [f"9_{i}{same}" for i in range(502, 600)]
    (bin_dir / "queue.txt").write_text("\n".join(lines) + "\n")
    stub_tool(bin_dir, "squeue", 'cat "$(dirname "$0")/queue.txt"\n')
    stub_tool(bin_dir, "sacct", "exit 1\n")
    stub_tool(bin_dir, "scontrol", "exit 1\n")
    info = track.query([f"9_{i}" for i in range(600)])
    assert info["9_500"].exit_code == "1:0" and info["9_500"].nodelist == "n2"
    assert all(info[f"9_{i}"].state is State.COMPLETED and info[f"9_{i}"].exit_code == "0:0" for i in range(502, 600))
    assert "9_501" not in info or info["9_501"].source != "squeue"  # a line of another shape is no answer


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
    stub_tool(bin_dir, "squeue", _squeue_lines())  # the controller has forgotten them
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


def test_a_controller_that_does_not_answer_says_nothing_of_any_job(bin_dir: Path):
    down = "echo 'slurm_load_jobs error: Socket timed out on send/recv operation' >&2; exit 1\n"
    stub_tool(bin_dir, "squeue", _logged("squeue", down))
    stub_tool(bin_dir, "scontrol", _logged("scontrol", down))
    stub_tool(bin_dir, "sacct", "echo 'sacct: error: Slurm accounting storage is disabled' >&2; exit 1\n")
    info = track.query(["41", "42"])
    assert dict(info) == {}
    assert info.silent == "squeue failed: slurm_load_jobs error: Socket timed out on send/recv operation"
    assert len(_calls(bin_dir, "squeue")) == 1 and len(_calls(bin_dir, "scontrol")) == 1


def test_the_accounting_answers_for_a_silent_controller_where_it_can(bin_dir: Path):
    down = "echo 'squeue: error: Unable to contact slurm controller (connect failure)' >&2; exit 1\n"
    stub_tool(bin_dir, "squeue", down)
    stub_tool(bin_dir, "scontrol", down)
    stub_tool(
        bin_dir, "sacct", "printf '%s\\n' '41|FAILED|1:0|00:00:09|1|n1|x|2026-01-01T00:00:00|2026-01-01T00:00:09'\n"
    )
    info = track.query(["41", "42"])
    assert info["41"].state is State.FAILED and "42" not in info  # 42: no news of it
    assert "Unable to contact slurm controller" in info.silent


def test_a_job_the_controller_no_longer_holds_is_no_silence(bin_dir: Path):
    # squeue failed, but scontrol answered: the controller is up, and a job it does not list has left it.
    stub_tool(bin_dir, "squeue", "echo 'squeue: error: Invalid user' >&2; exit 1\n")
    stub_tool(bin_dir, "scontrol", "echo 'JobId=41 JobState=TIMEOUT RunTime=00:01:12 NumNodes=1 ExitCode=0:0'\n")
    stub_tool(bin_dir, "sacct", "exit 1\n")
    info = track.query(["41", "42"])
    assert info["41"].state is State.TIMEOUT and "42" not in info and info.silent == ""


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["slurm-7.out", "slurm-7.err", "slurm-8.out", "slurm-8.err", "slurm-9_1.out", "x.log"]),
            st.integers(0, 3),
        ),
        unique_by=lambda pair: pair[0],
        max_size=6,
    )
)
def test_logs_are_ordered_by_time_or_by_name(tmp_path_factory, logs: list[tuple[str, int]]) -> None:
    """A job's logs, oldest first: by time where several attempts wrote them, by name for one job's .out
    and .err; a file that is no log of the scheduler's is left out."""
    from jobgen import backends

    folder = tmp_path_factory.mktemp("job")
    for name, age in logs:
        (folder / name).write_text(name)
        os.utime(folder / name, (1_000_000 - age, 1_000_000 - age))
    scheduler = backends.get("sbatch")
    listed = scheduler.log_files(folder)
    assert sorted(path.name for path in listed) == sorted(name for name, _ in logs if name != "x.log")
    # One job id's .out and .err by name; several attempts by time, then name.
    one_job = len({path.name.rpartition(".")[0] for path in listed}) <= 1
    assert listed == sorted(listed, key=lambda p: p.name if one_job else (p.stat().st_mtime, p.name))
