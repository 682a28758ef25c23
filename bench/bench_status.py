"""`jobgen status`, `summary` and `report` of one run of ended jobs, each against its floor and its budget.

    .venv/bin/python bench/bench_status.py [--jobs 1000 10000] [--without-results] [--answered]

Each command is timed in a process of its own (the CLI as a user runs it, its bytecode compiled once
beforehand, as an installed package has it), three times, and the median printed beside its budget:

    first status     of a run whose jobs just ended (no index yet: every record read)       1.5 s
    first summary    of such a run, no command before it                                     2.0 s
    first report     of such a run, no command before it                                     2.0 s
    settled reads    status, summary, report again (the index holds what was read)           0.5 s

Each first read has a fresh copy of the run (new inodes: nothing of another copy's index holds). The
floor, measured in the same round, is `python -c pass` plus one os.stat per job file: the least a
command that checks every record can cost. `bare first` is the least a first status can cost with
the run's index as it is (a bare script: every record stat'ed, the JSON ones read, parsed and checked,
the index's facts of them written, a line per job; no state rule, no Slurm, no CLI): what the first
budgets compare with. `lean summary` is the least a settled summary can cost
with the run's index as it is (a bare script: results from the index by stamp, a line per job, no
checks, no CLI): what the settled budget compares with; after the table, the settled summary's parts
timed in one process (reading the records, the rows, the lines, the table's text) show what making and
rendering the lines costs from numbers already in memory. `gc on` times the first status and summary with Python's
cycle collector left on (the CLI turns it off while a command runs): what keeping that switch buys.
CPU seconds (user + system) are printed too: on a busy machine they vary less than the wall times.

With `--without-results` the jobs ended without their result (bench_scale.py's `true` jobs): the
stand-in squeue holds each as COMPLETED, the first status reads each job's one-line log for why. The
jobs are recorded as submitted, as a sweep that has just ended is: the first status asks Slurm once per
tool (stand-ins that know no job, as a controller that has forgotten them) and records the states the
files say; the later commands ask nothing. With `--answered` the stand-in squeue answers for every job
instead (COMPLETED, exit 0, its times), as the controller does within MinJobAge of the end.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
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
# The least a settled summary can cost with the run's index as it is: the manifest parsed, the results'
# rows loaded from the index, each job's records stat'ed and its result's stamp compared, one line of
# its numbers printed; no damage verdicts, no state rule, no usage, no grouping, no CLI.
LEAN = """
import json, os, sqlite3, sys
run = sys.argv[1]
with open(os.path.join(run, "manifest.json"), "rb") as fh:
    jobs = json.loads(fh.read())["jobs"]
db = sqlite3.connect(os.path.join(run, "index.sqlite"))
kept = {{r: (m, v) for r, m, v in db.execute("SELECT record, stamp, value FROM facts WHERE key = 'result'")}}
out = []
for job in jobs:
    folder = "jobs/" + job["name"]
    for name in {files}:
        try:
            st = os.stat(os.path.join(run, folder, name))
        except FileNotFoundError:
            continue
        if name == "result.json":
            mark, value = kept[folder + "/" + name]
            assert mark == f"{{st.st_ino}} {{st.st_size}} {{st.st_mtime_ns}} {{st.st_ctime_ns}}"
            result = json.loads(value)
    cells = [job["name"], job.get("state") or ""]
    for key in ("engine", "strategy", "precision", "nodes", "devices_per_node", "train_s", "samples_per_s",
                "peak_gpu_mb", "best_val_acc", "test_acc", "test_f1", "requeue_count", "epochs_done"):
        value = result.get(key)
        cells.append("-" if value is None else f"{{value:.4f}}" if type(value) is float else str(value))
    out.append(cells)
widths = [max(len(row[i]) for row in out) for i in range(len(out[0]))]
sys.stdout.write("\\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in out) + "\\n")
"""
# The least a first status can cost with the run's index as it is: each job's records stat'ed, the
# JSON ones read, parsed and checked (an object of the right schema), the facts the commands keep of them
# (the check's verdict, the result's fields, what the spec asked for) written to an index of the same
# table in one transaction, a line per job printed; no state rule, no Slurm, no CLI.
BARE_FIRST = """
import json, os, sqlite3, sys
run = sys.argv[1]
with open(os.path.join(run, "manifest.json"), "rb") as fh:
    jobs = json.loads(fh.read())["jobs"]
encode = json.JSONEncoder(separators=(",", ":")).encode
rows, out = [], []
for job in jobs:
    folder = "jobs/" + job["name"] + "/"
    finished = False
    for name in {files}:
        path = os.path.join(run, folder + name)
        try:
            os.stat(path)
        except FileNotFoundError:
            continue
        finished = finished or name == "result.json"
        if name == "metrics.csv":
            continue
        with open(path, "rb", buffering=0) as fh:
            raw = fh.read()
            st = os.fstat(fh.fileno())
        mark = f"{{st.st_ino}} {{st.st_size}} {{st.st_mtime_ns}} {{st.st_ctime_ns}}"
        doc = json.loads(raw)
        fine = type(doc) is dict and doc.get("schema") == 1
        rows.append((folder + name, "problem", mark, "code", None if fine else encode("schema")))
        if name == "result.json":
            get = doc.get
            times, speed, memory = get("times_s") or {{}}, get("throughput") or {{}}, get("peak_memory_mb") or {{}}
            fields = {{k: get(k) for k in ("engine", "strategy", "precision", "compile", "nodes", "devices_per_node",
                      "accelerator", "best_val_acc", "test_acc", "test_f1", "requeue_count", "epochs_done",
                      "finished_at", "world_size", "primary_metric", "test_metrics", "val_metrics", "predictions")}}
            fields.update(train_s=times.get("train"), total_s=times.get("total"), samples_per_s=speed.get("samples_per_s"),
                          tokens_per_s=speed.get("tokens_per_s"), peak_host_mb=memory.get("host_rss"))
            rows.append((folder + name, "result", mark, "code", encode(fields)))
        elif name == "spec.json":
            slurm = doc.get("slurm") or {{}}
            asked = [slurm.get("gpus_per_node"), slurm.get("cpus_per_task"), slurm.get("time")]
            rows.append((folder + name, "asked", mark, "code", encode(asked)))
    out.append(job["name"] + "  " + ("COMPLETED" if finished else str(job.get("state"))))
db = sqlite3.connect(os.path.join(run, "bare-index.sqlite"))
db.execute("CREATE TABLE facts (record TEXT NOT NULL, key TEXT NOT NULL, stamp TEXT NOT NULL, "
           "code TEXT NOT NULL, value TEXT, PRIMARY KEY (record, key)) WITHOUT ROWID")
with db:
    db.executemany("INSERT OR REPLACE INTO facts VALUES (?, ?, ?, ?, ?)", rows)
sys.stdout.write("\\n".join(out) + "\\n")
"""
# The settled summary's parts, timed in one process as the CLI runs them (the cycle collector off): how
# much of it is reading the run and how much is making and rendering the lines from numbers in memory.
PARTS = """
import gc, sys, time
from pathlib import Path
from jobgen.results.collect import collect, look_and_keep
from jobgen.results.state_rule import read_some
from jobgen.results.summary import RENDERERS, apply_baseline, build_lines
gc.disable()
t0 = time.perf_counter()
loaded = read_some([Path(sys.argv[1])])
look_and_keep(loaded)
t1 = time.perf_counter()
rows = collect(loaded, None)
t2 = time.perf_counter()
lines = build_lines(rows)
apply_baseline(lines, None)
t3 = time.perf_counter()
RENDERERS["table"](lines, color=False, width=200)
print(t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3)
"""
PART_NAMES = ("read and check the records", "the rows (results from the index)", "the lines", "the table's text")
# The CLI with the cycle collector left on while the command runs.
GC_ON = "import gc, sys; gc.disable = lambda: None; from jobgen.cli import main; sys.argv[0] = 'jobgen'; main()"
BUDGETS = {"status": 1.5, "summary": 2.0, "report": 2.0, "settled": 0.5}


def timed(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def settle(run: Path) -> None:
    """The jobs' files and folders as written a minute ago (the index keeps only what has settled)."""
    past = time.time() - 60
    for folder in (run / "jobs").iterdir():
        for name in JOB_FILES:
            path = folder / name
            if path.exists():
                os.utime(path, (past, past))
        os.utime(folder, (past, past))
    os.utime(run / "manifest.json", (past, past))


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
    for command in (["status", run], ["summary", run], ["report", run, "-o", str(root / "warm.html")]):
        timed([*jobgen, "--output-root", str(root / "10"), *command], env)


def fresh(template: Path, where: Path) -> Path:
    """A copy of the run as its jobs left it: new inodes, no index, every file settled."""
    shutil.rmtree(where, ignore_errors=True)
    shutil.copytree(template, where, symlinks=True)
    settle(where)
    return where


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 10_000])
    parser.add_argument("--rounds", type=int, default=3, help="rounds to take the median of")
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
    names = ["floor", "status", "bare first", "summary", "report", "status again", "summary again", "report again"]
    names += ["lean summary"]
    names += ["status gc on", "summary gc on"]
    budget = {"status": "status", "summary": "summary", "report": "report"}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**user_env(), "JOBGEN_NO_COLOR": "1"}
        env["PATH"] = forgetful_slurm(Path(tmp) / "slurm") + os.pathsep + env.get("PATH", "")
        warm_up(jobgen, Path(tmp) / "warm", env)
        for n in args.jobs:
            template = (
                make_resultless_run(Path(tmp), n, Path(tmp) / "slurm")
                if args.without_results
                else make_run(Path(tmp), n)
            )
            if args.answered and not args.without_results:
                answering_slurm(Path(tmp) / "slurm", n)
            walls: dict[str, list[float]] = {name: [] for name in names}
            parts: list[list[float]] = []
            cpus: dict[str, list[float]] = {name: [] for name in names}

            def take(name: str, measured: tuple[float, float], walls=walls, cpus=cpus) -> None:
                walls[name].append(measured[0])
                cpus[name].append(measured[1])

            for _ in range(args.rounds):
                copies = Path(tmp) / "copies" / "bench"
                run = fresh(template, copies / template.name)
                root = ["--output-root", str(copies.parent)]
                page = str(Path(tmp) / f"{n}.html")
                take("floor", timed([sys.executable, "-c", FLOOR.format(files=JOB_FILES), str(run)], env))
                take("status", timed([*jobgen, *root, "status", str(run)], env))
                take("status again", timed([*jobgen, *root, "status", str(run)], env))
                take("summary again", timed([*jobgen, *root, "summary", str(run)], env))
                take("report again", timed([*jobgen, *root, "report", str(run), "-o", page], env))
                take("lean summary", timed([sys.executable, "-c", LEAN.format(files=JOB_FILES), str(run)], env))
                said = subprocess.run(
                    [sys.executable, "-c", PARTS, str(run)], env=env, capture_output=True, text=True, check=True
                )
                parts.append([float(x) for x in said.stdout.split()])
                run = fresh(template, copies / template.name)
                bare = [sys.executable, "-c", BARE_FIRST.format(files=(*JOB_FILES, "retries.json")), str(run)]
                take("bare first", timed(bare, env))
                run = fresh(template, copies / template.name)
                take("summary", timed([*jobgen, *root, "summary", str(run)], env))
                run = fresh(template, copies / template.name)
                take("report", timed([*jobgen, *root, "report", str(run), "-o", page], env))
                run = fresh(template, copies / template.name)
                take("status gc on", timed([sys.executable, "-c", GC_ON, *root, "status", str(run)], env))
                run = fresh(template, copies / template.name)
                take("summary gc on", timed([sys.executable, "-c", GC_ON, *root, "summary", str(run)], env))
            floor = statistics.median(walls["floor"])
            print(f"{n:,} jobs, median of {args.rounds} (wall s, x floor, CPU s, budget)")
            for name in names:
                wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
                limit = BUDGETS["settled"] if name.endswith("again") else BUDGETS.get(budget.get(name, ""), None)
                said = "" if limit is None else f"  budget {limit:.1f} s {'ok' if wall <= limit else 'OVER'}"
                print(f"  {name:<14} {wall:6.2f} s  {wall / floor:5.1f}x  cpu {cpu:5.2f} s{said}", flush=True)
            medians = [statistics.median(p[i] for p in parts) for i in range(len(PART_NAMES))]
            print("  the settled summary's parts, in one process:")
            for part, seconds in zip(PART_NAMES, medians, strict=True):
                print(f"    {part:<34} {seconds:6.2f} s  {seconds / floor:5.1f}x")
            lines_and_table = medians[2] + medians[3]
            print(
                f"    the lines and the table alone: {lines_and_table:.2f} s, {lines_and_table / floor:.1f}x the floor"
            )
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
