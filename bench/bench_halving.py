"""Successive halving against the full sweep, side by side in one run, on data made here (offline).

    .venv/bin/python bench/bench_halving.py [--epochs 9] [--train 3000]

The same 9-point learning-rate sweep of the tiny built-in model runs twice on the local backend (jobs
one after another, on one core each): every point to the end, then with [sweep.halving] (rungs 1 and
3, eta 3). The data is a polarity task with 12% of its labels flipped at random (train, validation and
test alike), so that accuracy tops out below 1 and the learning rates differ. For each variant: the
best finished job's test value of the metric halving compares, the task's primary one (accuracy here;
the best job: the best validation value among the finished ones), and the hours used: CPU-hours, the
processor time of the run and of every process under it (its jobs run one at a time, one thread each,
so on an idle machine this is its wall time; on a shared one the wall time also counts the other
users' load, which differs between the two variants), and the wall-clock hours beside them. Target:
halving's best within 0.5 points of the full sweep's, with at most 50% of its CPU-hours.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training.synthetic import make_rows  # noqa: E402

JOBGEN = str(Path(sys.executable).parent / "jobgen")
LRS = [1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1]
NOISE = 0.12

EXPERIMENT = """
[experiment]
name = "{name}"
[launch]
backend = "local"
[train]
model = "builtin:tiny"
engine = "torch"
accelerator = "cpu"
epochs = {epochs}
batch_size = 32
eval_batch_size = 256
warmup_ratio = 0.1
num_workers = 0
log_every_n_steps = 1000
[data]
files = {{ train = "train.csv", validation = "validation.csv", test = "test.csv" }}
validation_split = "validation"
max_length = 48
[sweep.grid]
"train.lr" = {lrs}
{halving}
"""


def write_data(folder: Path, n_train: int) -> None:
    rng = random.Random(7)
    for split, n, seed in (("train", n_train, 1), ("validation", 600, 2), ("test", 1000, 3)):
        rows = make_rows(n, seed=seed)
        labels = [("negative" if y == "positive" else "positive") if rng.random() < NOISE else y for y in rows["label"]]
        with open(folder / f"{split}.csv", "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["text", "label"])
            writer.writerows(zip(rows["text"], labels, strict=True))


def run(folder: Path, name: str, epochs: int, halving: str) -> dict[str, float]:
    exp = folder / f"{name}.toml"
    exp.write_text(EXPERIMENT.format(name=name, epochs=epochs, lrs=json.dumps(LRS), halving=halving))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    start, used = time.monotonic(), _children_cpu_s()
    done = subprocess.run([JOBGEN, "submit", exp.name], cwd=folder, env=env, capture_output=True, text=True)
    wall, cpu = time.monotonic() - start, _children_cpu_s() - used
    if done.returncode != 0:
        raise SystemExit(f"{name}: jobgen submit failed\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    (run_dir,) = (folder / "runs" / name).iterdir()
    results = [json.loads(p.read_text()) for p in run_dir.glob("jobs/*/result.json")]
    # The metric halving compares by default, the task's primary one: the best job is the best by its
    # validation value (the tested epoch's), and its test value is what the sweep found.
    (metric,) = {r["primary_metric"] for r in results}
    best = max(results, key=lambda r: (r["val_metrics"][metric], r["test_metrics"][metric]))
    return {
        "finished": len(results),
        "metric": metric,
        "test": 100 * best["test_metrics"][metric],
        "hours": cpu / 3600,
        "wall_hours": wall / 3600,
    }


def _children_cpu_s() -> float:
    """Processor seconds (user and system) of every process this one has waited for, and theirs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=9)
    parser.add_argument("--train", type=int, default=3000, help="training rows")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-halving-") as tmp:
        folder = Path(tmp)
        write_data(folder, args.train)
        full = run(folder, "full", args.epochs, "")
        halved = run(folder, "halving", args.epochs, "[sweep.halving]\nrungs = [1, 3]\neta = 3\n")
    print(f"{len(LRS)}-point lr sweep, {args.epochs} epochs, {args.train} training rows, {NOISE:.0%} label noise")
    title = f"best test {full['metric']}"
    print(f"{'variant':<10} {'finished':>8} {title:>18} {'CPU-hours':>10} {'wall-hours':>10}")
    for name, row in (("full", full), ("halving", halved)):
        print(f"{name:<10} {row['finished']:>8} {row['test']:>17.2f}% {row['hours']:>10.4f} {row['wall_hours']:>10.4f}")
    gap, share = full["test"] - halved["test"], halved["hours"] / full["hours"]
    ok = gap <= 0.5 and share <= 0.5
    print(
        f"halving: {gap:+.2f} points below the full sweep's best, {share:.0%} of its CPU-hours "
        f"({halved['wall_hours'] / full['wall_hours']:.0%} of its wall-hours): {'PASS' if ok else 'FAIL'}"
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
