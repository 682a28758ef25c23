"""`jobgen status`, `runs`, `summary` and `report` of one run of 1,000 to 10,000 finished jobs, each
against its floor.

    .venv/bin/python bench/bench_status.py [--jobs 1000 10000]

Every job's records are checked for damage (jobgen.record.damage) on each command; the run keeps what
the commands read of each file by its stat stamp (.verdicts.json: the damage verdicts, the results'
numbers, which records each job folder holds), so only the first command after the jobs wrote their
files reads them all. Printed side by side, from one process each (the CLI as a user runs it, its
bytecode compiled once beforehand, as an installed package has it): the first status (nothing kept
yet; it records the jobs' states), the next one (it reads the run and keeps its rows: jobgen.record.rows),
the one after it (it shows the kept rows), runs, summary and report (each reads the run and keeps what
it showed), then summary and report again (they show what they kept), each as a ratio to the floor
measured in the same run: `python -c pass` plus one os.stat per job file, the least a status that
checks every record can cost.
With `--without-results` the jobs ended without their result (bench_scale.py's `true` jobs): the
stand-in squeue holds each as COMPLETED, the first status reads each job's one-line log for why (and
records it: the summary after it reads no log), and the report shows each job's last log lines.
The jobs are recorded as submitted, as a sweep that has just ended is: the first status asks Slurm
once per tool (stand-ins that know no job, as a controller that has forgotten them) and records the
states the files say (COMPLETED); the later commands ask nothing. With `--answered` the stand-in squeue
answers for every job instead (COMPLETED, exit 0, its times), as the controller does within MinJobAge
of the end: the first status parses 10,000 lines of it and records what they say. A second line gives each command's CPU seconds
(user + system) in the same order: on a busy machine they vary less than the wall times.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_summary import make_run  # noqa: E402

JOB_FILES = ("spec.json", "progress.json", "metrics.csv", "result.json")
FLOOR = """
import os, sys
for d in os.scandir(os.path.join(sys.argv[1], "jobs")):
    for name in {files}:
        try:
            os.stat(os.path.join(d.path, name))
        except FileNotFoundError:
            pass
"""


CPU: list[float] = []  # the CPU seconds (user + system) of each command timed, in order


def timed(args: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one command; its CPU seconds are appended to CPU (they vary less than the wall
    time on a machine that runs other work)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return wall


def settle(run: Path) -> None:
    """The jobs' files and folders as written a minute ago (a verdict is kept only for a file that has
    settled, and what a folder holds only for a folder that has)."""
    past = time.time() - 60
    for folder in (run / "jobs").iterdir():
        for name in JOB_FILES:
            path = folder / name
            if path.exists():
                os.utime(path, (past, past))
        os.utime(folder, (past, past))


def forgetful_slurm(folder: Path) -> str:
    """A folder of squeue, sacct and scontrol that answer, and know no job: a controller that has
    forgotten the run's jobs (past MinJobAge, no accounting), whatever Slurm this machine has or lacks.
    The first status asks them once each (jobgen.backends._slurm.query) and judges the jobs by their
    files; a Slurm client here without a controller would instead make every run wait for its timeout."""
    folder.mkdir(parents=True, exist_ok=True)
    for tool in ("squeue", "sacct", "scontrol"):
        path = folder / tool
        path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(0o755)
    return str(folder)


def user_env() -> dict[str, str]:
    """This environment as a user's shell has it: bytecode written and reused (an installed package has
    it). The jobgen package imported is compiled at once, so no command pays for that."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    where = [sys.executable, "-c", "import jobgen, os; print(os.path.dirname(jobgen.__file__))"]
    package = subprocess.run(where, env=env, capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "compileall", "-q", package], env=env, check=True)
    return env


def make_resultless_run(root: Path, n: int, slurm: Path) -> Path:
    """A run of `n` jobs that ended without their result (a launch that did nothing, as bench_scale.py's
    `true` jobs): each has a short log, and the stand-in squeue in `slurm` still holds every one as
    COMPLETED with exit 0, so the first status reads each job's log for why it has no result."""
    from tests.data.summary import synth

    jobs = [
        synth.FakeJob(
            f"job-{i:05d}", sweep={"train.lr": 1e-5 * (1 + i)}, result=None, logs={f"slurm-{4000 + i}.out": "hello\n"}
        )
        for i in range(n)
    ]
    run = synth.write_run(root / f"{n}-without-results", "bench", jobs)
    rows = "".join(f"{4000 + i}|COMPLETED|0:01|1|n1|2026-01-01T00:00:00|2026-01-01T00:00:01|0:0|\n" for i in range(n))
    (slurm / "queue.txt").write_text(rows)
    (slurm / "squeue").write_text(f"#!/bin/sh\ncat '{slurm / 'queue.txt'}'\n")
    past = time.time() - 60
    for folder in (run / "jobs").iterdir():
        os.utime(folder / f"slurm-{4000 + int(folder.name[4:])}.out", (past, past))
    return run


def answering_slurm(slurm: Path, n: int) -> None:
    """The stand-in squeue in `slurm` answers for jobs 4000 to 4000 + n - 1 (the runs' ids) as a controller
    that still holds them ended (within MinJobAge): COMPLETED, exit 0, with their times and node."""
    rows = "".join(f"{4000 + i}|COMPLETED|0:01|1|n1|2026-01-01T00:00:00|2026-01-01T00:00:01|0|\n" for i in range(n))
    (slurm / "queue.txt").write_text(rows)
    (slurm / "squeue").write_text(f"#!/bin/sh\ncat '{slurm / 'queue.txt'}'\n")


def warm_up(jobgen: list[str], root: Path, env: dict[str, str]) -> None:
    """Every command once on a small run: its modules compiled, the file cache warm."""
    run = str(make_run(root, 10))
    for command in (["status", run], ["runs"], ["summary", run], ["report", run, "-o", str(root / "warm.html")]):
        timed([*jobgen, "--output-root", str(root / "10"), *command], env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 10_000])
    parser.add_argument(
        "--without-results",
        action="store_true",
        help="jobs that ended without their result (Slurm says COMPLETED, each has a one-line log)",
    )
    parser.add_argument(
        "--answered",
        action="store_true",
        help="the stand-in squeue answers every job as ended (COMPLETED, with its times), as a controller "
        "that still holds them (the first status records what it said)",
    )
    args = parser.parse_args()
    jobgen = [str(Path(sys.executable).with_name("jobgen"))]
    print(
        f"{'jobs':>6}  {'floor':>7}  {'status (first)':>16}  {'status (next)':>15}  {'status (kept)':>15}"
        f"  {'runs':>13}  {'summary':>13}  {'report':>14}  {'summary (kept)':>14}  {'report (kept)':>14}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        env = {**user_env(), "JOBGEN_NO_COLOR": "1"}
        env["PATH"] = forgetful_slurm(Path(tmp) / "slurm") + os.pathsep + env.get("PATH", "")
        warm_up(jobgen, Path(tmp) / "warm", env)
        for n in args.jobs:
            run = (
                make_resultless_run(Path(tmp), n, Path(tmp) / "slurm")
                if args.without_results
                else make_run(Path(tmp), n)
            )
            if args.answered and not args.without_results:
                answering_slurm(Path(tmp) / "slurm", n)
            settle(run)
            root = ["--output-root", str(run.parent.parent)]
            del CPU[:]
            floor = timed([sys.executable, "-c", FLOOR.format(files=JOB_FILES), str(run)], env)
            first = timed([*jobgen, *root, "status", str(run)], env)
            again = timed([*jobgen, *root, "status", str(run)], env)
            kept = timed([*jobgen, *root, "status", str(run)], env)
            runs = timed([*jobgen, *root, "runs"], env)
            summary = timed([*jobgen, *root, "summary", str(run)], env)
            report = timed([*jobgen, *root, "report", str(run), "-o", str(Path(tmp) / f"{n}.html")], env)
            summary_kept = timed([*jobgen, *root, "summary", str(run)], env)
            report_kept = timed([*jobgen, *root, "report", str(run), "-o", str(Path(tmp) / f"{n}.html")], env)
            print(
                f"{n:>6}  {floor:6.2f}s  {first:6.2f}s ({first / floor:4.1f}x)  {again:6.2f}s ({again / floor:4.1f}x)"
                f"  {kept:6.2f}s ({kept / floor:4.1f}x)  {runs:5.2f}s ({runs / floor:4.1f}x)  {summary:5.2f}s ({summary / floor:4.1f}x)"
                f"  {report:5.2f}s ({report / floor:5.1f}x)  {summary_kept:5.2f}s ({summary_kept / floor:5.1f}x)"
                f"  {report_kept:5.2f}s ({report_kept / floor:5.1f}x)",
                flush=True,
            )
            print(f"{'cpu':>6}  " + "  ".join(f"{c:6.2f}s" for c in CPU), flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (1 min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
