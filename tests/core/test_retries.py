"""slurm.retries without a cluster: the batch shell of a real jobgen sbatch script (templates/_retry.j2)
run with stand-ins for srun, scontrol and sinfo. Which failures it retries, what it asks Slurm, the
record it keeps (retries.json), and how status and summary show it. tests/slurm/test_retries.py runs
the same scripts on the real cluster."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from jobgen.cli import main
from tests.support.stub_tools import install_stubs

# scontrol's stand-in: `show job` answers with $JOB_STATE (RUNNING unless told) and $EXC (the job's
# ExcNodeList), `show hostnames` splits a comma list; every call is logged.
SCONTROL = textwrap.dedent(
    """\
    echo "scontrol $*" >>"$STATE/calls"
    case "$1 $2" in
        "show job") echo "JobId=40 JobName=x JobState=${JOB_STATE:-RUNNING} Reason=None ExcNodeList=${EXC:-(null)} PreemptEligibleTime=2026-12-01T17:00:00 PreemptTime=${PREEMPT_TIME:-None} Restarts=0" ;;
        "show hostnames") tr ',' '\\n' <<<"${3:-$SLURM_JOB_NODELIST}" ;;
        "requeue "*) [ -z "${REFUSE:-}" ] || { echo "Requeue of JobId=$2 failed: disabled" >&2; exit 1; } ;;
    esac
    exit 0
    """
)
SRUN = textwrap.dedent(
    """\
    echo "srun on $SLURMD_NODENAME" >>"$STATE/calls"
    case "$BEHAVE" in
        ok) echo '{"schema": 1}' >"$JOB_DIR/result.json"; exit 0 ;;
        noresult) exit 0 ;;
        requeue) mkdir -p "$JOB_DIR/checkpoints"; echo x >"$JOB_DIR/checkpoints/.requeue-40-0"; exit 75 ;;
        fail) echo boom >&2; exit 3 ;;
    esac
    """
)
STUBS = {
    "srun": SRUN,
    "scontrol": SCONTROL,
    "sinfo": 'echo "sinfo $*" >>"$STATE/calls"\ntr " " "\\n" <<<"${PARTITION_NODES-n1 n2 n3}"\n',
    "scancel": 'echo "scancel $*" >>"$STATE/calls"\n',
}
EXPERIMENT = """
[experiment]
name = "rt"
[slurm]
retries = {retries}
requeue = {requeue}
[train]
model = "builtin:tiny"
[data]
dataset = "builtin:synthetic"
"""


@pytest.fixture
def submitted(tmp_path: Path, runner):
    """Submit (dry run) the retrying experiment; returns (run folder, script, job folder)."""

    def make(retries: int = 2, requeue: bool = False) -> tuple[Path, Path, Path]:
        exp = tmp_path / "rt.toml"
        exp.write_text(EXPERIMENT.format(retries=retries, requeue=str(requeue).lower()))
        out = tmp_path / "runs"
        result = runner.invoke(main, ["--output-root", str(out), "submit", str(exp), "--dry-run"])
        assert result.exit_code == 0, result.output
        (run_dir,) = (out / "rt").iterdir()
        job = json.loads((run_dir / "manifest.json").read_text())["jobs"][0]
        return run_dir, run_dir / job["script"], run_dir / job["dir"]

    return make


def _attempt(script: Path, job_dir: Path, tmp_path: Path, monkeypatch, behave: str, node: str = "n1", **env: str):
    """One attempt of the job on `node`: (completed process, the Slurm calls it made)."""
    state = tmp_path / "state"
    if not state.exists():
        install_stubs(tmp_path, monkeypatch, STUBS)
    (state / "calls").write_text("")
    full = {
        **os.environ,
        "BEHAVE": behave,
        "JOB_DIR": str(job_dir),
        "SLURM_JOB_ID": "40",
        "SLURM_JOB_NODELIST": node,
        "SLURMD_NODENAME": node,
        "SLURM_JOB_NUM_NODES": str(len(node.split(","))),
        "SLURM_JOB_PARTITION": "debug",
        "SLURM_CPUS_PER_TASK": "1",
        **env,
    }
    done = subprocess.run(["bash", str(script)], env=full, capture_output=True, text=True, timeout=60)
    return done, (state / "calls").read_text().splitlines()


def _record(job_dir: Path) -> dict:
    return json.loads((job_dir / "retries.json").read_text())


def test_a_failure_is_requeued_away_from_its_node_and_exclusion_accumulates(submitted, tmp_path, monkeypatch):
    _, script, job_dir = submitted(retries=2)
    done, calls = _attempt(script, job_dir, tmp_path, monkeypatch, "fail", "n1")
    assert done.returncode == 3, done.stderr  # the attempt's own status stays
    assert calls[-2:] == ["scontrol requeue 40", "scontrol update JobId=40 ExcNodeList=n1"], calls
    assert "retry 1 of 2, excluding n1: scontrol requeue 40" in done.stdout
    assert _record(job_dir) == {"schema": 1, "retries": 1, "limit": 2, "excluded": ["n1"], "stopped": None}
    assert not list(job_dir.glob("retries.json.tmp"))  # written whole, then renamed

    # The second attempt fails elsewhere: both nodes are excluded, and the job's own --exclude stays.
    done, calls = _attempt(
        script, job_dir, tmp_path, monkeypatch, "fail", "n2", EXC="n9", PARTITION_NODES="n1 n2 n3 n9"
    )
    assert calls[-2:] == ["scontrol requeue 40", "scontrol update JobId=40 ExcNodeList=n1,n2,n9"], calls
    assert _record(job_dir)["retries"] == 2 and _record(job_dir)["excluded"] == ["n1", "n2"]

    # The third fails too: its 2 retries are used up, and nothing is asked of Slurm but the job's state.
    done, calls = _attempt(script, job_dir, tmp_path, monkeypatch, "fail", "n3", PARTITION_NODES="n1 n2 n3 n4")
    assert done.returncode == 3
    assert not [c for c in calls if c.startswith(("scontrol requeue", "scontrol update"))], calls
    assert "its retries are used up (2 of 2): not retried" in done.stderr
    assert _record(job_dir) == {
        "schema": 1,
        "retries": 2,
        "limit": 2,
        "excluded": ["n1", "n2"],
        "stopped": "retries used up",
    }


def test_no_retry_that_would_exclude_every_node_of_the_partition(submitted, tmp_path, monkeypatch):
    _, script, job_dir = submitted(retries=5)
    _attempt(script, job_dir, tmp_path, monkeypatch, "fail", "n1", PARTITION_NODES="n1 n2")
    done, calls = _attempt(script, job_dir, tmp_path, monkeypatch, "fail", "n2", PARTITION_NODES="n1 n2")
    assert done.returncode == 3
    assert "scontrol requeue 40" not in calls, calls
    assert "would leave 0 of the 2 nodes of partition debug for a job of 1 node(s)" in done.stderr
    assert _record(job_dir)["retries"] == 1 and _record(job_dir)["stopped"] == "no node left to retry on"


def test_no_retry_where_sinfo_lists_no_node(submitted, tmp_path, monkeypatch):
    _, script, job_dir = submitted(retries=2)
    done, calls = _attempt(script, job_dir, tmp_path, monkeypatch, "fail", "n1", PARTITION_NODES="")
    assert "scontrol requeue 40" not in calls and "sinfo did not list the nodes of partition debug" in done.stderr


def test_a_two_node_job_excludes_both_and_needs_two_nodes_left(submitted, tmp_path, monkeypatch):
    _, script, job_dir = submitted(retries=3)
    done, calls = _attempt(script, job_dir, tmp_path, monkeypatch, "fail", "n1,n2", PARTITION_NODES="n1 n2 n3 n4")
    assert calls[-1] == "scontrol update JobId=40 ExcNodeList=n1,n2", calls
    done, calls = _attempt(script, job_dir, tmp_path, monkeypatch, "fail", "n3,n4", PARTITION_NODES="n1 n2 n3 n4 n5")
    assert "scontrol requeue 40" not in calls  # one node left for a job of two
    assert "would leave 1 of the 5 nodes" in done.stderr and "for a job of 2 node(s)" in done.stderr


@pytest.mark.parametrize(
    ("behave", "env", "rc", "said"),
    [
        ("ok", {}, 0, ""),  # succeeded
        ("fail", {"JOB_STATE": "CANCELLED"}, 3, "the job is CANCELLED: not retried"),
        ("fail", {"JOB_STATE": "TIMEOUT"}, 3, "the job is TIMEOUT: not retried"),
        ("fail", {"PREEMPT_TIME": "2026-12-01T17:01:00"}, 3, "while the job is being preempted: not retried"),
        ("fail", {"REFUSE": "1"}, 3, "scontrol requeue 40 failed: not retried"),
    ],
)
def test_what_is_not_retried(submitted, tmp_path, monkeypatch, behave, env, rc, said) -> None:
    _, script, job_dir = submitted(retries=2)
    done, calls = _attempt(script, job_dir, tmp_path, monkeypatch, behave, **env)
    assert done.returncode == rc, done.stderr
    assert said in done.stderr
    assert not [c for c in calls if c.startswith("scontrol update")], calls
    if behave == "ok":
        assert calls == ["scontrol show hostnames n1", "srun on n1"], calls  # not even asked
        assert not (job_dir / "retries.json").exists()


def test_ending_without_a_result_is_a_failure_and_a_refused_requeue_is_not_counted(submitted, tmp_path, monkeypatch):
    _, script, job_dir = submitted(retries=2)
    done, calls = _attempt(script, job_dir, tmp_path, monkeypatch, "noresult")
    assert "the step ended without the job's result.json" in done.stdout and "scontrol requeue 40" in calls
    done, calls = _attempt(script, job_dir, tmp_path, monkeypatch, "fail", "n2", REFUSE="1")
    assert _record(job_dir)["retries"] == 1 and _record(job_dir)["stopped"] == "scontrol requeue failed"


def test_leaving_for_a_requeue_on_the_warning_signal_is_no_failure(submitted, tmp_path, monkeypatch):
    _, script, job_dir = submitted(retries=2, requeue=True)
    done, calls = _attempt(script, job_dir, tmp_path, monkeypatch, "requeue")
    assert done.returncode == 75, done.stderr
    assert calls.count("scontrol requeue 40") == 1 and not (job_dir / "retries.json").exists(), calls


def test_an_array_task_names_itself(submitted, tmp_path, monkeypatch):
    _, script, job_dir = submitted(retries=1)
    done, calls = _attempt(
        script, job_dir, tmp_path, monkeypatch, "fail", SLURM_ARRAY_JOB_ID="40", SLURM_ARRAY_TASK_ID="2"
    )
    assert "scontrol requeue 40_2" in calls and calls[-1] == "scontrol update JobId=40_2 ExcNodeList=n1", calls


def test_a_damaged_record_stops_the_retries(submitted, tmp_path, monkeypatch):
    _, script, job_dir = submitted(retries=2)
    (job_dir / "retries.json").write_text("garbage")
    done, calls = _attempt(script, job_dir, tmp_path, monkeypatch, "fail")
    assert "retries.json is unreadable: not retried" in done.stderr and "scontrol requeue 40" not in calls


def test_status_and_summary_show_retries_and_excluded_nodes(submitted, runner, tmp_path, monkeypatch):
    run_dir, script, job_dir = submitted(retries=2)
    _attempt(script, job_dir, tmp_path, monkeypatch, "fail", "n1")
    _attempt(script, job_dir, tmp_path, monkeypatch, "fail", "n2")
    _attempt(script, job_dir, tmp_path, monkeypatch, "ok", "n3")
    status = runner.invoke(main, ["status", str(run_dir)])
    assert status.exit_code == 0, status.output
    header, row = status.output.splitlines()[1:3]
    assert "retries" in header.split() and "2/2 excl n1,n2" in row, status.output
    doc = json.loads(runner.invoke(main, ["summary", str(run_dir), "--format", "json"]).output)
    (line,) = doc["rows"]
    assert line["retries"] == 2 and line["excluded_nodes"] == "n1,n2", line
    text = runner.invoke(main, ["summary", str(run_dir), "--format", "csv"]).output
    (fields,) = csv.DictReader(io.StringIO(text))
    assert fields["retries"] == "2" and fields["excluded_nodes"] == "n1,n2", fields
    table = runner.invoke(main, ["summary", str(run_dir), "--format", "markdown"]).output
    assert "| retries |" in table and "retried away from n1, n2" in table, table


def test_retries_need_a_backend_whose_script_can_requeue(tmp_path, runner):
    exp = tmp_path / "rt.toml"
    exp.write_text(EXPERIMENT.format(retries=1, requeue="false") + '[launch]\nbackend = "local"\n')
    result = runner.invoke(main, ["validate", str(exp)])
    assert result.exit_code == 1
    assert "slurm.retries" in result.output and "launch.backend = 'sbatch'" in result.output
    exp.write_text(EXPERIMENT.format(retries=101, requeue="false"))
    result = runner.invoke(main, ["validate", str(exp)])
    assert result.exit_code == 1 and "slurm.retries" in result.output and "100" in result.output, result.output
