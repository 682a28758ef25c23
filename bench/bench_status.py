"""`jobgen status` and `summary` of one run of 1,000 to 10,000 finished jobs, each against its floor.

    .venv/bin/python bench/bench_status.py [--jobs 1000 10000]

Every job's records are checked for damage (jobgen.run.damage) on each command; the run keeps the
verdicts by each file's stat stamp (.verdicts.json), so only the first command after the jobs wrote
their files reads them all. Printed side by side, from one process each (the CLI as a user runs it):
the first status (no verdicts yet), the next one, and a summary, each as a ratio to the floor measured
in the same run: `python -c pass` plus one os.stat per job file, the least a status that checks every
record can cost. The jobs are recorded as ended, so Slurm is not asked.
"""

from __future__ import annotations

import argparse
import os
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


def timed(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def settle(run: Path) -> None:
    """The jobs' files as written a minute ago (a verdict is kept only for a file that has settled)."""
    past = time.time() - 60
    for folder in (run / "jobs").iterdir():
        for name in JOB_FILES:
            path = folder / name
            if path.exists():
                os.utime(path, (past, past))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 10_000])
    args = parser.parse_args()
    env = {**os.environ, "JOBGEN_NO_COLOR": "1"}
    jobgen = [str(Path(sys.executable).with_name("jobgen"))]
    print(f"{'jobs':>6}  {'floor':>7}  {'status (first)':>16}  {'status (next)':>15}  {'summary':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.jobs:
            run = make_run(Path(tmp), n)
            settle(run)
            root = ["--output-root", str(run.parent.parent)]
            floor = timed([sys.executable, "-c", FLOOR.format(files=JOB_FILES), str(run)], env)
            first = timed([*jobgen, *root, "status", str(run)], env)
            again = timed([*jobgen, *root, "status", str(run)], env)
            summary = timed([*jobgen, *root, "summary", str(run)], env)
            print(
                f"{n:>6}  {floor:6.2f}s  {first:6.2f}s ({first / floor:4.1f}x)  {again:6.2f}s ({again / floor:4.1f}x)"
                f"  {summary:5.2f}s ({summary / floor:4.1f}x)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
