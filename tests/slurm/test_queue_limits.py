"""Sweeps larger than the queue, on a real cluster of their own with low limits: slurm.conf's
MaxJobCount = 12 (MinJobAge = 2 s, so ended jobs free their records quickly) and, with accounting
enforced, a QOS whose MaxSubmitJobsPerUser is 3. The waves are submitted by the jobs themselves: between
`jobgen submit` and the end of the sweep no jobgen command runs on this machine.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm.helpers import behave_sweep, jobgen, manifest, only_run
from tests.support.slurm_cluster import DOWN, UP, ClusterSpec, cluster_env, cluster_spec

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]

MAX_JOB_COUNT = 12
QOS_LIMIT = 3


@pytest.fixture(scope="module")
def limited(slurm_cluster) -> Iterator[dict[str, str]]:
    """A cluster of its own (name +q, net third octet +100) with the low limits, torn down after."""
    base = cluster_spec(accounting=True)
    a, b, c = base.net.split(".")
    spec = ClusterSpec(base.name[:8] + "q", f"{a}.{b}.{(int(c) + 100) % 250 + 1}", Path(f"{base.dir}-q"), True)
    env = {
        **spec.script_env(),
        "JOBGEN_CLUSTER_MAX_JOB_COUNT": str(MAX_JOB_COUNT),
        "JOBGEN_CLUSTER_MIN_JOB_AGE": "2",
        "JOBGEN_CLUSTER_ENFORCE": "limits",
    }
    subprocess.run([str(UP), "--accounting", "--restart"], env=env, check=True, capture_output=True, timeout=300)
    try:
        client = cluster_env(spec)
        for args in (
            ["add", "qos", "small", f"MaxSubmitJobsPerUser={QOS_LIMIT}"],
            ["modify", "user", "root", "set", "qos+=small"],
        ):
            done = subprocess.run(["sacctmgr", "-i", *args], env=client, capture_output=True, text=True, timeout=30)
            assert done.returncode == 0, f"sacctmgr {' '.join(args)}: {done.stdout} {done.stderr}"
        yield client
    finally:
        # Stopped in the background (its jobs' end, MariaDB's shutdown: 37 s), not in the waiting
        # tests' worker: a next start of this cluster waits for the stop on the cluster's lock (up.sh).
        with open(spec.dir / "down.log", "w") as log:
            subprocess.Popen(
                [str(DOWN)],
                env=spec.script_env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )


def _client(limited: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Point jobgen at the limited cluster, once the controller holds no job (ended jobs go after
    MinJobAge and the controller's next purge)."""
    for key in ("SLURM_CONF", "JOBGEN_CLUSTER_DIR"):
        monkeypatch.setenv(key, limited[key])
    subprocess.run(["scancel", "-u", "root"], env=limited, check=True, timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        held = subprocess.run(["squeue", "-h", "-t", "all"], env=limited, capture_output=True, text=True, timeout=30)
        if held.returncode == 0 and not held.stdout.strip():
            return
        time.sleep(1)
    raise AssertionError("the controller still holds jobs after 60 s")


def _sweep(tmp_path: Path, name: str, points: int, qos: str = "", nap: int = 0) -> Path:
    """A sweep of cheap jobs; each sleeps `nap` seconds."""
    exp = behave_sweep(tmp_path, name, points)
    if qos:
        exp.write_text(exp.read_text().replace("[slurm]\n", f'[slurm]\nqos = "{qos}"\n'))
    if nap:
        exp.write_text(exp.read_text().replace('BEHAVIOR = "ok"', f'BEHAVIOR = "ok", NAP = "{nap}"'))
    return exp


def _sacct(experiment: str, since: float, env: dict[str, str]) -> list[tuple[str, str, float, float, str]]:
    """(id, job name, submit, end, state) of every job of the experiment Slurm took since `since` (by
    its job name, "<experiment>.<job>": this cluster keeps no comments in its accounting)."""
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 1))
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-S", start, "--format=JobID,JobName%100,Submit,End,State"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    rows = []
    for line in out.splitlines():
        job_id, name, submit, end, state = line.split("|")
        if name.startswith(experiment + ".") and _epoch(submit) >= since - 1:
            rows.append((job_id, name.removeprefix(experiment + "."), _epoch(submit), _epoch(end), state))
    return rows


def _epoch(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")) if text[:1].isdigit() else float("inf")


def _most_queued(rows: list[tuple[str, str, float, float, str]]) -> int:
    """The most jobs of the run queued at one instant (a job counts from its submission to its end)."""
    return max(sum(1 for _, _, s, e, _ in rows if s <= t < e) for _, _, t, _, _ in rows)


def _wait_done(
    run_dir: Path, experiment: str, since: float, env: dict[str, str], points: int, timeout: float
) -> list[tuple[str, str, float, float, str]]:
    """Wait, asking only sacct (no jobgen command: it would top the queue up), until every point ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = _sacct(experiment, since, env)
        ended = {job_id for job_id, _, _, _, state in rows if state == "COMPLETED"}
        if len(ended) >= points and not (run_dir / "waves.json").exists():
            return rows
        time.sleep(2)
    raise AssertionError(f"the sweep did not complete in {timeout:.0f} s: {_sacct(experiment, since, env)}")


def test_qos_limit_read_refused_named_and_waves_complete(limited, monkeypatch, tmp_path: Path):
    _client(limited, monkeypatch)
    root = tmp_path / "runs"
    exp = _sweep(tmp_path, "qos", 9, qos="small")
    said = jobgen("validate", str(exp), root=root).stdout
    assert f"queue: {QOS_LIMIT} of the 9 job(s) fit now (QOS small MaxSubmitJobsPerUser = {QOS_LIMIT}" in said

    # Asked to queue them all at once: the controller refuses the 4th, and the message names the limit.
    refused = jobgen("submit", str(exp), "--set", "launch.max_queued=100", root=root, check=False)
    assert refused.returncode == 1
    line = refused.stderr.strip().splitlines()[-1]
    # The count is taken after the refusal: jobs that ended in between leave the limit named as likely.
    named = re.search(
        rf"(refused by|probably) QOS small MaxSubmitJobsPerUser = {QOS_LIMIT}, (\d+) of yours queued", line
    )
    assert named and int(named[2]) <= QOS_LIMIT, line
    assert "launch.max_queued" in line and "slurmctld up" not in line
    subprocess.run(["scancel", "-u", "root"], env=limited, check=True, timeout=30)

    # By default: what fits now, the rest in waves submitted by the jobs that end.
    shutil.rmtree(root / "qos")
    time.sleep(3)
    since = time.time()
    out = jobgen("submit", str(exp), root=root).stdout
    run_dir = only_run(root, "qos")
    assert "WAITING for room in the queue" in out, out
    waiting = sum(1 for job in manifest(run_dir)["jobs"] if job["state"] == "WAITING")
    assert waiting >= 9 - QOS_LIMIT
    rows = _wait_done(run_dir, "qos", since, limited, 9, timeout=240)
    assert sorted(name for _, name, _, _, _ in rows) == sorted(f"seed-{i}" for i in range(1, 10)), rows
    assert _most_queued(rows) <= QOS_LIMIT, rows
    table = jobgen("status", str(run_dir), root=root).stdout
    assert table.count("COMPLETED") == 9 and "WAITING" not in table


def test_max_job_count_read_waves_complete_and_refusal_named(limited, monkeypatch, tmp_path: Path):
    _client(limited, monkeypatch)
    root = tmp_path / "runs"
    points = 3 * MAX_JOB_COUNT
    exp = _sweep(tmp_path, "many", points)
    said = jobgen("validate", str(exp), root=root).stdout
    assert f"of the {points} job(s) fit now (slurm.conf MaxJobCount = {MAX_JOB_COUNT}" in said, said
    since = time.time()
    out = jobgen("submit", str(exp), root=root).stdout
    assert "WAITING for room in the queue" in out, out
    run_dir = only_run(root, "many")
    rows = _wait_done(run_dir, "many", since, limited, points, timeout=300)
    assert len(rows) == points and len({name for _, name, _, _, _ in rows}) == points, rows
    assert _most_queued(rows) < MAX_JOB_COUNT, rows
    table = jobgen("status", str(run_dir), root=root).stdout
    assert table.count("COMPLETED") == points

    # The controller full: sbatch would sleep and retry; jobgen stops it and names the limit at once.
    _client(limited, monkeypatch)
    for _ in range(MAX_JOB_COUNT - 1):
        subprocess.run(["sbatch", "-Q", "-o", "/dev/null", "--wrap", "sleep 30"], env=limited, check=True, timeout=30)
    started = time.monotonic()
    refused = jobgen("submit", str(exp), "--set", "launch.max_queued=1000", root=root, check=False)
    took = time.monotonic() - started
    subprocess.run(["scancel", "-u", "root"], env=limited, check=True, timeout=30)
    line = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 1 and f"MaxJobCount = {MAX_JOB_COUNT}" in line, line
    assert "slurmctld up" not in line and took < 30, (took, line)


def test_validate_says_how_many_fit(slurm_any, root: Path, tmp_path: Path):
    exp = _sweep(tmp_path, "fit", 5)
    said = jobgen("validate", str(exp), root=root).stdout
    assert "queue: all 5 job(s) fit now (slurm.conf MaxJobCount = 100000" in said, said


def test_array_sweep_waves_under_the_qos_limit(limited, monkeypatch, tmp_path: Path):
    _client(limited, monkeypatch)
    root = tmp_path / "runs"
    exp = _sweep(tmp_path, "arrq", 7, qos="small")
    since = time.time()
    out = jobgen("submit", str(exp), "--array", root=root).stdout
    run_dir = only_run(root, "arrq")
    # A wave of QOS_LIMIT - 1 (one slot for the hand-over): arrays of 2 tasks, submitted whole.
    assert [len(a["tasks"]) for a in manifest(run_dir)["arrays"]] == [2, 2, 2, 1], out
    rows = _wait_done(run_dir, "arrq", since, limited, 7, timeout=240)
    # Each task once: the ids Slurm ran are the ids the run recorded, one per job.
    recorded = sorted(job["job_id"] for job in manifest(run_dir)["jobs"])
    assert sorted(job_id for job_id, _, _, _, _ in rows) == recorded and len(set(recorded)) == 7, rows
    assert _most_queued(rows) <= QOS_LIMIT, rows


def _two_at_a_time(
    limited: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, points: int, nap: int
) -> tuple[Path, Path, float]:
    """Submit a sweep of napping jobs with launch.max_queued = 2: (output root, run folder, when)."""
    _client(limited, monkeypatch)
    root = tmp_path / "runs"
    since = time.time()
    jobgen("submit", str(_sweep(tmp_path, name, points, nap=nap)), "--set", "launch.max_queued=2", root=root)
    return root, only_run(root, name), since


def test_a_sweep_in_waves_survives_a_controller_restart(limited, monkeypatch, tmp_path: Path):
    root, run_dir, since = _two_at_a_time(limited, monkeypatch, tmp_path, "restart", 6, nap=6)
    controller = [str(UP.parent / "controller.sh")]
    time.sleep(3)
    subprocess.run([*controller, "stop"], env=limited, check=True, capture_output=True, timeout=60)
    time.sleep(10)  # the first jobs end while the controller is away: their top-ups fail, nothing is lost
    subprocess.run([*controller, "start"], env=limited, check=True, capture_output=True, timeout=60)
    rows = _wait_done(run_dir, "restart", since, limited, 6, timeout=240)
    assert sorted(name for _, name, _, _, _ in rows) == sorted(f"seed-{i}" for i in range(1, 7)), rows
    # max_queued = 2, and a job that ends submits its successor while it still counts (its exit path):
    # for that moment the queue holds one more (docs/guides/queue-limits.md), never two more.
    assert _most_queued(rows) <= 2 + 1, rows


def test_cancel_stops_a_sweep_in_waves(limited, monkeypatch, tmp_path: Path):
    """`jobgen cancel RUN` of a sweep in waves: the queued jobs are cancelled and, on their way out,
    submit nothing; the waiting ones are recorded CANCELLED (each cancelled job's exit path, and the
    next status, submitted them before)."""
    root, run_dir, since = _two_at_a_time(limited, monkeypatch, tmp_path, "stop", 5, nap=60)
    deadline = time.monotonic() + 60
    while len(_sacct("stop", since, limited)) < 2 or any(r[4] != "RUNNING" for r in _sacct("stop", since, limited)):
        assert time.monotonic() < deadline, _sacct("stop", since, limited)
        time.sleep(1)
    out = jobgen("cancel", str(run_dir), root=root).stdout
    assert out.count("WAITING, cancelled: it will not be submitted") == 3 and "5 job(s) cancelled" in out, out
    deadline = time.monotonic() + 60
    while any(r[4] in ("RUNNING", "PENDING") for r in _sacct("stop", since, limited)):
        assert time.monotonic() < deadline, _sacct("stop", since, limited)
        time.sleep(1)
    time.sleep(3)  # the cancelled jobs' exit paths have run
    status = jobgen("status", str(run_dir), root=root).stdout
    rows = _sacct("stop", since, limited)
    assert len(rows) == 2 and all(r[4].startswith("CANCELLED") for r in rows), (rows, status)
    assert [j["state"] for j in manifest(run_dir)["jobs"]] == ["CANCELLED"] * 5, status
