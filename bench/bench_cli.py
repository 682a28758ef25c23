"""CLI start-up and dry-run speed, measured side by side in one run.

    python bench/bench_cli.py

Prints `jobgen --help` wall time as a ratio to `python -c pass` (target <= 3x), and the dry-run
of a 1,000-point sweep: seconds and scripts per second (target <= 2 s).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPEATS = 7
SWEEP = """
[experiment]
name = "bench"
[slurm]
gpus_per_node = 4
[train]
strategy = "ddp"
[data]
dataset = "imdb"
[sweep.grid]
"train.seed" = [{seeds}]
"train.lr" = [1e-5, 2e-5, 3e-5, 5e-5, 1e-4]
"train.precision" = ["bf16-mixed", "32-true"]
"""


def wall(command: list[str]) -> float:
    """Median wall time of a command over REPEATS runs (after one warm-up)."""
    subprocess.run(command, capture_output=True, check=True)
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def dry_run_1000(folder: Path) -> tuple[float, int]:
    from click.testing import CliRunner

    from jobgen.cli import main

    exp = folder / "bench.toml"
    exp.write_text(SWEEP.format(seeds=", ".join(str(i) for i in range(100))))
    start = time.perf_counter()
    result = CliRunner().invoke(main, ["--output-root", str(folder / "runs"), "submit", str(exp), "--dry-run"])
    elapsed = time.perf_counter() - start
    assert result.exit_code == 0, result.output
    scripts = len(list((folder / "runs").rglob("job.sbatch")))
    return elapsed, scripts


def raw_files(folder: Path, count: int) -> float:
    """The filesystem's own cost for what a dry run writes: a folder and two files per job."""
    start = time.perf_counter()
    for i in range(count):
        job = folder / "raw" / str(i)
        job.mkdir(parents=True)
        (job / "spec.json").write_text("x" * 2500)
        (job / "job.sbatch").write_text("y" * 2500)
    return time.perf_counter() - start


def main() -> None:
    jobgen = str(Path(sys.executable).parent / "jobgen")
    bare = wall([sys.executable, "-c", "pass"])
    helped = wall([jobgen, "--help"])
    print(f"python -c pass      : {bare * 1000:7.1f} ms (median of {REPEATS})")
    print(f"jobgen --help       : {helped * 1000:7.1f} ms")
    print(f"ratio               : {helped / bare:7.2f}x  (target <= 3x)")
    # File creation on some disks costs more than everything jobgen does: measure it side by side,
    # and measure jobgen alone on a RAM-backed folder where there is one.
    places = [("memory (/dev/shm)", "/dev/shm")] if Path("/dev/shm").is_dir() else []
    places.append(("disk (" + tempfile.gettempdir() + ")", None))
    for label, where in places:
        with tempfile.TemporaryDirectory(dir=where) as tmp:
            elapsed, scripts = dry_run_1000(Path(tmp))
            raw = raw_files(Path(tmp), scripts)
        print(
            f"dry-run 1,000 jobs on {label}: {elapsed:6.2f} s = {scripts / elapsed:,.0f} scripts/s "
            f"(target <= 2 s); writing the same files bare: {raw:5.2f} s (jobgen / bare = {elapsed / raw:4.1f}x)"
        )


if __name__ == "__main__":
    main()
