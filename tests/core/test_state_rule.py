"""The one rule for a job's state (jobgen.results.state_rule): a table of (recorded, Slurm's answer, result,
log cause) -> state, and `status` and `summary` showing the same state for the same run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobgen.cli import main
from jobgen.results.diagnose import LAST_LINE, Cause
from jobgen.results.state_rule import job_state, needs_cause
from jobgen.states import State
from tests.core.conftest import fake_squeue

S = State
TIME_LIMIT = Cause("time_limit", "DUE TO TIME LIMIT", "raise slurm.time", "slurm-1.out")
HOST_OOM = Cause("host_oom", "oom-kill", "raise slurm.mem", "slurm-1.out")
EXCEPTION = Cause("exception", "ValueError: x", "fix it", "slurm-1.out")
LAST = Cause(LAST_LINE, "epoch 1", "read the log", "slurm-1.out")

CASES = [
    # recorded, live, finished, cause -> shown
    (S.DRY_RUN, None, False, None, S.DRY_RUN),
    (S.NOT_SUBMITTED, None, False, None, S.NOT_SUBMITTED),
    (S.SUBMITTED, S.PENDING, False, None, S.PENDING),
    (S.PENDING, S.RUNNING, False, TIME_LIMIT, S.RUNNING),  # a live answer that it runs is current
    (S.RUNNING, S.RUNNING, True, None, S.RUNNING),  # result written, still tearing down
    (S.RUNNING, S.REQUEUED, False, None, S.REQUEUED),
    (S.RUNNING, S.COMPLETED, True, None, S.COMPLETED),
    # Slurm's final word stands: jobgen's batch script already made a step that died after writing its
    # result end with 0 (COMPLETED); a FAILED one with a result.json has an older attempt's result.
    (S.RUNNING, S.FAILED, True, None, S.FAILED),
    (S.RUNNING, S.CANCELLED, True, None, S.CANCELLED),
    (S.RUNNING, S.COMPLETED, False, None, S.FAILED),  # exit 0 without its result is never COMPLETED
    (S.RUNNING, S.COMPLETED, False, HOST_OOM, S.OUT_OF_MEMORY),
    (S.RUNNING, S.FAILED, False, TIME_LIMIT, S.FAILED),  # Slurm's final word stands
    (S.RUNNING, S.TIMEOUT, False, None, S.TIMEOUT),
    (S.RUNNING, S.UNKNOWN, False, TIME_LIMIT, S.TIMEOUT),  # an answer that says nothing is no answer
    (S.RUNNING, None, False, TIME_LIMIT, S.TIMEOUT),  # the disagreement of issue 15: one answer now
    (S.RUNNING, None, False, EXCEPTION, S.FAILED),
    (S.RUNNING, None, False, LAST, S.UNKNOWN),  # a last log line is no diagnosis
    (S.RUNNING, None, False, None, S.UNKNOWN),
    (S.RUNNING, None, True, None, S.COMPLETED),
    (S.PENDING, None, True, None, S.COMPLETED),
    (S.COMPLETED, None, True, None, S.COMPLETED),
    (S.COMPLETED, None, False, None, S.FAILED),  # the local backend's exit 0, no result
    (S.FAILED, None, False, TIME_LIMIT, S.FAILED),
    (S.FAILED, None, True, None, S.COMPLETED),
    (S.CANCELLED, None, False, None, S.CANCELLED),
    (S.PREEMPTED, None, False, None, S.PREEMPTED),
    (S.UNKNOWN, None, False, None, S.UNKNOWN),
]


# Without asking the scheduler at all (a summary of runs copied off the cluster): the last state known.
NOT_ASKED = [
    (S.RUNNING, None, False, None, S.RUNNING),
    (S.SUBMITTED, None, False, None, S.SUBMITTED),
    (S.RUNNING, None, False, TIME_LIMIT, S.TIMEOUT),
    (S.RUNNING, None, True, None, S.COMPLETED),
    (S.COMPLETED, None, False, None, S.FAILED),
]


@pytest.mark.parametrize(("recorded", "live", "finished", "cause", "shown"), NOT_ASKED)
def test_the_state_rule_without_the_scheduler(recorded, live, finished, cause, shown):
    assert job_state(recorded, live, finished, cause, asked=False) is shown


# A recorded end that is the scheduler's own word (a non-zero exit code recorded with it): it stands once
# the scheduler has forgotten the job, as it was shown while the scheduler knew it.
KEPT = [
    (S.FAILED, None, True, None, S.FAILED),
    (S.CANCELLED, None, True, None, S.CANCELLED),
    (S.TIMEOUT, None, True, TIME_LIMIT, S.TIMEOUT),
    (S.FAILED, S.PENDING, True, None, S.PENDING),  # requeued by hand: the live answer is current
    (S.FAILED, S.COMPLETED, True, None, S.COMPLETED),
]


@pytest.mark.parametrize(("recorded", "live", "finished", "cause", "shown"), KEPT)
def test_a_kept_end_stands_without_the_scheduler(recorded, live, finished, cause, shown):
    assert job_state(recorded, live, finished, cause, kept=True) is shown
    assert job_state(recorded, live, finished, cause, asked=False, kept=True) is shown


@pytest.mark.parametrize(("recorded", "live", "finished", "cause", "shown"), CASES)
def test_the_state_rule(recorded: State, live: State | None, finished: bool, cause: Cause | None, shown: State):
    assert job_state(recorded, live, finished, cause) is shown
    if not needs_cause(recorded, live, finished):
        # Where the logs are not asked, they must not matter.
        assert job_state(recorded, live, finished, None) is shown


def _run_with(tmp_path: Path, runner, recorded: str, log: str | None, result: bool, exit_code: str = "") -> Path:
    exp = tmp_path / "one.toml"
    exp.write_text('[launch]\nbackend = "sbatch"\n[data]\ndataset = "synthetic"\n')
    root = tmp_path / "runs"
    assert runner.invoke(main, ["--output-root", str(root), "submit", str(exp), "--dry-run"]).exit_code == 0
    (run_dir,) = (root / "one").iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["dry_run"] = False
    manifest["jobs"][0].update(state=recorded, job_id="99999")
    if exit_code:
        manifest["jobs"][0]["exit_code"] = exit_code
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    job_dir = run_dir / manifest["jobs"][0]["dir"]
    if log:
        (job_dir / "slurm-99999.out").write_text(log)
    if result:
        (job_dir / "result.json").write_text(json.dumps({"schema": 1}))
    return run_dir


@pytest.mark.parametrize(
    ("recorded", "log", "result", "shown", "exit_code"),
    [
        (
            "RUNNING",
            "epoch 1\nslurmstepd: error: *** JOB 99999 ON n1 CANCELLED AT x DUE TO TIME LIMIT ***\n",
            False,
            "TIMEOUT",
            "",
        ),
        ("RUNNING", None, False, "UNKNOWN", ""),
        ("COMPLETED", "training done\n", False, "FAILED", ""),
        ("FAILED", "Traceback\n", True, "COMPLETED", ""),  # no exit code recorded: the logs said FAILED
        ("FAILED", "Traceback\n", True, "COMPLETED", "0:0"),  # Slurm said 0 before the result was seen
        ("FAILED", "Traceback\n", True, "FAILED", "15:0"),  # Slurm's word: the result is an older attempt's
        ("RUNNING", "Traceback (most recent call last):\nValueError: bad\n", False, "FAILED", ""),
    ],
)
def test_status_and_summary_agree(tmp_path: Path, runner, monkeypatch, recorded, log, result, shown, exit_code):
    fake_squeue(monkeypatch, lambda ids: {})  # Slurm has forgotten the job
    run_dir = _run_with(tmp_path, runner, recorded, log, result, exit_code)
    status = runner.invoke(main, ["status", str(run_dir)])
    assert status.exit_code == 0, status.output
    header, row = status.output.splitlines()[1:3]
    shown_by_status = row[header.index("state") :].split()[0]
    summary = runner.invoke(main, ["summary", str(run_dir), "--format", "json"])
    assert summary.exit_code == 0, summary.output
    assert shown_by_status == shown and json.loads(summary.output)["rows"][0]["state"] == shown


@pytest.mark.parametrize("recorded", ["PENDING", "RUNNING"])
def test_a_silent_controller_changes_no_state(tmp_path: Path, runner, bin_dir: Path, recorded: str):
    """squeue and scontrol time out: a result.json in the job's folder may be an earlier attempt's, so the
    job keeps its recorded state (not COMPLETED, and nothing recorded) until Slurm answers again."""
    from tests.core.conftest import stub_tool

    down = "echo 'slurm_load_jobs error: Socket timed out on send/recv operation' >&2; exit 1\n"
    for tool in ("squeue", "scontrol", "sacct"):
        stub_tool(bin_dir, tool, down)
    run_dir = _run_with(tmp_path, runner, recorded, "Traceback\nterminate called\n", True)
    before = (run_dir / "manifest.json").read_bytes()
    for command in (["status", str(run_dir)], ["summary", str(run_dir), "--format", "json"]):
        said = runner.invoke(main, command)
        assert said.exit_code == 0, said.output
        assert f"warning: {run_dir}: Slurm did not answer (squeue failed: slurm_load_jobs error: Socket timed out" in (
            said.stderr
        )
        assert "1 job shows the last state recorded, and none was changed" in said.stderr
    header, row = runner.invoke(main, ["status", str(run_dir)]).stdout.splitlines()[1:3]
    assert row[header.index("state") :].split()[0] == recorded
    assert json.loads(said.stdout)["rows"][0]["state"] == recorded
    assert (run_dir / "manifest.json").read_bytes() == before
    # Slurm answers again: its word (the attempt failed after an earlier attempt's result) is recorded.
    stub_tool(bin_dir, "squeue", "echo '99999|FAILED|0:09|1|n1|2026-01-01T00:00:00|2026-01-01T00:00:09|36608|'\n")
    header, row = runner.invoke(main, ["status", str(run_dir)]).stdout.splitlines()[1:3]
    assert row[header.index("state") :].split()[0] == "FAILED"
    assert json.loads((run_dir / "manifest.json").read_text())["jobs"][0]["state"] == "FAILED"


def _find_cause_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a, **_k):
        raise AssertionError("the logs were read although the cause is recorded")

    monkeypatch.setattr("jobgen.results.collect.find_cause", refuse)
    monkeypatch.setattr("jobgen.results.state_rule.find_cause", refuse)


@pytest.mark.parametrize(
    ("said", "log", "shown", "cause"),
    [
        ("COMPLETED|0:0", "step 3\nnothing more\n", "FAILED", "last log line: nothing more"),  # exit 0, no result
        ("FAILED|1:0", "Traceback (most recent call last):\nValueError: bad lr\n", "FAILED", "ValueError: bad lr"),
        ("FAILED|1:0", None, "FAILED", "no result.json and no log"),
    ],
)
def test_what_the_logs_say_is_recorded_with_the_end_and_read_from_the_record_after(
    tmp_path: Path,
    runner,
    bin_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    said: str,
    log: str | None,
    shown: str,
    cause: str,
):
    """The command that records a job's end without its result reads its logs once for why, and records
    that (secrets taken out) with the job's id: a summary or report after it reads the record, not the
    logs (10,000 ended jobs' logs are 10,000 files to list and read), until `--refresh` or a new end."""
    from tests.core.conftest import stub_tool

    stub_tool(
        bin_dir,
        "squeue",
        f"echo '99999|{said.split('|')[0]}|0:09|1|n1|2026-01-01T00:00:00|2026-01-01T00:00:09|{said.split('|')[1]}|'\n",
    )
    stub_tool(bin_dir, "sacct", "exit 0\n")
    if log:
        log = log.replace("bad lr", "bad lr (key s3cr3t-v4lue-123)")
    run_dir = _run_with(tmp_path, runner, "RUNNING", log, False)
    monkeypatch.setenv("WANDB_API_KEY", "s3cr3t-v4lue-123")  # the jobs had it, and printed it
    assert runner.invoke(main, ["status", str(run_dir)]).exit_code == 0
    (entry,) = json.loads((run_dir / "manifest.json").read_text())["jobs"]
    assert entry["state"] == shown and entry["cause"][0] == "99999", entry
    assert "s3cr3t" not in (run_dir / "manifest.json").read_text()
    with monkeypatch.context() as m:
        _find_cause_refused(m)
        summary = runner.invoke(main, ["summary", str(run_dir), "--format", "json"])
    assert summary.exit_code == 0, summary.output
    (row,) = json.loads(summary.stdout)["rows"]
    assert row["state"] == shown and cause in row["problem"], row
    # --refresh reads the logs again; so does a summary of a record whose cause is damaged.
    for how, damage in ((["--refresh"], None), ([], ["99999", 3])):
        if damage is not None:
            doc = json.loads((run_dir / "manifest.json").read_text())
            doc["jobs"][0]["cause"] = damage
            (run_dir / "manifest.json").write_text(json.dumps(doc))
        with monkeypatch.context() as m:
            _find_cause_refused(m)
            refused = runner.invoke(main, ["summary", str(run_dir), "--format", "json", *how])
        assert "the logs were read" in refused.output, (how, refused.output)


def test_a_cause_recorded_under_an_earlier_id_is_not_taken(tmp_path: Path, runner, bin_dir: Path, monkeypatch):
    from jobgen.record.model import Run
    from jobgen.results.state_rule import kept_cause

    run_dir = _run_with(tmp_path, runner, "FAILED", "Traceback (most recent call last):\nValueError: now\n", False)
    doc = json.loads((run_dir / "manifest.json").read_text())
    doc["jobs"][0]["cause"] = ["12345", "exception", "ValueError: then", "hint", "slurm-12345.out"]
    (run_dir / "manifest.json").write_text(json.dumps(doc))
    (job,) = Run.load(run_dir).jobs
    assert kept_cause(job) == (False, None)
    summary = runner.invoke(main, ["summary", str(run_dir), "--format", "json"])
    assert "ValueError: now" in json.loads(summary.stdout)["rows"][0]["problem"], summary.stdout


def test_a_cause_goes_with_the_end_it_was_read_for(tmp_path: Path, runner, bin_dir: Path):
    """A job recorded FAILED with its cause, whose result.json then turns up (an earlier attempt's was
    restored, a file system caught up): it is COMPLETED, and the cause of the FAILED end is dropped."""
    from tests.core.conftest import stub_tool

    stub_tool(bin_dir, "squeue", "echo '99999|COMPLETED|0:09|1|n1|2026-01-01T00:00:00|2026-01-01T00:00:09|0:0|'\n")
    stub_tool(bin_dir, "sacct", "exit 0\n")
    run_dir = _run_with(tmp_path, runner, "RUNNING", "no result written\n", False)
    assert runner.invoke(main, ["status", str(run_dir)]).exit_code == 0
    (entry,) = json.loads((run_dir / "manifest.json").read_text())["jobs"]
    assert entry["state"] == "FAILED" and entry["cause"][0] == "99999", entry
    (run_dir / entry["dir"] / "result.json").write_text(json.dumps({"schema": 1}))
    assert runner.invoke(main, ["status", str(run_dir)]).exit_code == 0
    (entry,) = json.loads((run_dir / "manifest.json").read_text())["jobs"]
    assert entry["state"] == "COMPLETED" and entry["cause"] is None, entry


@given(
    st.lists(st.sampled_from(["a", "b", "runs", "x.out", ".."]), max_size=4),
    st.lists(st.sampled_from(["a", "b", "runs", "x.out"]), max_size=4),
    st.booleans(),
)
def test_a_causes_log_is_named_as_path_relative_to_names_it(base: list[str], rest: list[str], absolute: bool):
    from pathlib import Path

    from jobgen.results.diagnose import _rel

    root = Path("/" if absolute else ".", *base)
    for path in (root.joinpath(*rest), Path("/elsewhere", *rest)):
        try:
            expected = str(path.relative_to(root))
        except ValueError:
            expected = str(path)
        assert _rel(path, root) == expected


@pytest.mark.parametrize("settled", [False, True], ids=["folder just written", "folder settled"])
@pytest.mark.parametrize("command", ["status", "summary", "report"])
def test_a_result_written_while_slurm_is_asked_is_seen(
    tmp_path: Path, runner, monkeypatch, command: str, settled: bool
):
    """The job's records are read once Slurm has answered (jobgen.results.state_rule.settle): a job that
    writes its result.json while Slurm is asked and has ended by the time it answers is COMPLETED, never
    taken for one that ended without its result (and recorded FAILED for good). Whether the job's folder
    had changed just before (its stamp cannot tell then) or long before (its stamp tells)."""
    import os
    import threading
    import time

    from jobgen.results import state_rule as state
    from jobgen.states import JobInfo

    run_dir = _run_with(tmp_path, runner, "RUNNING", "step 3\n", False)
    job_dir = run_dir / json.loads((run_dir / "manifest.json").read_text())["jobs"][0]["dir"]
    if settled:
        past = time.time() - 60
        for path in [*job_dir.iterdir(), job_dir]:
            os.utime(path, (past, past))
    looked = threading.Event()
    real_look = state.look_at_records

    def look(runs, also=None):
        real_look(runs, also)
        looked.set()

    def query(ids):
        assert not looked.is_set(), "the records were read before Slurm answered"
        result = {
            "schema": 1,
            "test_acc": 0.75,
            "samples": {"test": 4},
            "scored": {"test": 4},
            "finished_at": "2026-01-01T00:00:09Z",
        }
        (job_dir / "result.json").write_text(json.dumps(result))  # then the job ended
        return {
            "99999": JobInfo(State.COMPLETED, "0:09", "1", "n1", "0:0", "2026-01-01T00:00:00", "2026-01-01T00:00:09")
        }

    fake_squeue(monkeypatch, query)
    monkeypatch.setattr("jobgen.results.collect.look_at_records", look)
    args = {"status": [], "summary": ["--format", "json"], "report": ["-o", str(tmp_path / "r.html")]}[command]
    said = runner.invoke(main, [command, str(run_dir), *args])
    assert said.exit_code == 0, said.output
    assert looked.is_set()
    (entry,) = json.loads((run_dir / "manifest.json").read_text())["jobs"]
    assert entry["state"] == "COMPLETED" and "cause" not in entry, entry
    if command == "summary":
        (row,) = json.loads(said.stdout)["rows"]
        assert row["state"] == "COMPLETED" and row["test_acc"] == 0.75, row


def test_a_failure_slurm_reported_stays_once_slurm_forgets_the_job(tmp_path: Path, runner, monkeypatch):
    """A job that aborted although its folder holds an earlier result.json: FAILED while Slurm says so, and
    FAILED after (the job is not asked again, and its old result does not make it COMPLETED)."""
    from jobgen.states import JobInfo

    answers = iter([{"99999": JobInfo(State.FAILED, exit_code="15:0")}, {}, {}])
    fake_squeue(monkeypatch, lambda ids: next(answers))
    run_dir = _run_with(tmp_path, runner, "RUNNING", "srun: error: n2: task 1: Aborted\n", True)
    for command in (["status", str(run_dir)], ["summary", str(run_dir), "--format", "json"]):
        said = runner.invoke(main, command)
        assert said.exit_code == 0, said.output
    assert json.loads(said.output)["rows"][0]["state"] == "FAILED"
    entry = json.loads((run_dir / "manifest.json").read_text())["jobs"][0]
    assert (entry["state"], entry["exit_code"]) == ("FAILED", "15:0")


def test_a_local_run_that_wrote_its_result_then_crashed_is_completed(tmp_path: Path) -> None:
    """The local backend's own guard, as the batch script's: a result this run wrote makes a crash on the
    way out cost nothing; without one, or with an earlier run's, the failure stands."""
    from jobgen.backends.local import LOG_NAME, SCHEDULER

    job_dir = tmp_path / "jobs" / "j"
    job_dir.mkdir(parents=True)
    result = job_dir / "result.json"

    def ends(script: str) -> str:
        entry = {"name": "j", "dir": "jobs/j", "submit_command": ["bash", "-c", script]}
        return str(SCHEDULER.submit(tmp_path, entry)["state"])

    assert ends("exit 134") == "FAILED"
    assert ends(f"echo '{{}}' > {result}; kill -ABRT $$") == "COMPLETED"
    assert "then was killed by SIGABRT on the way out" in (job_dir / LOG_NAME).read_text()
    assert ends("exit 134") == "FAILED"  # the result.json there is the earlier run's
    assert ends(f"echo '{{}}' > {result}.tmp; mv {result}.tmp {result}; exit 1") == "COMPLETED"
