"""jobgen at scale on the real test cluster: submission, status and summary of 100 to 10,000 jobs.

Each figure is printed next to its floor measured in the same run (a bare `sbatch --parsable --wrap true`
loop for submission, right before it and as many calls, its jobs cancelled before jobgen's submission
starts; for status, the one `squeue -t all -u <you> -O <fields>` it asks), as a ratio: these machines
are noisy, so only ratios measured side by side mean anything. The jobs' launch is `true`
(bench/true.sbatch.j2): Slurm does all the work there is, and jobgen's own cost is what is left. The
test cluster's daemons and jobs run on this machine: the floor's sbatch loop, jobgen's submission and
the status of the queued jobs are measured with the partition held (State=DOWN: the jobs stay queued,
no slurmstepd starts one on these cores meanwhile: jobgen's jobs, which run its whole batch script,
took the cores from its own later sbatch calls, the floor's `true` far less), and once the jobs ended the reads
wait until the CPUs are idle again (the accounting stores every ended job for a while), each read
after the last, as a login node's are while the controller, the database and the jobs run elsewhere;
the table says how long that took and how many tasks were pending.

    source /tmp/jobgen-cluster/env.sh
    .venv/bin/python bench/bench_scale.py --sizes 100 1000 10000

Besides the seconds, every command runs behind a PATH shim that counts the Slurm processes it starts,
and a second table gives each command's CPU seconds (user + system, its Slurm tools included), which
vary less than wall times on a busy machine. The columns, in order: status while the jobs are queued,
the first status once they ended, the next one, runs, summary, report, summary again, and two statuses
after them (the first reads the manifest that summary's kept usage changed, the second the settled run
after it). `--how arrays` measures arrays alone (10,000 jobs one by one take long).

Each read runs `--repeat` times (3) from the same start, and the table shows the median with the
fastest and slowest: a single run on these machines is now and then a quarter slower than the next
(a first status of 10,000 ended jobs took 1.03 s and 0.80 s in two runs of the same code). Between
two runs of a read the run folder's own files (the manifest, its journal and the index: everything
at its top level) are put back as they were before the first, and the CPUs
must be idle again; the reads only read the job folders, so each run of a read starts where the
first did and does the same work, and the next read starts where the first run left. The status
floor (the one squeue) is the median of three calls likewise.

Leave the code alone while it runs (or run it from a checkout of its own, with an environment of its
own: an editable install finds its package ahead of PYTHONPATH): the run's index is keyed by the
fingerprint of jobgen's source (jobgen.record.index.fingerprint), so after an edit the next reads read
the run again.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bench_status import user_env  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TOOLS = ("sbatch", "squeue", "sacct", "scontrol", "scancel")
EXPERIMENT = """[experiment]
name = "scale{n}{kind}"
[launch]
backend = "sbatch"
template = "{template}"
array = {array}
[data]
dataset = "synthetic"
[sweep.grid]
"train.seed" = [{seeds}]
"""


def shim(folder: Path) -> Path:
    """A PATH folder whose Slurm tools log their name, then run the real ones."""
    folder.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        real = shutil.which(tool)
        assert real, f"{tool} is not installed: start the test cluster (tests/cluster/up.sh)"
        # Jobs inherit PATH too: each line names the process that ran the tool, so only jobgen's count.
        (folder / tool).write_text(f'#!/bin/sh\necho "{tool} $PPID" >> "{folder}/calls"\nexec {real} "$@"\n')
        (folder / tool).chmod(0o755)
    return folder


LAST_PID = [0]
USER_ENV: dict[str, str] = {}


def calls(folder: Path) -> int:
    """How many Slurm processes the last jobgen command started (not its jobs)."""
    path = folder / "calls"
    lines = path.read_text().splitlines() if path.exists() else []
    path.unlink(missing_ok=True)
    return sum(line.split()[-1] == str(LAST_PID[0]) for line in lines)


LAST_CPU = [0.0]  # the CPU seconds (user + system) of the last command, its Slurm tools included


def jobgen(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "jobgen.cli", *args], env=env, stdout=subprocess.DEVNULL)
    LAST_PID[0] = proc.pid
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    LAST_CPU[0] = usage.ru_utime + usage.ru_stime
    if proc.returncode != 0:
        raise SystemExit(f"jobgen {' '.join(args)} failed")
    return time.perf_counter() - started


def bare_sbatch(n: int, counter: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of n bare sbatch calls from this process, one after the other, through the
    same counting shim as jobgen's (a shell that logs a line, then runs the real sbatch), with the
    partition held as jobgen's submission will be; its jobs are cancelled after."""
    partition = default_partition()
    set_partition(partition, "DOWN")
    try:
        return _bare_sbatch(n, counter)
    finally:
        subprocess.run(["scancel", "--name", FLOOR_NAME], capture_output=True)
        wait_ended(FLOOR_NAME, timeout=max(600, n / 5), exact=True)  # jobgen's submission meets an empty queue
        set_partition(partition, "UP")


def _bare_sbatch(n: int, counter: Path) -> tuple[float, float]:
    env = {**os.environ, "PATH": f"{counter}:{os.environ['PATH']}"}
    command = ["sbatch", "--parsable", "--job-name", FLOOR_NAME, "--wrap", "true", "-o", "/dev/null"]
    for _attempt in range(3):
        before = _children_cpu()
        started = time.perf_counter()
        for _ in range(n):
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                break
        else:
            return time.perf_counter() - started, _children_cpu() - before
        # A controller busy saving the state of thousands of jobs may time a call out: the floor is
        # measured again from the start, after its jobs are gone, rather than with a retry's wait in it.
        print(f"bare sbatch failed ({done.stderr.strip()}); measuring the floor again", file=sys.stderr)
        subprocess.run(["scancel", "--name", FLOOR_NAME], capture_output=True)
        wait_ended(FLOOR_NAME, timeout=max(600, n / 5), exact=True)
        time.sleep(5)
    raise SystemExit(f"bare sbatch failed three times: {done.stderr.strip()}")


FLOOR_NAME = "bare-sbatch-floor"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_ended(name: str, timeout: float, exact: bool = False) -> None:
    """Until no job of this experiment (`exact`: of this job name) is queued or running (other users'
    jobs may be)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(line == name if exact else line.startswith(f"{name}.") for line in job_names()):
            return
        time.sleep(2)
    raise SystemExit(f"jobs still queued after {timeout:.0f} s")


def job_names(*states: str) -> list[str]:
    """The name of each job (array task) the controller holds queued or running, or in these states."""
    which = ["-t", ",".join(states)] if states else []
    return subprocess.run(
        ["squeue", "-h", "-r", *which, "-o", "%j"], capture_output=True, text=True
    ).stdout.splitlines()


def cpu_idle(window: float) -> float:
    """The share of this machine's CPU time that was idle over the next `window` seconds (/proc/stat)."""

    def times() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # all, idle + iowait

    total, idle = times()
    time.sleep(window)
    total2, idle2 = times()
    return (idle2 - idle) / max(1, total2 - total)


def wait_idle(least: float = 0.8, window: float = 3.0, timeout: float = 300.0) -> tuple[float, float]:
    """(seconds waited, the idle share last measured): until the CPUs were idle `least` of a `window`,
    at most `timeout` seconds (then the reads are measured anyway, and the table says how idle it was)."""
    started = time.monotonic()
    while True:
        idle = cpu_idle(window)
        if idle >= least or time.monotonic() - started > timeout:
            return time.monotonic() - started, idle


def measure(n: int, array: bool, root: Path, counter: Path, repeat: int = 3) -> dict[str, float]:
    kind = "a" if array else "s"
    exp = root / f"scale{n}{kind}.toml"
    exp.write_text(
        EXPERIMENT.format(
            n=n,
            kind=kind,
            template=REPO / "bench" / "true.sbatch.j2",
            array=str(array).lower(),
            seeds=", ".join(str(i) for i in range(n)),
        )
    )
    env = {**USER_ENV, "PATH": f"{counter}:{os.environ['PATH']}"}
    runs = ["--output-root", str(root / "runs")]
    out: dict[str, Any] = {"jobs": n, "repeat": repeat}

    def measure_one(key: str, args: list[str], settle: bool = False, times: int = 1) -> None:
        start = top_files(run_folder(root, exp.stem)) if times > 1 else {}
        walls, cpus, counted = [], [], []
        for attempt in range(times):
            if attempt:
                put_back(run_folder(root, exp.stem), start)
            if settle or attempt:  # the controller and the database store what the last command changed for a while
                waited, idle = wait_idle(window=2.0)
                out["reads_wait_s"] = out.get("reads_wait_s", 0.0) + waited
                out["reads_idle"] = min(out.get("reads_idle", 1.0), idle)
            walls.append(jobgen([*runs, *args], env))
            cpus.append(LAST_CPU[0])
            counted.append(calls(counter))
        out[f"{key}_s"] = statistics.median(walls)
        out[f"{key}_runs"] = walls  # in the order run (--json); the table shows their median and range
        out[f"{key}_cpu"] = statistics.median(cpus)
        out[f"{key}_calls"] = max(counted)

    partition = default_partition()
    # The jobs' starts (slurmstepd per job) would take this machine's cores from the submission and the
    # status: the partition stops starting jobs (DOWN: jobs stay queued) while jobgen submits them and
    # reads them queued, as it did for the floor's sbatch loop.
    set_partition(partition, "DOWN")
    try:
        measure_one("submit", ["submit", str(exp)])
        out["queued_wait_s"], out["queued_idle"] = wait_idle()
        out["queued"] = queued(exp.stem)
        out["floor_queued_s"] = squeue_floor()
        measure_one("status_queued", ["status", exp.stem], times=repeat)
    finally:
        set_partition(partition, "UP")
    wait_ended(exp.stem, 300 + n * 0.2)
    # The test cluster's daemons share this machine: the accounting stores 10,000 ended jobs for a while
    # after the last one ends. jobgen's reads are measured once the CPUs are idle again, as a login node
    # whose controller and database run elsewhere is.
    out["idle_wait_s"], out["idle"] = wait_idle()
    out["floor_ended_s"] = squeue_floor()
    measure_one("status_ended", ["status", exp.stem], times=repeat)
    # Each read after it waits for the CPUs to be idle again too (2 s windows).
    measure_one("status_again", ["status", exp.stem], settle=True, times=repeat)
    measure_one("runs", ["runs", exp.stem], settle=True, times=repeat)
    measure_one("summary", ["summary", exp.stem, "--format", "json"], settle=True, times=repeat)
    page = str(root / f"{exp.stem}.html")
    measure_one("report", ["report", exp.stem, "-o", page], settle=True, times=repeat)
    # The jobs' usage, final in the accounting, was kept by the first summary: sacct is not asked again.
    measure_one("summary_again", ["summary", exp.stem, "--format", "json"], settle=True, times=repeat)
    # The usage kept changed the manifest: this status reads the run and keeps its rows, the next shows them.
    measure_one("status_last", ["status", exp.stem], settle=True, times=repeat)
    measure_one("status_kept", ["status", exp.stem], settle=True, times=repeat)
    return out


def run_folder(root: Path, name: str) -> Path:
    """The one run of experiment `name` under the bench's output root."""
    (found,) = (root / "runs" / name).iterdir()
    return found


def top_files(folder: Path) -> dict[str, tuple[bytes, int]]:
    """The bytes and mode of every file at the top of a run folder: what a read writes (manifest,
    journal, index)."""
    return {path.name: (path.read_bytes(), path.stat().st_mode) for path in folder.iterdir() if path.is_file()}


def put_back(folder: Path, files: dict[str, tuple[bytes, int]]) -> None:
    """The run folder's top as top_files saw it: a file made since removed, each file written back whole
    with its mode (replaced, as jobgen replaces them)."""
    for path in folder.iterdir():
        if path.is_file() and path.name not in files:
            path.unlink()
    for name, (data, mode) in files.items():
        tmp = folder / f"{name}.bench-tmp"
        tmp.write_bytes(data)
        os.chmod(tmp, stat.S_IMODE(mode))
        os.replace(tmp, folder / name)


def default_partition() -> str:
    """The cluster's default partition (where the bench's jobs go)."""
    out = subprocess.run(["sinfo", "-h", "-o", "%P"], check=True, capture_output=True, text=True).stdout.split()
    found = [name[:-1] for name in out if name.endswith("*")]
    if not found:
        raise SystemExit("the test cluster has no default partition")
    return found[0]


def set_partition(name: str, state: str) -> None:
    subprocess.run(["scontrol", "update", f"PartitionName={name}", f"State={state}"], check=True, capture_output=True)


def queued(name: str) -> int:
    """How many tasks of this experiment are still pending."""
    return sum(line.startswith(f"{name}.") for line in job_names("PD"))


def squeue_floor() -> float:
    """The one squeue a status asks (every job of this user the controller holds, with the fields status
    reads: `-O` formats them slower than `-o %i|%T`, and more so on a busy controller), timed bare:
    the least a status that asks Slurm costs."""
    from jobgen.backends._slurm import SQUEUE_FIELDS, _own_jobs

    fmt = ",".join(f"{field}:|" for field in SQUEUE_FIELDS)
    walls = []
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run(["squeue", "-h", "-r", "-t", "all", *_own_jobs(), "-O", fmt], check=True, capture_output=True)
        walls.append(time.perf_counter() - started)
    return statistics.median(walls)


COLUMNS = (
    "status_queued",
    "status_ended",
    "status_again",
    "runs",
    "summary",
    "report",
    "summary_again",
    "status_last",
    "status_kept",
)


def _markdown(rows: list[dict[str, Any]], cells: Callable[[dict[str, Any]], list[str]]) -> list[str]:
    """One Markdown table: jobs, how, then `cells(row)`: the submission per job and one per COLUMNS."""
    head = "| jobs | how | submit, per job (× bare sbatch) | " + " | ".join(c.replace("_", " ") for c in COLUMNS)
    lines = [head + " |", "|" + " --- |" * (3 + len(COLUMNS))]
    for row in rows:
        how = "arrays" if row["array"] else "one by one"
        lines.append("| " + " | ".join([f"{row['jobs']:,}", how, *cells(row)]) + " |")
    return lines


def _wall(row: dict[str, Any]) -> list[str]:
    per_job = 1000 * row["submit_s"] / row["jobs"]
    cells = [f"{per_job:.1f} ms ({per_job / row['floor_sbatch_ms']:.2f}×; {row['submit_calls']} calls)"]
    for column in COLUMNS:
        floor = row["floor_queued_s"] if column == "status_queued" else row["floor_ended_s"]
        seconds, low, high = row[f"{column}_s"], min(row[f"{column}_runs"]), max(row[f"{column}_runs"])
        spread = f"{low:.2f}–{high:.2f}; " if high > low else ""
        cells.append(f"{seconds:.2f} s ({spread}{seconds / floor:.1f}×; {row[f'{column}_calls']} calls)")
    return cells


def _cpu(row: dict[str, Any]) -> list[str]:
    per_job = 1000 * row["submit_cpu"] / row["jobs"]
    return [f"{per_job:.1f} ms ({per_job / row['floor_sbatch_cpu_ms']:.2f}×)"] + [
        f"{row[f'{column}_cpu']:.2f} s" for column in COLUMNS
    ]


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as Markdown: submission per job against a bare sbatch, every read against one squeue;
    then the same in CPU seconds."""
    floors = [
        f"{row['jobs']:,} {'arrays' if row['array'] else 'one by one'}: sbatch {row['floor_sbatch_ms']:.1f} ms, "
        f"squeue {1000 * row['floor_queued_s']:.0f} ms queued ({row['queued']:,} tasks pending, the partition held, "
        f"after {row['queued_wait_s']:.0f} s for the CPUs to settle: {row['queued_idle']:.0%} idle) / "
        f"{1000 * row['floor_ended_s']:.0f} ms ended (after {row['idle_wait_s']:.0f} s: {row['idle']:.0%} idle); "
        f"the reads after it waited {row['reads_wait_s']:.0f} s in all for the CPUs (each at least "
        f"{row['reads_idle']:.0%} idle)"
        for row in rows
    ]
    runs = ", ".join(sorted({str(row["repeat"]) for row in rows}))
    return "\n".join(
        [
            f"Wall seconds: each read's median of {runs} runs from the same start (fastest–slowest where they"
            " differ), and its ratio to the floor:",
            "",
            *_markdown(rows, _wall),
            "",
            "floors (same run): " + "; ".join(floors),
            "",
            "CPU seconds (user + system, the command's Slurm tools included; bare sbatch the same way;"
            " each read's median):",
            "",
            *_markdown(rows, _cpu),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--how", choices=["both", "one-by-one", "arrays"], default="both", help="submit one by one, as arrays, or both"
    )
    parser.add_argument(
        "--floor-jobs",
        type=int,
        default=0,
        help="bare sbatch calls for the floor (default: as many as the submission it is compared with, "
        "which then meets a queue as long as the floor's did)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs of each read from the same start (median shown)")
    args = parser.parse_args()
    rows = []
    kinds = {"both": (False, True), "one-by-one": (False,), "arrays": (True,)}[args.how]
    with tempfile.TemporaryDirectory(prefix="jobgen-scale-", dir=os.environ.get("JOBGEN_BENCH_DIR", "/tmp")) as tmp:
        root = Path(tmp)
        counter = shim(root / "shim")
        USER_ENV.update(user_env())
        for n in args.sizes:
            for array in kinds:
                # Right before the submission it is compared with: the load of a shared machine changes.
                floors = min(n, args.floor_jobs or n)
                floor, floor_cpu = (x / floors for x in bare_sbatch(floors, counter))
                row = measure(n, array, root, counter, max(1, args.repeat))
                row.update(array=array, floor_sbatch_ms=1000 * floor, floor_sbatch_cpu_ms=1000 * floor_cpu)
                rows.append(row)
                print(_markdown([row], _wall)[2], f"(load {os.getloadavg()[0]:.1f})", flush=True)
                if args.json:
                    args.json.write_text(json.dumps(rows, indent=2))
    print(table(rows))
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
