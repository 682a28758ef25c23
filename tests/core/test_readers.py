"""Reading a run's records in several processes (jobgen.record.readers, JOBGEN_READERS): the same states,
tables, warnings and kept facts as one process, every job read exactly once, and a reader that fails
or dies costs time, never a job."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobgen.cli import main
from jobgen.record import readers
from jobgen.record.model import Run, RunJob
from jobgen.states import JobInfo, State
from tests.core.conftest import fake_squeue
from tests.data.summary import synth

PAST = time.time() - 60


def _jobs() -> list[synth.FakeJob]:
    """23 jobs (3 readers do not divide them): results, jobs that ended without one (their logs say
    why), damaged records, a job still running as far as the record knows."""
    jobs = []
    for i in range(23):
        job = synth.FakeJob(f"job{i:02d}", sweep={"train.lr": i}, state="COMPLETED", test_acc=0.5 + i / 100)
        if i % 5 == 1:  # recorded as submitted: Slurm's answer says it ended, its logs say why
            job.result, job.state = None, "SUBMITTED"
            job.logs = {f"slurm-{4000 + i}.out": synth.log("oom.out" if i % 2 else "exception.out")}
        if i == 7:
            job.result = '{"schema": 1, "test_acc": 0.'  # cut short
        if i == 12:
            job.state, job.result = "SUBMITTED", None  # the scheduler is asked about it: it ended without
            job.logs = {f"slurm-{4000 + i}.out": "epoch 1/2\n"}
        jobs.append(job)
    return jobs


def _write(root: Path) -> Path:
    run = synth.write_run(root, "exp", _jobs())
    jobs = run / "jobs"
    (jobs / "job03" / "spec.json").write_text("{not json", encoding="utf-8")
    progress = {"epoch": 1, "epochs": 2, "batch": 5, "batches": 9, "step": 14}
    for name in ("job04", "job12", "job17"):
        (jobs / name / "progress.json").write_text(json.dumps(progress), encoding="utf-8")
    retries = {"schema": 1, "retries": 1, "limit": 2, "excluded": ["n1"], "stopped": None}
    (jobs / "job09" / "retries.json").write_text(json.dumps(retries), encoding="utf-8")
    (jobs / "job10" / "metrics.csv").write_text("epoch,step,split,loss\n0,1,train,0.5\n", encoding="utf-8")
    shutil.rmtree(jobs / "job20")  # deleted by hand
    for path in sorted(run.rglob("*"), reverse=True):  # old enough for what is read of them to be kept
        os.utime(path, (PAST, PAST))
    return run


def _answer(ids: list[str]) -> dict[str, JobInfo]:
    """squeue: every job the record calls submitted has ended (each without its result)."""
    return {
        i: JobInfo(State.COMPLETED, "0:09", "1", "n1", "0:0", "2026-11-29T20:00:00", "2026-11-29T20:02:00") for i in ids
    }


def _commands(runner, run: Path, tmp_path: Path) -> list[str]:
    """status, status, summary and report of the run, what each printed (its own path taken out)."""
    said = []
    for args in (["status"], ["status"], ["summary", "--format", "json"], ["report", "-o", str(tmp_path / "r.html")]):
        result = runner.invoke(main, ["--output-root", str(run.parents[1]), args[0], str(run), *args[1:]])
        assert result.exit_code == 0, result.output
        said.append((result.stdout + result.stderr).replace(str(run), "RUN").replace(str(tmp_path), "TMP"))
    return said


def _kept(run: Path) -> dict[str, object]:
    """The verdicts' facts by file, without the stamps (each copy has its own inodes)."""
    files = json.loads((run / ".verdicts.json").read_text())["files"]
    return {rel: entry[4] for rel, entry in files.items()}


def _states(run: Path) -> list[tuple[str, str, object]]:
    jobs = json.loads((run / "manifest.json").read_text())["jobs"]
    return [(job["name"], job["state"], job.get("cause")) for job in jobs]


def test_readers_say_what_one_process_says(runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_squeue(monkeypatch, _answer)
    said, kept, states = {}, {}, {}
    for n in (1, 3):
        monkeypatch.setenv(readers.READERS_ENV, str(n))
        run = _write(tmp_path / f"readers{n}")
        said[n], kept[n], states[n] = _commands(runner, run, tmp_path / f"readers{n}"), _kept(run), _states(run)
    assert said[3] == said[1]
    assert kept[3] == kept[1]
    assert states[3] == states[1]
    # What the run holds shows in both: a wrong hand-back would show in one.
    assert "jobs/job03/spec.json" in said[1][0] and "jobs/job07/result.json" in said[1][0], said[1][0]
    assert "job20" in said[1][0] and "1/2 excl n1" in said[1][0], said[1][0]
    assert [(state, cause[0]) for name, state, cause in states[1] if name == "job12"] == [("FAILED", "4012")]
    ended = {name: (state, cause[1]) for name, state, cause in states[1] if name in ("job01", "job06", "job11")}
    assert ended == {"job01": ("FAILED", "gpu_oom"), "job06": ("FAILED", "exception"), "job11": ("FAILED", "gpu_oom")}
    assert kept[1]["jobs/job04/progress.json"] == {"problem": None, "progress": [1, 2, 5, 9]}
    from jobgen.results.collect import _RESULT_FIELDS

    assert kept[1]["jobs/job05/result.json"]["result"][_RESULT_FIELDS.index("test_acc")] == 0.55  # picked by status
    assert len(kept[1]) >= 23 * 3 - 5


def _load(tmp_path: Path) -> Run:
    return Run.load(_write(tmp_path))


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from jobgen.record import model

    read: list[str] = []
    real = model.read_with_stamp

    def counting(path: str):
        read.append(path)
        return real(path)

    monkeypatch.setattr(model, "read_with_stamp", counting)
    return read


def _problems(run: Run) -> list[list[str]]:
    return [job.problems() for job in run.jobs]


def _look(job: RunJob) -> None:
    """What a status reads of a job (jobgen.results.collect.look_and_keep)."""
    from jobgen.results.collect import keep_what_was_read

    job.problems()
    keep_what_was_read(job)


def test_each_job_is_read_once_by_one_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    alone = _load(tmp_path / "alone")
    monkeypatch.setenv(readers.READERS_ENV, "1")
    readers.share([alone], _look)()
    monkeypatch.setenv(readers.READERS_ENV, "4")
    run = _load(tmp_path / "shared")
    read = _count_reads(monkeypatch)  # in this process only: a reader's reads are its own
    readers.share([run], _look)()
    assert 0 < len(read) <= 2 * 6, read  # this process's share: 6 of the 23 jobs, spec and result each
    assert {Path(p).parent.name for p in read} <= {f"job{i:02d}" for i in range(6)}, read
    taken = len(read)
    stats: list[str] = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda path, *a, **k: stats.append(str(path)) or real_stat(path, *a, **k))
    assert _problems(run) == _problems(alone)
    for a, b in zip(run.jobs, alone.jobs, strict=True):
        assert a.finished == b.finished and a.progress() == b.progress() and a.retries() == b.retries(), a.name
        assert (a.stamps() is None) == (b.stamps() is None), a.name
    assert len(read) == taken, read[taken:]  # the readers' verdicts and stamps answered: nothing read twice
    assert not [path for path in stats if "shared" in path], stats  # nor stat'ed again


@pytest.mark.parametrize("how", ["raises", "dies", "hands back nonsense"])
def test_a_reader_that_fails_has_its_share_read_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    monkeypatch.setenv(readers.READERS_ENV, "1")
    alone = _load(tmp_path / "alone")
    readers.share([alone], RunJob.problems)()
    monkeypatch.setenv(readers.READERS_ENV, "3")
    run = _load(tmp_path / "shared")
    here = os.getpid()

    def work(job: RunJob) -> None:
        if os.getpid() != here and job.name == "job10":  # the second reader's share
            if how == "raises":
                raise RuntimeError("a reader's bug")
            if how == "dies":
                os._exit(9)
        job.problems()

    if how == "hands back nonsense":
        monkeypatch.setattr(RunJob, "seen", lambda self: ("not", "what", "take_seen", "wants"))
    read = _count_reads(monkeypatch)
    readers.share([run], work)()
    assert {Path(p).parent.name for p in read} >= {f"job{i:02d}" for i in range(8, 16)} - {"job12"}, read
    assert _problems(run) == _problems(alone)
    assert [job.finished for job in run.jobs] == [job.finished for job in alone.jobs]


def test_readers_are_counted_by_the_work_and_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(readers.READERS_ENV, raising=False)
    monkeypatch.setattr(readers, "cgroup_cpus", lambda: None)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)), raising=False)
    assert [readers.readers_for(n) for n in (0, 2_499, 2_500, 10_000, 100_000)] == [1, 1, 1, 4, 8]
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    assert readers.readers_for(10_000) == 2
    monkeypatch.setenv(readers.READERS_ENV, "6")
    assert readers.readers_for(10_000) == 6 and readers.readers_for(4) == 4


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_a_bad_readers_setting_is_one_line(runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    run = _write(tmp_path)
    monkeypatch.setenv(readers.READERS_ENV, value)
    result = runner.invoke(main, ["--output-root", str(run.parents[1]), "status", str(run)])
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    (line,) = [ln for ln in result.output.splitlines() if ln.strip()]
    assert readers.READERS_ENV in line and repr(value) in line, line


@given(jobs=st.integers(0, 300), n=st.integers(1, 12))
def test_the_shares_hold_every_job_once(jobs: int, n: int) -> None:
    items = [(0, j) for j in range(jobs)]
    shares = readers.shares(items, n)
    assert [job for part in shares for job in part] == items
    assert len(shares) <= n and all(shares)
    if shares:
        assert max(map(len, shares)) - min(map(len, shares)) <= 1


@pytest.mark.parametrize("how", ["as one process", "raises", "dies"])
def test_gather_gives_each_item_its_answer_in_order(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    monkeypatch.setenv(readers.READERS_ENV, "1" if how == "as one process" else "3")
    here = os.getpid()

    def read(item: int) -> tuple[int, int]:
        if os.getpid() != here and item == 5:  # in the second reader's share
            if how == "raises":
                raise RuntimeError("a reader's bug")
            if how == "dies":
                os._exit(9)
        return item, item * item

    assert readers.gather(list(range(11)), read) == [(i, i * i) for i in range(11)]
    assert readers.gather([], read) == []


def _ended_run(root: Path, kept_usage: bool = False) -> Path:
    run = synth.write_run(root, "exp", [synth.FakeJob(f"job{i}", state="COMPLETED", test_acc=0.5) for i in range(5)])
    if kept_usage:  # an earlier summary kept one job's final usage: the question is told after the states
        manifest = json.loads((run / "manifest.json").read_text())
        manifest["jobs"][0]["usage"] = {"key": "stale", "attempts": {}}
        (run / "manifest.json").write_text(json.dumps(manifest))
    return run


@pytest.mark.parametrize("kept_usage", [False, True])
def test_the_accounting_is_asked_while_the_records_are_read(
    runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept_usage: bool
) -> None:
    """The first summary of an ended sweep asks sacct its one question while it reads the records (the
    question is every submitted job's), and takes that answer; once some usage is kept, the question
    depends on the states, and is asked after them, once."""
    import threading

    from jobgen.backends._base import Attempt
    from jobgen.results import collect

    run = _ended_run(tmp_path, kept_usage)
    asked, calls = threading.Event(), []
    real_look = collect.look_at_records

    def look(runs, also=None):
        rest = real_look(runs, also)

        def finish():
            rest()
            # Not asked by now: asked after the records were read.
            calls.append(("records read", asked.wait(10 if not kept_usage else 0.3)))

        return finish

    def usage_later(ids):
        calls.append(("sacct", sorted(ids)))  # started (before the readers fork, where it is asked ahead)

        def answer():
            asked.set()
            return {i: [Attempt(True, 100, 3600, 8, 2, None, final=True)] for i in ids}

        return answer

    monkeypatch.setattr(collect, "look_at_records", look)
    monkeypatch.setattr("jobgen.backends._slurm.usage_later", usage_later)
    result = runner.invoke(main, ["summary", str(run), "--format", "json"])
    assert result.exit_code == 0, result.output
    ids = ["4000", "4001", "4002", "4003", "4004"]
    if kept_usage:
        assert calls == [("records read", False), ("sacct", ids)]
    else:
        assert calls == [("sacct", ids), ("records read", True)]
    rows = json.loads(result.stdout)["rows"]
    assert [row["gpu_hours"] for row in rows] == [round(2 * 100 / 3600, 6)] * 5, rows  # the answer taken


def test_the_rows_are_built_while_the_accountings_answer_is_on_its_way(
    runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Of the first summary, every row but its usage is made before the answer asked ahead is taken;
    each row's usage is the answer's."""
    from jobgen.backends._base import Attempt
    from jobgen.results import collect

    run = _ended_run(tmp_path)
    order: list[str] = []
    real_row = collect._row

    def row(*args, **kwargs):
        order.append("row")
        return real_row(*args, **kwargs)

    def usage_later(ids):
        return lambda: {i: [Attempt(True, 100, 3600, 8, 2, None, final=True)] for i in ids}

    def taken_when_asked_for(work):  # in place of the thread: the answer is there when collect takes it
        return lambda: (order.append("answer taken"), work())[1]

    monkeypatch.setattr(collect, "_row", row)
    monkeypatch.setattr(collect, "in_background", taken_when_asked_for)
    monkeypatch.setattr("jobgen.backends._slurm.usage_later", usage_later)
    result = runner.invoke(main, ["summary", str(run), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert order == ["row"] * 5 + ["answer taken"], order
    rows = json.loads(result.stdout)["rows"]
    assert [row["gpu_hours"] for row in rows] == [round(2 * 100 / 3600, 6)] * 5, rows


def _order_of_tools_and_reading(monkeypatch: pytest.MonkeyPatch, reading: Any) -> list[str]:
    """From now on, each Slurm tool started and each start of the records' reading (`reading`: the module
    whose look_at_records the command calls: status, summary and report read through collect's), in
    order; with two readers."""
    from jobgen.backends import _tools

    order: list[str] = []
    real_start, real_look = _tools._start, reading.look_at_records

    def start(command):
        order.append(f"{command[0]} started")
        return real_start(command)

    def look(runs, also=None):
        order.append("records read")
        return real_look(runs, also)

    monkeypatch.setattr(_tools, "_start", start)
    monkeypatch.setattr(reading, "look_at_records", look)
    monkeypatch.setenv(readers.READERS_ENV, "2")
    return order


def test_sacct_is_started_before_the_records_are_read_and_answers_the_summary(
    runner, tmp_path: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first summary's sacct is a process started before the readers fork (no thread yet), so its
    answer comes while they read; a thread takes it after. Its answer is the summary's usage."""
    from jobgen.results import collect
    from tests.core.conftest import stub_tool

    run = _ended_run(tmp_path)
    lines = "\n".join(
        f"{4000 + i}|2026-01-01T00:00:00|100|60|billing=8,cpu=8,gres/gpu=2,node=1|0|COMPLETED" for i in range(5)
    )
    stub_tool(bin_dir, "sacct", f"cat <<'EOF'\n{lines}\nEOF\n")
    order = _order_of_tools_and_reading(monkeypatch, collect)
    result = runner.invoke(main, ["summary", str(run), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert order == ["sacct started", "records read"], order  # one sacct, before the reading
    rows = json.loads(result.stdout)["rows"]
    assert [row["gpu_hours"] for row in rows] == [round(2 * 100 / 3600, 6)] * 5, rows


def test_squeue_is_started_before_the_records_are_read(
    runner, tmp_path: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A status of running jobs starts its squeue before the readers fork (a process, no thread yet):
    the controller answers while they read, and its answer decides the states."""
    from jobgen.results import collect
    from tests.core.conftest import stub_tool

    run = synth.write_run(tmp_path, "exp", [synth.FakeJob(f"job{i}", state="RUNNING", result=None) for i in range(5)])
    ids = [job["job_id"] for job in json.loads((run / "manifest.json").read_text())["jobs"]]
    lines = "\n".join(f"{i}|FAILED|0:09|1|n1|2026-01-01T00:00:00|2026-01-01T00:00:09|256|" for i in ids)
    stub_tool(bin_dir, "squeue", f"cat <<'EOF'\n{lines}\nEOF\n")
    order = _order_of_tools_and_reading(monkeypatch, collect)  # a status reads through collect.look_and_keep
    result = runner.invoke(main, ["status", str(run)])
    assert result.exit_code == 0, result.output
    assert order == ["squeue started", "records read"], order
    manifest = json.loads((run / "manifest.json").read_text())
    assert [job["state"] for job in manifest["jobs"]] == ["FAILED"] * 5  # the answer taken, and recorded


def test_no_reader_is_forked_while_a_thread_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork copies no thread and keeps whatever lock one held: none while jobgen's own thread asks
    Slurm, and none beside another program's threads unless JOBGEN_READERS asks for them."""
    import threading

    def alive_with(name: str) -> bool:
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait, name=name, daemon=True)
        thread.start()
        try:
            return readers._may_fork()
        finally:
            stop.set()
            thread.join()

    monkeypatch.setenv(readers.READERS_ENV, "3")
    assert not alive_with("jobgen-ask")
    assert alive_with("a notebook's thread")
    monkeypatch.delenv(readers.READERS_ENV)
    assert not alive_with("a notebook's thread")
    assert readers._may_fork() == (threading.active_count() == 1)


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.mark.parametrize(
    ("own", "files", "cpus"),
    [
        # cgroup v2: the user's slice caps at 2.5 CPUs, the session below it at none: 3 readers at most.
        (
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            {
                "cpu.max": "max 100000\n",
                "user.slice/user-1000.slice/cpu.max": "250000 100000\n",
                "user.slice/user-1000.slice/session-3.scope/cpu.max": "max 100000\n",
            },
            3,
        ),
        # v1, the controllers mounted together; the tightest of the group and those above it counts.
        (
            "4:memory:/x\n2:cpu,cpuacct:/arbiter/u1000\n",
            {
                "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
                "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
                "cpu,cpuacct/arbiter/cpu.cfs_quota_us": "400000\n",
                "cpu,cpuacct/arbiter/cpu.cfs_period_us": "100000\n",
                "cpu,cpuacct/arbiter/u1000/cpu.cfs_quota_us": "100000\n",
                "cpu,cpuacct/arbiter/u1000/cpu.cfs_period_us": "100000\n",
            },
            1,
        ),
        ("0::/\n", {"cpu.max": "max 100000\n"}, None),  # no quota
        ("0::/\n", {"cpu.max": "garbage\n"}, None),  # unreadable: no quota known
        ("1:cpu:/\n", {}, None),  # no files: none
    ],
)
def test_a_cgroup_cpu_quota_caps_the_readers(tmp_path: Path, own: str, files: dict[str, str], cpus: int | None) -> None:
    _write_tree(tmp_path / "cg", files)
    (tmp_path / "self").write_text(own)
    assert readers.cgroup_cpus(str(tmp_path / "cg"), str(tmp_path / "self")) == cpus


def test_readers_stay_within_the_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(readers.READERS_ENV, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(64)), raising=False)
    monkeypatch.setattr(readers, "cgroup_cpus", lambda: 2)
    assert readers.readers_for(100_000) == 2
    monkeypatch.setattr(readers, "cgroup_cpus", lambda: None)
    assert readers.readers_for(100_000) == 8


@pytest.mark.parametrize("jobs", [40, 640])
def test_job_folders_changed_since_an_earlier_look_weigh_as_unread(tmp_path: Path, jobs: int) -> None:
    """A job whose folder is as an earlier command saw it weighs a quarter; one that changed since (the
    sweep ran or ended after a status saw it queued: new logs, a result) weighs as a job never read,
    told from a sample of the folders (all of them up to 64)."""
    run_dir = synth.write_run(tmp_path, "exp", [synth.FakeJob(f"j{i}", state="COMPLETED") for i in range(jobs)])
    past = time.time() - 60  # settled: what a look learns of them is kept
    for path in [*run_dir.rglob("*"), run_dir]:
        os.utime(path, (past, past))
    assert readers._weight([Run.load(run_dir)]) == jobs  # never looked at
    Run.load(run_dir).problems()  # a look, its listings kept
    assert readers._weight([Run.load(run_dir)]) == jobs // 4
    for i in range(jobs // 2):  # the first half of the sweep wrote a log since
        (run_dir / "jobs" / f"j{i}" / "slurm-9.out").write_text("ran\n")
    assert readers._weight([Run.load(run_dir)]) == (jobs // 2 + 4 * (jobs // 2)) // 4


def test_per_job_objects_hold_no_instance_dict(tmp_path: Path) -> None:
    """A command makes one of each per job (10,000 in a big sweep): slotted, so none carries a dict of
    its own (16 MB of them at 10,000 RunJobs, and their page faults), and what they cached still is."""
    import dataclasses

    from jobgen.backends._base import Attempt
    from jobgen.plan.plan import Job
    from jobgen.results.collect import JobRow, Result
    from jobgen.results.columns import Line
    from jobgen.results.cost import Usage

    job = RunJob.from_entry(tmp_path, {"name": "a", "state": "COMPLETED", "job_id": "7"})
    assert job.job_dir == tmp_path / "jobs" / "a" and job.job_dir is job.job_dir
    for cls in (RunJob, JobRow, Result, Line, Usage, Attempt, JobInfo, Job):
        assert dataclasses.is_dataclass(cls) and "__slots__" in vars(cls), cls.__name__
    assert not hasattr(job, "__dict__") and not hasattr(JobInfo(State.COMPLETED), "__dict__")
    with pytest.raises(AttributeError):
        job.not_a_field = 1  # type: ignore[attr-defined]
