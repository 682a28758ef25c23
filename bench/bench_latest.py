"""`jobgen status` with no run named, under an output root of several experiments of 10,000 jobs: what
the run's kind kept in each run's index (jobgen.record.store.run_kind) buys.

    .venv/bin/python bench/bench_latest.py [--experiments 8] [--jobs 10000] [--rounds 3]

`jobgen status` alone shows the latest submitted run of any experiment, so it asks the newest run of
every experiment whether it is a dry run or a probe. With the kind kept, each answer is a stat and one
indexed lookup; without it (the other runs' index.sqlite removed before the call), each is a parse of a
10,000-entry manifest. Both are timed as a user runs the CLI (CPU seconds of the process, medians of
`--rounds`), the status itself reading the same settled run, and printed side by side with their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_status import forgetful_slurm, settle, timed, user_env  # noqa: E402
from tests.data.summary import synth  # noqa: E402


def make_experiment(root: Path, name: str, n: int, created: str) -> Path:
    jobs = [synth.FakeJob(f"job-{i:05d}", sweep={"train.lr": 1e-5 * (1 + i)}) for i in range(n)]
    run = synth.write_run(root, name, jobs, run_id=f"{created}-ab12")
    settle(run)
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", type=int, default=8, help="at most 20")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    jobgen = [str(Path(sys.executable).with_name("jobgen"))]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        env = {**user_env(), "JOBGEN_NO_COLOR": "1"}
        env["PATH"] = forgetful_slurm(Path(tmp) / "slurm") + os.pathsep + env.get("PATH", "")
        # The newest experiment's run is the one shown; the others are asked their kind.
        runs = [
            make_experiment(root, f"exp{k}", args.jobs, f"202611{10 + k:02d}-200000") for k in range(args.experiments)
        ]
        status = [*jobgen, "--output-root", str(root), "status"]
        timed(status, env)  # every run's kind and the shown run's records kept
        timed(status, env)
        kept, asked = [], []
        for _ in range(args.rounds):
            kept.append(timed(status, env)[1])
            for run in runs[:-1]:
                (run / "index.sqlite").unlink(missing_ok=True)
            asked.append(timed(status, env)[1])
        k, a = statistics.median(kept), statistics.median(asked)
        print(f"jobgen status, {args.experiments} experiments of {args.jobs:,} jobs (CPU s, median of {args.rounds})")
        print(f"  kind kept in each run's index   {k:5.2f} s")
        print(f"  kind read from each manifest    {a:5.2f} s")
        print(f"  the kept kind saves {1 - k / a:.0%} of the command")
    return 0


if __name__ == "__main__":
    sys.exit(main())
