"""Time `jobgen summary` over synthetic runs of finished jobs: 10,000 must take <= 2 s, and grow linearly.

    .venv/bin/python bench/bench_summary.py [--jobs 10000] [--format table]

Writes 1k and 10k finished jobs (one run each, every job with its own configuration, so nothing
collapses when combining) into a temporary directory, then times summarize() end to end: reading every
manifest and result.json, aggregating, and rendering. Writing the files is not timed; the first read of a
fresh file is (the page cache is warm either way, as it is right after the jobs wrote them).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobgen.results.summary import FORMATS, summarize  # noqa: E402
from tests.data.summary import synth  # noqa: E402

LIMIT_S = 2.0


def make_run(root: Path, n: int) -> Path:
    engines = ("torch", "lightning", "fabric")
    jobs = [
        synth.FakeJob(
            f"job-{i:05d}",
            sweep={"train.engine": engines[i % 3], "train.lr": 1e-5 * (1 + i)},
            engine=engines[i % 3],
            train_s=100.0 + i % 97,
            test_acc=0.80 + (i % 13) / 100,
        )
        for i in range(n)
    ]
    return synth.write_run(root / str(n), "bench", jobs)


def time_summary(run: Path, fmt: str, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        summarize([run], fmt=fmt, width=200)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--format", choices=FORMATS, default=None, help="one format (default: all)")
    args = parser.parse_args()
    small = args.jobs // 10
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        runs = {n: make_run(Path(tmp), n) for n in (small, args.jobs)}
        for fmt in [args.format] if args.format else FORMATS:
            t_small, t_big = time_summary(runs[small], fmt), time_summary(runs[args.jobs], fmt)
            ok = t_big <= LIMIT_S
            failed |= not ok
            print(
                f"{fmt:>8}: {small:>6} jobs {t_small:6.3f} s | {args.jobs:>6} jobs {t_big:6.3f} s"
                f" | ratio {t_big / t_small:5.1f} (linear: {args.jobs / small:.0f})"
                f" | {'ok' if ok else f'OVER {LIMIT_S} s'}"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
