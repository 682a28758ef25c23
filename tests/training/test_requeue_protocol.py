"""The requeue protocol without a cluster: which id a job requeues (an array task names itself, never
the array), the marker rank 0 leaves, the relay's launcher environment, and the batch shell of jobgen's
sbatch script (templates/_requeue.j2) run for real with stand-ins for srun, scontrol and scancel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.stub_tools import install_stubs
from training import relay, requeue


@pytest.mark.parametrize(
    ("env", "target"),
    [
        ({"SLURM_JOB_ID": "41"}, "41"),
        # The task that carries the array's id: its bare id would requeue every task of the array.
        ({"SLURM_JOB_ID": "40", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "2"}, "40_2"),
        ({"SLURM_JOB_ID": "42", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "0"}, "40_0"),
        ({}, None),
    ],
)
def test_requeue_target_names_the_array_task(env: dict[str, str], target: str | None) -> None:
    assert requeue.requeue_target(env) == target


def test_marker_is_per_job_and_attempt(tmp_path: Path) -> None:
    first = requeue.marker(tmp_path, {"SLURM_JOB_ID": "7"})
    again = requeue.marker(tmp_path, {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"})
    assert first.name == ".requeue-7-0" and again.name == ".requeue-7-1"
    first.write_text("x\n")
    assert requeue.newest_checkpoint(tmp_path) is None  # a marker is no checkpoint


@pytest.fixture(autouse=True)
def _handlers_kept() -> object:
    """leave_for_requeue ignores the warning signals of the process it runs in: this test's, here."""
    kept = {number: signal.getsignal(number) for number in (signal.SIGUSR2, signal.SIGTERM)}
    yield
    for number, handler in kept.items():
        signal.signal(number, handler)


# A rank that leaves for a requeue while its interpreter shuts down slowly (torch's teardown can take
# seconds): the warning that comes meanwhile must not kill it.
LEAVING = """
import signal, sys, time
from training import requeue
requeue.Watcher().install_all("USR2")
class SlowTeardown:
    def __del__(self):
        print("shutting down", flush=True)
        time.sleep(1.5)
kept = SlowTeardown()
requeue.leave_for_requeue(0, __import__("pathlib").Path(sys.argv[1]), "USR2")
"""


def test_a_leaving_rank_outlives_the_warnings_that_come_while_it_shuts_down(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.Popen(
        [sys.executable, "-c", LEAVING, str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "shutting down"  # the interpreter put the default handlers back
    for number in (signal.SIGUSR2, signal.SIGTERM):  # as training.relay passes them on, again and again
        proc.send_signal(number)
    assert proc.wait(timeout=30) == requeue.EXIT_REQUEUE


def _slurm_env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for key, value in values.items():
        monkeypatch.setenv(key, value)


# scontrol's stand-in: `show job` answers with $JOB_STATE (RUNNING unless told), `show hostnames` with n1.
SCONTROL = textwrap.dedent(
    """\
    echo "scontrol $*" >>"$STATE/calls"
    if [ "$1 $2" = "show job" ]; then echo "JobId=40 JobName=x JobState=${JOB_STATE:-RUNNING} Reason=None"; fi
    if [ "$1 $2" = "show hostnames" ]; then echo n1; fi
    exit 0
    """
)


def test_rank0_leaves_the_requeue_to_jobgens_batch_shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = install_stubs(tmp_path, monkeypatch, {"scontrol": SCONTROL})
    _slurm_env(monkeypatch, SLURM_JOB_ID="40", JOBGEN_REQUEUE_BY=requeue.BY_BATCH_SHELL)
    with pytest.raises(SystemExit) as stop:
        requeue.leave_for_requeue(0, tmp_path / "ckpt")
    assert stop.value.code == requeue.EXIT_REQUEUE
    assert (tmp_path / "ckpt" / ".requeue-40-0").exists()
    assert not (state / "calls").exists()  # the shell on the host does it, not the rank


def test_rank0_requeues_itself_under_another_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """submitit or a user's template: no batch shell of jobgen's; rank 0 asks Slurm, naming the task."""
    state = install_stubs(tmp_path, monkeypatch, {"scontrol": SCONTROL})
    _slurm_env(monkeypatch, SLURM_JOB_ID="40", SLURM_ARRAY_JOB_ID="40", SLURM_ARRAY_TASK_ID="2")
    monkeypatch.delenv("JOBGEN_REQUEUE_BY", raising=False)
    with pytest.raises(SystemExit):
        requeue.leave_for_requeue(0, tmp_path / "ckpt")
    assert (state / "calls").read_text().splitlines() == ["scontrol show job -o 40_2", "scontrol requeue 40_2"]
    assert "scontrol requeue 40_2 -> rc 0" in (tmp_path / "ckpt" / ".requeue-40-0").read_text()


def test_rank0_says_the_checkpoint_is_complete_before_it_asks_slurm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The requeue ends the job's steps at once: what rank 0 prints after asking may never leave srun."""
    _slurm_env(monkeypatch, SLURM_JOB_ID="40")
    monkeypatch.delenv("JOBGEN_REQUEUE_BY", raising=False)

    def ended_by_the_requeue() -> str:
        raise KeyboardInterrupt  # what the step's end is to this process: nothing after it runs

    monkeypatch.setattr(requeue, "_ask_slurm", ended_by_the_requeue)
    with pytest.raises(KeyboardInterrupt):
        requeue.leave_for_requeue(0, tmp_path / "ckpt")
    assert "training: checkpoint complete; asking Slurm to requeue the job" in capsys.readouterr().err


def test_rank0_leaves_a_cancelled_job_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """scancel sends SIGTERM too: the ranks checkpoint, but a job Slurm is ending is not requeued."""
    state = install_stubs(tmp_path, monkeypatch, {"scontrol": SCONTROL})
    _slurm_env(monkeypatch, SLURM_JOB_ID="40", JOB_STATE="CANCELLED")
    with pytest.raises(SystemExit):
        requeue.leave_for_requeue(0, tmp_path / "ckpt")
    assert (state / "calls").read_text().splitlines() == ["scontrol show job -o 40"]
    assert "job 40 is CANCELLED: not requeued" in (tmp_path / "ckpt" / ".requeue-40-0").read_text()


def test_other_ranks_leave_once_rank0_marked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _slurm_env(monkeypatch, SLURM_JOB_ID="40")
    with pytest.raises(SystemExit) as stop:
        requeue.leave_for_requeue(1, tmp_path, wait_s=0.3)  # no marker: gives up after wait_s
    assert stop.value.code == requeue.EXIT_REQUEUE


def test_watcher_takes_sigterm_too() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR2)}
    watcher = requeue.Watcher()
    try:
        watcher.install_all("USR2")
        os.kill(os.getpid(), signal.SIGTERM)
        assert watcher.requested and watcher.signals == [signal.SIGTERM]
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def test_launcher_keeps_sigterm_ignored() -> None:
    assert relay.launcher_env({})["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGINT,SIGHUP,SIGQUIT"
    env = relay.launcher_env({"TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGUSR1"})
    assert env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGUSR1"


# --------------------------------------------------------------------------- the batch shell

# srun's stand-in plays the ranks: BEHAVE says what they do. The marker's name is training.requeue's.
SRUN = textwrap.dedent(
    """\
    echo "srun $*" >>"$STATE/calls"
    echo "srun: JOBGEN_REQUEUE_BY=${JOBGEN_REQUEUE_BY:-}" >>"$STATE/calls"
    ckpt="$JOB_DIR/checkpoints"
    case "$BEHAVE" in
        requeue) mkdir -p "$ckpt"; echo asked >"$ckpt/.requeue-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"; exit 75 ;;
        term-shell)  # the shell alone gets SIGTERM (scancel -b, --signal=B:TERM): it must not die of it
            kill -TERM "$PPID"; sleep 1
            mkdir -p "$ckpt"; echo asked >"$ckpt/.requeue-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"; exit 75 ;;
        ok) echo "{}" >"$JOB_DIR/result.json"; exit 0 ;;
        noresult) exit 0 ;;
        fail) exit 3 ;;
    esac
    """
)
STUBS = {
    "srun": SRUN,
    "scontrol": SCONTROL,
    "scancel": 'echo "scancel $*" >>"$STATE/calls"\n',
}


@pytest.fixture
def job_script(tmp_path: Path, runner, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A real jobgen sbatch script (srun launcher, requeue on) and its job folder."""
    from jobgen.cli import main

    exp = tmp_path / "rq.toml"
    exp.write_text(
        '[experiment]\nname = "rq"\n[slurm]\nrequeue = true\nsignal = "USR2"\n[train]\nmodel = "builtin:tiny"\n'
        '[data]\ndataset = "builtin:synthetic"\n'
    )
    out = tmp_path / "runs"
    result = runner.invoke(main, ["--output-root", str(out), "submit", str(exp), "--dry-run"])
    assert result.exit_code == 0, result.output
    (run_dir,) = (out / "rq").iterdir()
    job = json.loads((run_dir / "manifest.json").read_text())["jobs"][0]
    return run_dir / job["script"], run_dir / job["dir"]


def _run(script: Path, job_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, behave: str, **env: str):
    state = install_stubs(tmp_path, monkeypatch, STUBS)
    full = {
        **os.environ,
        "BEHAVE": behave,
        "JOB_DIR": str(job_dir),
        "SLURM_JOB_ID": "40",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_CPUS_PER_TASK": "1",
        **env,
    }
    done = subprocess.run(["bash", str(script)], env=full, capture_output=True, text=True, timeout=60)
    calls = (state / "calls").read_text().splitlines() if (state / "calls").exists() else []
    return done, calls


def test_batch_shell_requeues_the_task_after_the_ranks_left(job_script, tmp_path, monkeypatch) -> None:
    script, job_dir = job_script
    done, calls = _run(
        script, job_dir, tmp_path, monkeypatch, "requeue", SLURM_ARRAY_JOB_ID="40", SLURM_ARRAY_TASK_ID="2"
    )
    assert done.returncode == 75, done.stderr
    assert "srun: JOBGEN_REQUEUE_BY=batch-shell" in calls  # so rank 0 leaves scontrol to the shell
    assert calls[-1] == "scontrol requeue 40_2", calls  # the task, not the whole array
    assert "the ranks checkpointed and left (step exit 75); scontrol requeue 40_2" in done.stdout


def test_batch_shell_survives_a_sigterm_and_passes_it_on(job_script, tmp_path, monkeypatch) -> None:
    script, job_dir = job_script
    done, calls = _run(script, job_dir, tmp_path, monkeypatch, "term-shell", SLURM_RESTART_COUNT="1")
    assert done.returncode == 75, done.stderr
    assert "scancel --signal=USR2 40" in calls, calls  # to the job's steps, not through srun
    assert calls[-1] == "scontrol requeue 40", calls
    assert "the batch shell got SIGTERM" in done.stderr


def test_batch_shell_does_not_requeue_a_cancelled_job(job_script, tmp_path, monkeypatch) -> None:
    script, job_dir = job_script
    done, calls = _run(script, job_dir, tmp_path, monkeypatch, "requeue", JOB_STATE="CANCELLED")
    assert done.returncode == 75, done.stderr
    assert "scontrol show job -o 40" in calls and "scontrol requeue 40" not in calls, calls
    assert "the job is CANCELLED: not requeued" in done.stderr


@pytest.mark.parametrize(("behave", "rc"), [("ok", 0), ("noresult", 1), ("fail", 3)])
def test_batch_shell_exit_status(job_script, tmp_path, monkeypatch, behave: str, rc: int) -> None:
    """Never 0 without the job's result; a failure keeps its status; no requeue without the marker."""
    script, job_dir = job_script
    done, calls = _run(script, job_dir, tmp_path, monkeypatch, behave)
    assert done.returncode == rc, (done.stdout, done.stderr)
    assert not [c for c in calls if c.startswith("scontrol requeue")]


def test_a_step_pause_waits_outside_every_timed_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """JOBGEN_STEP_PAUSE_S (the slurm requeue tests reach a short job mid-training with it) waits after
    each batch's window closes: the batch took its time, the pause counts in no time and no throughput."""
    import time
    from types import SimpleNamespace

    import torch

    from training import timing
    from training.results import Stats

    monkeypatch.setattr(timing, "STEP_PAUSE_S", 0.2)
    stats = Stats()
    clock = timing.TrainClock(stats, SimpleNamespace(train=SimpleNamespace(compile=False, warmup_compile_steps=0)))
    batch = {"labels": torch.zeros(4), "attention_mask": torch.ones(4, 8)}
    started = time.perf_counter()
    clock.open()
    for _ in range(3):
        clock.close(batch, 0)
        clock.open()
    assert time.perf_counter() - started >= 0.6
    assert stats.times_s["train"] < 0.1, stats.times_s
    assert clock.local["timed_samples"] == 12
