"""Queue limits and waves against stub Slurm tools: the limits read as they apply, the one-line causes,
the sizes of the waves. tests/slurm/test_queue_limits.py runs the same on a real cluster with low limits."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from jobgen.backends import _queue, _tools
from jobgen.cli import main
from jobgen.commands import waves
from jobgen.errors import JobgenError, SubmitError
from tests.support.stub_tools import install_stubs

SCONTROL = """
echo "$*" >> "$STATE/scontrol.log"
if [ "$1" = requeue ]; then echo "$2" >> "$STATE/requeued"; exit 0; fi
if [ "$1 $2" = "show config" ]; then
  printf 'ClusterName = c1\\nMaxJobCount = %s\\nMinJobAge = 300 sec\\nAccountingStorageType = %s\\nAccountingStorageEnforce = %s\\n' \\
    "${MAXJ:-10000}" "${ACCT:-accounting_storage/none}" "${ENFORCE:-none}"
  exit 0
fi
exit 1
"""
# The limits' question (-o %u|%T|%q|%a) gets $STATE/queue; the states' question (-O JobArrayID,...)
# gets $STATE/states (nothing when absent: the jobs have ended).
SQUEUE = """
echo "$*" >> "$STATE/squeue.log"
case "$*" in
  *'%u|%T|%q|%a'*) cat "$STATE/queue" 2>/dev/null ;;
  *JobArrayID*) cat "$STATE/states" 2>/dev/null ;;
esac
exit 0
"""
SACCTMGR = """
case "$*" in
  *"show assoc"*) echo "acct1||10||" ;;
  *"show user"*) echo "acct1" ;;
  *"show qos"*) echo "small|5|" ;;
esac
"""
SBATCH_OK = """
n=$(( $(cat "$STATE/calls" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$STATE/calls"
echo "$(( 100 + n ))"
"""
SBATCH_BUSY = """
echo "sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying" >&2
sleep 120
"""
SBATCH_POLICY = """
echo "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)" >&2
exit 1
"""


def _queue_lines(state: Path, lines: list[str]) -> None:
    (state / "queue").write_text("".join(line + "\n" for line in lines))


def test_max_job_count_counts_every_record_and_keeps_one_back(tmp_path, monkeypatch):
    state = install_stubs(tmp_path, monkeypatch, {"scontrol": SCONTROL, "squeue": SQUEUE})
    monkeypatch.setenv("MAXJ", "20")
    me = _queue.user()
    # Ended jobs and other users' jobs count for MaxJobCount; only the user's queued ones are "yours".
    _queue_lines(state, [f"{me}|RUNNING|normal|a", f"{me}|COMPLETED|normal|a", "bob|PENDING|normal|a"])
    room = _queue.read(_tools.show_config())
    assert room is not None and room.queued == 1
    (limit,) = room.limits
    assert (limit.name, limit.value, limit.counted, limit.room) == ("MaxJobCount", 20, 3, 16)
    assert room.fit_line(16).startswith("queue: all 16 job(s) fit now (slurm.conf MaxJobCount = 20, 3 held")
    assert room.fit_line(17).startswith("queue: 16 of the 17 job(s) fit now (slurm.conf MaxJobCount = 20")


def test_submit_limits_only_where_enforced_and_counted_per_qos(tmp_path, monkeypatch):
    state = install_stubs(tmp_path, monkeypatch, {"scontrol": SCONTROL, "squeue": SQUEUE, "sacctmgr": SACCTMGR})
    me = _queue.user()
    _queue_lines(
        state,
        [f"{me}|PENDING|small|acct1", f"{me}|RUNNING|small|acct1", f"{me}|PENDING|normal|acct1", "bob|PENDING|small|x"],
    )
    assert [lim.name for lim in _queue.read(_tools.show_config(), "small").limits] == [
        "MaxJobCount"
    ]  # enforcement off: ignored
    monkeypatch.setenv("ACCT", "accounting_storage/slurmdbd")
    monkeypatch.setenv("ENFORCE", "associations,limits")
    room = _queue.read(_tools.show_config(), "small")
    by_name = {lim.name: lim for lim in room.limits}
    assert by_name["MaxSubmitJobsPerUser"].counted == 2 and by_name["MaxSubmitJobsPerUser"].room == 3
    assert by_name["MaxSubmitJobs"].counted == 3 and by_name["MaxSubmitJobs"].where == f"association acct1/{me}"
    assert room.room == 3 and room.binding is by_name["MaxSubmitJobsPerUser"]
    assert "queue: 3 of the 7 job(s) fit now (QOS small MaxSubmitJobsPerUser = 5, 2 of yours" in room.fit_line(7)


def test_a_busy_controller_is_named_at_once_not_waited_for(tmp_path, monkeypatch):
    state = install_stubs(tmp_path, monkeypatch, {"scontrol": SCONTROL, "squeue": SQUEUE, "sbatch": SBATCH_BUSY})
    monkeypatch.setenv("MAXJ", "3")
    _queue_lines(state, [f"{_queue.user()}|PENDING|normal|a"] * 2)
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n")
    started = time.monotonic()
    with pytest.raises(SubmitError) as caught:
        _queue.submit(["sbatch", "--parsable", str(script)], "submitting seed-1")
    assert time.monotonic() - started < 10
    message = caught.value.message
    assert message.startswith("submitting seed-1: the controller holds as many jobs as slurm.conf's MaxJobCount")
    assert "MaxJobCount = 3, 2 held" in message and "launch.max_queued" in message and "slurmctld up" not in message
    assert caught.value.maybe_queued  # stopped between two tries, or in one: looked for before a resume


def test_a_policy_refusal_names_the_full_limit(tmp_path, monkeypatch):
    stubs = {"scontrol": SCONTROL, "squeue": SQUEUE, "sacctmgr": SACCTMGR, "sbatch": SBATCH_POLICY}
    state = install_stubs(tmp_path, monkeypatch, stubs)
    monkeypatch.setenv("ACCT", "accounting_storage/slurmdbd")
    monkeypatch.setenv("ENFORCE", "limits")
    _queue_lines(state, [f"{_queue.user()}|PENDING|small|acct1"] * 5)
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --qos=small\n")
    with pytest.raises(SubmitError) as caught:
        _queue.submit(["sbatch", "--parsable", str(script)], "submitting seed-6")
    assert "refused by QOS small MaxSubmitJobsPerUser = 5, 5 of yours queued in QOS small" in caught.value.message
    assert not caught.value.maybe_queued


@pytest.mark.parametrize("enforce", ["limits", "none"])
def test_a_policy_refusal_after_jobs_ended_names_the_likely_limit(tmp_path, monkeypatch, enforce):
    """Jobs that end between sbatch's refusal and jobgen's count leave no limit full: the tightest submit
    limit is named with the count as it is now; with no submit limit enforced, the size or time."""
    stubs = {"scontrol": SCONTROL, "squeue": SQUEUE, "sacctmgr": SACCTMGR, "sbatch": SBATCH_POLICY}
    state = install_stubs(tmp_path, monkeypatch, stubs)
    monkeypatch.setenv("ACCT", "accounting_storage/slurmdbd")
    monkeypatch.setenv("ENFORCE", enforce)
    _queue_lines(state, [f"{_queue.user()}|PENDING|small|acct1"] * 3)
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --qos=small\n")
    with pytest.raises(SubmitError) as caught:
        _queue.submit(["sbatch", "--parsable", str(script)], "submitting seed-4")
    line = caught.value.message
    assert "\n" not in line and "slurmctld up" not in line and "launch.max_queued" in line, line
    assert "Job violates accounting/QOS policy" in line and "sacctmgr show qos" in line, line
    likely = "probably QOS small MaxSubmitJobsPerUser = 5, 3 of yours queued in QOS small now"
    assert (likely in line) == (enforce == "limits"), line


@pytest.mark.parametrize(
    ("entry", "weight"),
    [({"name": "a"}, 1), ({"name": "a", "chain": 3}, 3), ({"name": "a", "tasks": ["x", "y", "z", "w"]}, 4)],
)
def test_array_tasks_and_chain_segments_count_one_each(entry, weight):
    assert waves.weight(entry) == weight


def test_waves_take_whole_entries_in_order():
    entries = [{"name": "a", "tasks": ["1", "2"]}, {"name": "b"}, {"name": "c", "tasks": ["1", "2", "3"]}]
    assert [e["name"] for e in waves._fitting(entries, 3)] == ["a", "b"]
    assert waves._fitting(entries, 1) == []


def test_max_queued_defaults_to_the_room_less_the_reserve():
    qos = _queue.Limit("MaxSubmitJobsPerUser", "QOS q", 10, 4, "")
    count = _queue.Limit("MaxJobCount", "slurm.conf", 100, 20, "", held_back=1)
    assert _queue.max_queued(0, 1, _queue.QueueRoom((qos, count), 4)) == 5
    # MaxJobCount binding: half the room, the other half for the records of ended jobs.
    assert _queue.max_queued(0, 1, _queue.QueueRoom((count,), 4)) == 79 // 2 - 1
    assert _queue.max_queued(7, 1, _queue.QueueRoom((qos,), 4)) == 7  # the user's word
    assert _queue.max_queued(0, 1, _queue.QueueRoom((), 0)) is None
    assert _queue.max_queued(0, 9, _queue.QueueRoom((qos,), 4)) == 1


SWEEP = """
[experiment]
name = "wave"
[data]
dataset = "imdb"
[sweep.grid]
"train.seed" = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
"""


def test_submit_leaves_the_rest_waiting_and_status_tops_up(runner, tmp_path, monkeypatch):
    stubs = {"scontrol": SCONTROL, "squeue": SQUEUE, "sbatch": SBATCH_OK, "sacct": "exit 1\n"}
    state = install_stubs(tmp_path, monkeypatch, stubs)
    monkeypatch.setenv("MAXJ", "9")  # room 8 (one kept back); half of it, less the reserve: 3 at a time
    exp = tmp_path / "wave.toml"
    exp.write_text(SWEEP)
    root = ["--output-root", str(tmp_path / "runs")]
    result = runner.invoke(main, [*root, "validate", str(exp)])
    assert "queue: 8 of the 10 job(s) fit now (slurm.conf MaxJobCount = 9, 0 held" in result.output
    # The dry run says what the submit below does: 3 at once, from the limits (it printed every job's
    # sbatch line alone).
    result = runner.invoke(main, [*root, "submit", str(exp), "--dry-run"])
    assert result.exit_code == 0 and "queue: 8 of the 10 job(s) fit now" in result.output, result.output
    assert result.output.rstrip().endswith(
        "waves: 3 of the 10 job(s) would be queued at once (what the limits leave, less launch.queue_reserve); "
        "the rest would wait as WAITING, each job that ends submitting the next"
    )
    shutil.rmtree(tmp_path / "runs" / "wave")
    result = runner.invoke(main, [*root, "submit", str(exp), "--dry-run", "--set", "launch.max_queued=20"])
    assert "waves:" not in result.output and "queue: 8 of the 10" in result.output, result.output
    shutil.rmtree(tmp_path / "runs" / "wave")
    result = runner.invoke(main, [*root, "submit", str(exp)])
    assert result.exit_code == 0, result.output
    assert "3 job(s) queued, 7 WAITING for room in the queue (at most 3 queued at once)" in result.output
    (run_dir,) = (tmp_path / "runs" / "wave").iterdir()
    jobs = json.loads((run_dir / "manifest.json").read_text())["jobs"]
    assert [j["state"] for j in jobs] == ["SUBMITTED"] * 3 + ["WAITING"] * 7
    assert (run_dir / "waves.json").exists()
    script = (run_dir / jobs[0]["script"]).read_text()
    assert f"{run_dir}/waves.json" in script and "-m jobgen top-up --leaving" in script

    # The three ended (Slurm no longer knows them): status submits the next three and shows the rest.
    result = runner.invoke(main, [*root, "status", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "top-up: submitted 3 waiting job(s) of the sweep; 4 still WAITING" in result.output
    assert result.output.count("WAITING") >= 4 and "PENDING" not in result.output.split("WAITING")[0][-200:]
    result = runner.invoke(main, [*root, "summary", str(run_dir), "--no-combine"])
    assert result.output.count("WAITING") == 4, result.output
    # The controller now holds 8 records: nothing fits, nothing is submitted.
    _queue_lines(state, ["x|COMPLETED|normal|a"] * 8)
    result = runner.invoke(main, [*root, "top-up", str(run_dir)])
    assert "submitted 0, 4 still WAITING" in result.output
    _queue_lines(state, [])
    result = runner.invoke(main, [*root, "submit", "--resume", str(run_dir)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, [*root, "top-up", str(run_dir)])
    assert "submitted 1, 0 still WAITING" in result.output
    assert not (run_dir / "waves.json").exists()
    ids = [j["job_id"] for j in json.loads((run_dir / "manifest.json").read_text())["jobs"]]
    assert ids == [str(101 + i) for i in range(10)]  # each job submitted once


def _asked(state: Path, tool: str, words: str) -> int:
    """How many times the stub `tool` was run with `words` in its arguments."""
    log = state / f"{tool}.log"
    return sum(1 for line in log.read_text().splitlines() if words in line) if log.exists() else 0


def _states(state: Path, running: dict[str, str]) -> None:
    """What squeue says of the run's jobs: job id -> state; the others have ended."""
    fields = "00:05|1|n1|2026-01-01T00:00:00|2026-01-01T01:00:00|0|"
    (state / "states").write_text("".join(f"{jid}|{st}|{fields}\n" for jid, st in running.items()))


def test_the_api_waves_as_the_cli_does_and_submitit_refuses_what_does_not_fit(runner, tmp_path, monkeypatch):
    from jobgen import api

    stubs = {"scontrol": SCONTROL, "squeue": SQUEUE, "sbatch": SBATCH_OK, "sacct": "exit 1\n"}
    state = install_stubs(tmp_path, monkeypatch, stubs)
    monkeypatch.setenv("MAXJ", "9")  # room 8: waves of 3 (half, less the reserve)
    exp = tmp_path / "wave.toml"
    exp.write_text(SWEEP)
    run = api.submit(api.load(exp, backend="sbatch"), output_root=tmp_path / "runs")
    jobs = json.loads((run.path / "manifest.json").read_text())["jobs"]
    assert [j["state"] for j in jobs] == ["SUBMITTED"] * 3 + ["WAITING"] * 7
    assert (state / "calls").read_text().strip() == "3" and (run.path / "waves.json").exists()
    # One `scontrol show config` for the whole call, though the run's room is read twice.
    assert _asked(state, "scontrol", "show config") == 1

    # submitit writes its own batch script (no exit path of jobgen's to submit the next wave): a sweep
    # larger than the room is refused in one line, before any job is submitted.
    with pytest.raises(JobgenError) as caught:
        api.submit(api.load(exp, backend="submitit"), output_root=tmp_path / "runs")
    message = caught.value.message
    assert message.startswith("8 of the 10 job(s) fit in the queue now (slurm.conf MaxJobCount = 9, 0 held")
    assert "the submitit backend cannot submit in waves" in message and "nothing was submitted" in message
    assert (state / "calls").read_text().strip() == "3"
    result = runner.invoke(main, ["--output-root", str(tmp_path / "runs"), "submit", str(exp), "--backend", "submitit"])
    assert result.exit_code == 1 and "the submitit backend cannot submit in waves" in result.output
    refused = [d for d in (tmp_path / "runs" / "wave").iterdir() if d.name != run.path.name]
    assert len(refused) == 2
    for run_dir in refused:
        assert {j["state"] for j in json.loads((run_dir / "manifest.json").read_text())["jobs"]} == {"NOT_SUBMITTED"}


def test_a_top_up_with_no_slot_free_asks_no_limit(runner, tmp_path, monkeypatch):
    stubs = {"scontrol": SCONTROL, "squeue": SQUEUE, "sbatch": SBATCH_OK, "sacct": "exit 1\n"}
    state = install_stubs(tmp_path, monkeypatch, stubs)
    monkeypatch.setenv("MAXJ", "9")
    exp = tmp_path / "wave.toml"
    exp.write_text(SWEEP)
    root = ["--output-root", str(tmp_path / "runs")]
    assert runner.invoke(main, [*root, "submit", str(exp)]).exit_code == 0
    # The room read before the first wave and again under the run's lock: one scontrol for both.
    assert _asked(state, "scontrol", "show config") == 1 and _asked(state, "squeue", "%u|%T|%q|%a") == 2
    (run_dir,) = (tmp_path / "runs" / "wave").iterdir()
    # The three queued, one of them leaving: a slot for the next, so the limits are read (once).
    _states(state, {"101": "RUNNING", "102": "PENDING", "103": "RUNNING"})
    result = runner.invoke(main, [*root, "top-up", "--leaving", "103", str(run_dir)])
    assert "submitted 1, 6 still WAITING" in result.output, result.output
    assert _asked(state, "scontrol", "show config") == 2 and _asked(state, "squeue", "%u|%T|%q|%a") == 3
    # max_queued jobs queued and none leaving: nothing can be submitted, so neither scontrol nor the
    # everyone's squeue is asked (status and every ending job top up: that is most top-ups of a sweep).
    _states(state, {"101": "RUNNING", "102": "PENDING", "104": "PENDING"})
    result = runner.invoke(main, [*root, "top-up", str(run_dir)])
    assert "submitted 0, 6 still WAITING" in result.output, result.output
    assert _asked(state, "scontrol", "show config") == 2 and _asked(state, "squeue", "%u|%T|%q|%a") == 3


HALVING = """
[experiment]
name = "halve"
[train]
model = "builtin:tiny"
engine = "torch"
epochs = 3
[data]
dataset = "builtin:synthetic"
[launch]
max_queued = 1
[sweep.grid]
"train.seed" = [1, 2, 3, 4]
[sweep.halving]
rungs = [1]
eta = 2
"""


def _shown(output: str) -> dict[str, str]:
    """job -> the state column of `jobgen status`."""
    return {cells[0]: cells[3] for cells in (line.split() for line in output.splitlines()) if cells[:1] != ["run:"]}


def test_halving_in_waves_a_promoted_job_waits_for_a_slot_and_a_paused_one_frees_its_own(runner, tmp_path, monkeypatch):
    from training import halving

    stubs = {"scontrol": SCONTROL, "squeue": SQUEUE, "sbatch": SBATCH_OK, "sacct": "exit 1\n"}
    state = install_stubs(tmp_path, monkeypatch, stubs)
    exp = tmp_path / "halve.toml"
    exp.write_text(HALVING)
    root = ["--output-root", str(tmp_path / "runs")]
    result = runner.invoke(main, [*root, "submit", str(exp)])
    assert result.exit_code == 0 and "1 job(s) queued, 3 WAITING" in result.output, result.output
    (run_dir,) = (tmp_path / "runs" / "halve").iterdir()
    script = (run_dir / "jobs" / "seed-1" / "job.sbatch").read_text()
    # A job that pauses at a rung leaves the queue: on its way out it tops the sweep up, as any ending job.
    assert 'a promotion requeues the job"\n        jobgen_next_wave || true\n        exit 0' in script
    base, found = halving.root(run_dir), halving.Settings((1,), 2, "val_acc", "max")

    # seed-1 (101) reaches the rung first: nothing to compare it with, it pauses and submits seed-2.
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    assert not halving.at_rung(base, found, "seed-1", 1, 0.9, tmp_path / "ck1")
    _states(state, {"101": "RUNNING"})
    result = runner.invoke(main, [*root, "top-up", "--leaving", "101", str(run_dir)])
    assert "submitted 1, 2 still WAITING" in result.output, result.output

    # seed-2 (102) does worse: seed-1 is promoted, but the one slot is seed-2's. In a run that waves
    # neither the job that promotes nor `jobgen status` requeues it then.
    monkeypatch.setenv("SLURM_JOB_ID", "102")
    _states(state, {"101": "COMPLETED", "102": "RUNNING"})
    assert not halving.at_rung(base, found, "seed-2", 1, 0.5, tmp_path / "ck2")
    assert halving.is_promoted(base, 1, "seed-1")
    result = runner.invoke(main, [*root, "status", str(run_dir)])
    assert result.exit_code == 0, result.output
    shown = _shown(result.output)
    assert (shown["seed-1"], shown["seed-2"], shown["seed-3"], shown["seed-4"]) == (
        "WAITING@1",  # promoted past rung 1, waits for a slot to resume
        "RUNNING",
        "WAITING",  # never submitted
        "WAITING",
    ), result.output
    assert not (state / "requeued").exists()

    # seed-2 pauses: its slot goes to seed-1, requeued once; no new job is submitted beside it.
    result = runner.invoke(main, [*root, "top-up", "--leaving", "102", str(run_dir)])
    assert "submitted 0, requeued 1 promoted job(s), 2 still WAITING" in result.output, result.output
    assert (state / "requeued").read_text().split() == ["101"] and (state / "calls").read_text().strip() == "2"
    _states(state, {"101": "PENDING", "102": "COMPLETED"})
    shown = _shown(runner.invoke(main, [*root, "status", str(run_dir)]).output)
    assert (shown["seed-1"], shown["seed-2"], shown["seed-3"]) == ("PENDING", "PAUSED@1", "WAITING")
    assert (state / "requeued").read_text().split() == ["101"] and (state / "calls").read_text().strip() == "2"


def test_cancel_stops_a_sweep_in_waves_and_its_halving_until_a_requeue(runner, tmp_path, monkeypatch):
    """Found on the test cluster: `jobgen cancel` of a sweep in waves cancelled the queued jobs, and
    each of them, on its way out, submitted the waiting ones (so did the next status): the sweep went
    on. Now nothing of a cancelled run is submitted, promoted or requeued until `jobgen requeue`."""
    from training import halving

    stubs = {
        "scontrol": SCONTROL,
        "squeue": SQUEUE,
        "sbatch": SBATCH_OK,
        "sacct": "exit 1\n",
        "scancel": 'echo "$*" >> "$STATE/scancel.log"\n',
    }
    state = install_stubs(tmp_path, monkeypatch, stubs)
    exp = tmp_path / "halve.toml"
    exp.write_text(HALVING)
    root = ["--output-root", str(tmp_path / "runs")]
    assert "1 job(s) queued, 3 WAITING" in runner.invoke(main, [*root, "submit", str(exp)]).output
    (run_dir,) = (tmp_path / "runs" / "halve").iterdir()
    base, found = halving.root(run_dir), halving.Settings((1,), 2, "val_acc", "max")
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    assert not halving.at_rung(base, found, "seed-1", 1, 0.4, tmp_path / "ck1")
    _states(state, {"101": "RUNNING"})
    assert (
        "submitted 1, 2 still WAITING"
        in runner.invoke(main, [*root, "top-up", "--leaving", "101", str(run_dir)]).output
    )
    _states(state, {"102": "RUNNING"})

    # A waiting job named is not submitted, the sweep goes on; a name not in the run changes nothing.
    result = runner.invoke(main, [*root, "cancel", str(run_dir), "seed-4", "seed-9"])
    assert result.exit_code == 1 and "no job 'seed-9'" in result.output, result.output
    result = runner.invoke(main, [*root, "cancel", str(run_dir), "seed-4"])
    assert result.exit_code == 0 and "seed-4: WAITING, cancelled: it will not be submitted" in result.output
    assert "1 job(s) cancelled" in result.output and (run_dir / "waves.json").exists()
    assert not (state / "scancel.log").exists()
    result = runner.invoke(main, [*root, "cancel", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "seed-3: WAITING, cancelled: it will not be submitted" in result.output
    assert "3 job(s) cancelled" in result.output and "102" in (state / "scancel.log").read_text()
    assert not (run_dir / "waves.json").exists() and halving.cancelled(base)
    # seed-2, cancelled before its rung, leaves as any job: its top-up submits nothing.
    _states(state, {"101": "COMPLETED", "102": "CANCELLED"})
    result = runner.invoke(main, [*root, "top-up", "--leaving", "102", str(run_dir)])
    assert result.exit_code == 0 and "submitted 0, 0 still WAITING" in result.output, result.output
    result = runner.invoke(main, [*root, "status", str(run_dir)])
    assert result.exit_code == 0, result.output
    shown = _shown(result.output)
    assert (shown["seed-1"], shown["seed-2"], shown["seed-3"], shown["seed-4"]) == (
        "STOPPED@1",
        "CANCELLED",
        "CANCELLED",
        "CANCELLED",
    ), result.output
    assert (state / "calls").read_text().strip() == "2" and not (state / "requeued").exists()

    # A requeue starts the run again, the rule with it; a job never submitted stays out.
    result = runner.invoke(main, [*root, "requeue", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "seed-3 (CANCELLED, job -): skipped: cancelled before it was submitted; jobgen rerun" in result.output
    assert f"jobgen rerun {run_dir} runs the sweep again in a new run" in result.output  # eta: not 1 job
    assert (state / "requeued").read_text().split() == ["102"] and not halving.cancelled(base)
    monkeypatch.setenv("SLURM_JOB_ID", "102")
    assert halving.at_rung(base, found, "seed-2", 1, 0.9, tmp_path / "ck2")  # the better: it goes on


def test_a_full_submit_limit_of_the_user_asks_only_the_users_jobs(runner, tmp_path, monkeypatch):
    stubs = {"scontrol": SCONTROL, "squeue": SQUEUE, "sacctmgr": SACCTMGR, "sbatch": SBATCH_OK, "sacct": "exit 1\n"}
    state = install_stubs(tmp_path, monkeypatch, stubs)
    monkeypatch.setenv("ACCT", "accounting_storage/slurmdbd")
    monkeypatch.setenv("ENFORCE", "associations,limits")
    exp = tmp_path / "wave.toml"
    exp.write_text(SWEEP)
    root = ["--output-root", str(tmp_path / "runs")]
    sets = ["--set", "slurm.qos=small", "--set", "launch.max_queued=4"]
    result = runner.invoke(main, [*root, "submit", str(exp), *sets])
    assert result.exit_code == 0 and "4 job(s) queued, 6 WAITING" in result.output, result.output
    (run_dir,) = (tmp_path / "runs" / "wave").iterdir()
    everyone = _asked(state, "squeue", "-t all -o %u|%T|%q|%a")  # every user's jobs: MaxJobCount counts them
    own = _asked(state, "squeue", f"-u {_queue.user()} -o %u|%T|%q|%a")
    # The four ended; five other jobs of the user fill the QOS's MaxSubmitJobsPerUser = 5. The user's
    # own jobs show that nothing fits: every user's jobs are not asked.
    _queue_lines(state, [f"{_queue.user()}|PENDING|small|acct1"] * 5)
    result = runner.invoke(main, [*root, "top-up", str(run_dir)])
    assert "submitted 0, 6 still WAITING" in result.output, result.output
    assert "(QOS small MaxSubmitJobsPerUser = 5, 5 of yours queued in QOS small)" in result.output
    assert _asked(state, "squeue", "-t all -o %u|%T|%q|%a") == everyone
    assert _asked(state, "squeue", f"-u {_queue.user()} -o %u|%T|%q|%a") == own + 1
    # Room again under the user's limits: MaxJobCount needs every user's jobs, and they are asked.
    _queue_lines(state, [f"{_queue.user()}|PENDING|small|acct1"] * 2)
    result = runner.invoke(main, [*root, "top-up", str(run_dir)])
    assert "submitted 3, 3 still WAITING" in result.output, result.output
    assert _asked(state, "squeue", "-t all -o %u|%T|%q|%a") == everyone + 1


def test_a_rerun_of_more_jobs_than_fit_submits_in_waves(runner, tmp_path, monkeypatch):
    stubs = {"scontrol": SCONTROL, "squeue": SQUEUE, "sbatch": SBATCH_OK, "sacct": "exit 1\n"}
    state = install_stubs(tmp_path, monkeypatch, stubs)
    exp = tmp_path / "wave.toml"
    exp.write_text(SWEEP)
    root = ["--output-root", str(tmp_path / "runs")]
    assert runner.invoke(main, [*root, "submit", str(exp)]).exit_code == 0  # room for all 10
    (old,) = (tmp_path / "runs" / "wave").iterdir()
    monkeypatch.setenv("MAXJ", "9")  # room 8: waves of 3, as a submit of the same sweep
    result = runner.invoke(main, [*root, "rerun", str(old), "--dry-run"])  # says so first
    assert result.output.rstrip().endswith(
        "waves: 3 of the 10 job(s) would be queued at once (what the limits leave, less launch.queue_reserve); "
        "the rest would wait as WAITING, each job that ends submitting the next"
    ), result.output
    shutil.rmtree(next(d for d in (tmp_path / "runs" / "wave").iterdir() if d != old))
    result = runner.invoke(main, [*root, "rerun", str(old)])
    assert result.exit_code == 0, result.output
    assert "queue: 8 of the 10 job(s) fit now (slurm.conf MaxJobCount = 9, 0 held" in result.output
    assert "3 job(s) queued, 7 WAITING for room in the queue (at most 3 queued at once)" in result.output
    (new,) = (d for d in (tmp_path / "runs" / "wave").iterdir() if d != old)
    jobs = json.loads((new / "manifest.json").read_text())["jobs"]
    assert [j["state"] for j in jobs] == ["SUBMITTED"] * 3 + ["WAITING"] * 7
    assert f"{new}/waves.json" in (new / jobs[0]["script"]).read_text()
    # The queued ones ended: each top-up submits what fits, each waiting job once.
    for waiting in (4, 1, 0):
        result = runner.invoke(main, [*root, "top-up", str(new)])
        assert f", {waiting} still WAITING" in result.output, result.output
    ids = [j["job_id"] for j in json.loads((new / "manifest.json").read_text())["jobs"]]
    assert ids == [str(111 + i) for i in range(10)] and (state / "calls").read_text().strip() == "20"
    assert not (new / "waves.json").exists()


def test_a_probe_waves_on_sbatch_and_refuses_in_one_line_on_submitit(tmp_path, monkeypatch):
    from jobgen.commands import probe
    from jobgen.errors import WaitTimeout

    stubs = {"scontrol": SCONTROL, "squeue": SQUEUE, "sbatch": SBATCH_OK, "sacct": "exit 1\n"}
    state = install_stubs(tmp_path, monkeypatch, stubs)
    monkeypatch.setenv("MAXJ", "9")
    exp = tmp_path / "wave.toml"
    exp.write_text(SWEEP)
    made: list[Path] = []
    said: list[str] = []
    with pytest.raises(WaitTimeout):  # the stub sbatch runs nothing: the probe's jobs never end
        probe.probe(
            exp, tmp_path / "runs", backend="sbatch", timeout=0.2, interval=0.1, on_run=made.append, say=said.append
        )
    assert said == [said[0]] and said[0].startswith("queue: 8 of the 10 job(s) fit now (slurm.conf MaxJobCount = 9")
    jobs = json.loads((made[0] / "manifest.json").read_text())["jobs"]
    assert [j["job_id"] for j in jobs] == ["101", "102", "103"] + [None] * 7
    assert [j["state"] for j in jobs][3:] == ["WAITING"] * 7
    assert (state / "calls").read_text().strip() == "3" and (made[0] / "waves.json").exists()

    with pytest.raises(JobgenError) as caught:
        probe.probe(exp, tmp_path / "runs", backend="submitit", timeout=0.2, interval=0.1, on_run=made.append)
    message = caught.value.message
    assert "\n" not in message and "the submitit backend cannot submit in waves" in message
    assert message.startswith("8 of the 10 job(s) fit in the queue now (slurm.conf MaxJobCount = 9, 0 held")
    assert (state / "calls").read_text().strip() == "3"
    assert {j["state"] for j in json.loads((made[1] / "manifest.json").read_text())["jobs"]} == {"NOT_SUBMITTED"}


def test_a_submitit_job_refused_for_a_limit_names_it(tmp_path, monkeypatch):
    from jobgen import api

    # Five jobs of the user's arrive in QOS small between the room's reading and the submission.
    sbatch = 'for n in 1 2 3 4 5; do echo "$(id -un)|PENDING|small|acct1" >> "$STATE/queue"; done\n' + SBATCH_POLICY
    stubs = {"scontrol": SCONTROL, "squeue": SQUEUE, "sacctmgr": SACCTMGR, "sbatch": sbatch, "sacct": "exit 1\n"}
    install_stubs(tmp_path, monkeypatch, stubs)
    monkeypatch.setenv("ACCT", "accounting_storage/slurmdbd")
    monkeypatch.setenv("ENFORCE", "limits")
    exp = tmp_path / "wave.toml"
    exp.write_text(SWEEP.replace("[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]", "[1, 2]"))  # room for both when read
    with pytest.raises(SubmitError) as caught:
        api.submit(api.load(exp, backend="submitit", sets=["slurm.qos=small"]), output_root=tmp_path / "runs")
    message = caught.value.message
    assert message.startswith("submitting seed-1: refused by QOS small MaxSubmitJobsPerUser = 5, 5 of yours")
    assert "launch.max_queued" in message and "\n" not in message and "submitit:" not in message


def test_a_halving_sweep_of_chains_that_does_not_fit_is_refused_not_waved(runner, tmp_path, monkeypatch):
    """A paused chain keeps its held segments queued: in waves the paused jobs would fill every slot and
    the sweep would stall. So it is refused in one line, before anything is submitted; one that fits goes."""
    stubs = {"scontrol": SCONTROL, "squeue": SQUEUE, "sbatch": SBATCH_OK, "sacct": "exit 1\n"}
    state = install_stubs(tmp_path, monkeypatch, stubs)
    exp = tmp_path / "halve.toml"
    exp.write_text(HALVING.replace("max_queued = 1", "max_queued = 7\n[slurm]\nchain = 2"))
    root = ["--output-root", str(tmp_path / "runs")]
    result = runner.invoke(main, [*root, "submit", str(exp)])
    assert result.exit_code != 0, result.output
    said = result.output.strip().splitlines()[-1]
    assert "8 segments do not fit in the queue (7 may be queued) and a halving sweep of chains cannot wave" in said
    assert not (state / "calls").exists()  # nothing submitted
    exp.write_text(HALVING.replace("max_queued = 1", "max_queued = 8\n[slurm]\nchain = 2"))
    result = runner.invoke(main, [*root, "submit", str(exp)])
    assert result.exit_code == 0, result.output
    assert (state / "calls").read_text().strip() == "8"
