"""jobgen at scale on the real test cluster: submission, status and summary of 100 to 10,000 jobs.

Each figure is printed next to its floor measured in the same run (a bare `sbatch --parsable --wrap true`
loop for submission; one `squeue -t all` for status), as a ratio: these machines are noisy, so only
ratios measured side by side mean anything. The jobs' launch is `true` (bench/true.sbatch.j2): Slurm
does all the work there is, and jobgen's own cost is what is left.

    source /tmp/jobgen-cluster/env.sh
    .venv/bin/python bench/bench_scale.py --sizes 100 1000 10000

Besides the seconds, every command runs behind a PATH shim that counts the Slurm processes it starts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def calls(folder: Path) -> int:
    """How many Slurm processes the last jobgen command started (not its jobs)."""
    path = folder / "calls"
    lines = path.read_text().splitlines() if path.exists() else []
    path.unlink(missing_ok=True)
    return sum(line.split()[-1] == str(LAST_PID[0]) for line in lines)


def jobgen(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "jobgen.cli", *args], env=env, stdout=subprocess.DEVNULL)
    LAST_PID[0] = proc.pid
    if proc.wait() != 0:
        raise SystemExit(f"jobgen {' '.join(args)} failed")
    return time.perf_counter() - started


def bare_sbatch(n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        subprocess.run(["sbatch", "--parsable", "--wrap", "true", "-o", "/dev/null"], check=True, capture_output=True)
    return time.perf_counter() - started


def wait_ended(name: str, timeout: float) -> None:
    """Until no job of this experiment is queued or running (other users' jobs may be)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%j"], capture_output=True, text=True).stdout
        if not any(line.startswith(f"{name}.") for line in out.splitlines()):
            return
        time.sleep(2)
    raise SystemExit(f"jobs still queued after {timeout:.0f} s")


def measure(n: int, array: bool, root: Path, counter: Path) -> dict[str, float]:
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
    env = {**os.environ, "PATH": f"{counter}:{os.environ['PATH']}"}
    out = {"jobs": n}
    out["submit_s"] = jobgen(["--output-root", str(root / "runs"), "submit", str(exp)], env)
    out["submit_calls"] = calls(counter)
    out["status_queued_s"] = jobgen(["--output-root", str(root / "runs"), "status", exp.stem], env)
    out["status_queued_calls"] = calls(counter)
    wait_ended(exp.stem, 120 + n * 0.2)
    out["status_ended_s"] = jobgen(["--output-root", str(root / "runs"), "status", exp.stem], env)
    out["status_ended_calls"] = calls(counter)
    out["status_again_s"] = jobgen(["--output-root", str(root / "runs"), "status", exp.stem], env)
    out["status_again_calls"] = calls(counter)
    out["summary_s"] = jobgen(["--output-root", str(root / "runs"), "summary", exp.stem, "--format", "json"], env)
    out["summary_calls"] = calls(counter)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="jobgen-scale-", dir=os.environ.get("JOBGEN_BENCH_DIR", "/tmp")) as tmp:
        root = Path(tmp)
        counter = shim(root / "shim")
        for n in args.sizes:
            floor = bare_sbatch(min(n, 500)) / min(n, 500)
            started = time.perf_counter()
            subprocess.run(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T"], check=True, capture_output=True)
            squeue_s = time.perf_counter() - started
            for array in (False, True):
                row = measure(n, array, root, counter)
                row.update(array=array, floor_sbatch_ms=1000 * floor, floor_squeue_s=squeue_s)
                rows.append(row)
                per_job = 1000 * row["submit_s"] / n
                print(
                    f"{n:>6} jobs {'arrays ' if array else 'one by one'}: submit {row['submit_s']:.1f} s "
                    f"= {per_job:.1f} ms/job ({per_job / row['floor_sbatch_ms']:.2f}x a bare sbatch, "
                    f"{row['floor_sbatch_ms']:.1f} ms; {row['submit_calls']} Slurm calls) | status queued "
                    f"{row['status_queued_s']:.2f} s ({row['status_queued_calls']} calls) | status ended "
                    f"{row['status_ended_s']:.2f} s ({row['status_ended_calls']} calls), again "
                    f"{row['status_again_s']:.2f} s ({row['status_again_calls']} calls) | summary "
                    f"{row['summary_s']:.2f} s ({row['summary_calls']} calls) | one squeue -t all "
                    f"{row['floor_squeue_s']:.2f} s",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
