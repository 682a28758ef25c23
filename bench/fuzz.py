"""Fuzz the submit path with hostile experiment files (the rule of tests/support/fuzzing.py) and print the counts.

    python bench/fuzz.py                 # 10,000 cases
    python bench/fuzz.py --cases 50000 --seed 7

Every case is an experiment file built from the schema with hostile values (and maybe a hostile file
name), submitted as a dry run: refused in one line with nothing written, or accepted with scripts that
pass bash -n and shellcheck, keep their #SBATCH block whole and, run with stub Slurm tools, create no
marker file. The first broken case stops the run with hypothesis' smallest example of it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from tests.support.fuzzing import Counts, experiments, lint, run_case, stub_dir  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tally = Counts()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jobgen-fuzz-") as tmp:
        base = Path(tmp)
        stubs = stub_dir(base / "stubs")

        @seed(args.seed)
        @settings(
            max_examples=args.cases,
            deadline=None,
            database=None,
            phases=[Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck),
        )
        @given(experiments())
        def case(exp):
            run_case(*exp, base, stubs, tally)

        case()
        generated = time.monotonic() - started
        findings = lint(tally.scripts)
        counts = tally.counts
        counts["scripts linted (bash -n, shellcheck)"] = len(tally.scripts)
        counts["lint findings"] = len(findings)
        for line in findings[:20]:
            print(line)
    print(
        f"{args.cases} cases (seed {args.seed}) in {generated:.0f} s, lint {time.monotonic() - started - generated:.0f} s"
    )
    for key in (
        "cases",
        "refused",
        "accepted",
        "accepted with a payload",
        "scripts executed",
        "python reached",
        "scripts linted (bash -n, shellcheck)",
        "lint findings",
        "file name the file system refuses",
        "markers found",
    ):
        print(f"  {key:<40} {counts[key]:>7,}")
    return 0 if counts["markers found"] == 0 and not findings else 1


if __name__ == "__main__":
    sys.exit(main())
