"""The GPU paths, checked in one run of at most 8 minutes on a machine with one GPU and no internet
(bench/gpu_check.sh starts it; docs/gpu-check.md says how to bring it there).

1. Smoke matrix: the code paths only a GPU takes, one `python -m training` process per cell, a few at
   a time (`--jobs`): fp16 loss scaling with a resume (the GradScaler and CUDA RNG states in the
   checkpoint), bf16-true, deterministic cuBLAS, torch.compile, every DeepSpeed stage that runs on one
   device (the *_offload ones) under each engine that runs it, and Fabric's and the HF Trainer's own
   fp16 paths. A cell passes when the job exits 0 with the optimizer steps it was given; a failure
   shows its first error line.
2. The single-GPU table, one job at a time so that nothing else shares the GPU: the plain loop,
   Lightning 32-true, 16-mixed, bf16-mixed, bf16-mixed compiled, Fabric and the HF Trainer, on
   builtin:distilbert-shape (distilbert-base-uncased's architecture, random weights) and synthetic
   IMDB-length texts. Minutes of training, samples/s, MFU (jobgen summary's: each precision's own
   peak, from the GPU's own name) and the speed-up over the plain loop. Every configuration times the
   same window: the first `--warmup` batches are warm-up in each.

The plan (cells, expected minutes, bytes brought) is printed first. Output: this text (gpu_check.sh
keeps it as gpu_check.log) and gpu_check.json in --out (every cell's outcome, each failure's log
tail): two files. The jobs' own folders live in a temporary folder, removed at the end.

    bash bench/gpu_check.sh             # on the GPU machine
    bash bench/gpu_check.sh --cpu       # the CI-sized form on a CPU (tests/training/test_gpu_check.py)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jobgen.results.cost import mfu, peak_flops  # noqa: E402
from training.contract import DISTILBERT_SHAPE_MODEL, TINY_MODEL  # noqa: E402


@dataclass(frozen=True)
class Cell:
    name: str
    train: dict[str, Any]
    resume: bool = False  # run one epoch, then the same job to two epochs: it must resume
    extra_s: float = 0.0  # expected seconds beyond a plain cell (compile, DeepSpeed's start)


OFFLOAD2, OFFLOAD3 = "deepspeed_stage_2_offload", "deepspeed_stage_3_offload"
SMOKE = (
    Cell("torch-16-mixed-resume", {"engine": "torch", "precision": "16-mixed"}, resume=True),
    Cell("torch-bf16-true", {"engine": "torch", "precision": "bf16-true"}),
    Cell("torch-bf16-mixed-deterministic", {"engine": "torch", "precision": "bf16-mixed", "deterministic": True}),
    Cell("torch-bf16-mixed-compile", {"engine": "torch", "precision": "bf16-mixed", "compile": True}, extra_s=60),
    Cell("fabric-16-mixed-resume", {"engine": "fabric", "precision": "16-mixed"}, resume=True),
    Cell(
        "fabric-ds2-offload-bf16-mixed",
        {"engine": "fabric", "strategy": OFFLOAD2, "precision": "bf16-mixed"},
        extra_s=20,
    ),
    Cell(
        "fabric-ds3-offload-16-mixed", {"engine": "fabric", "strategy": OFFLOAD3, "precision": "16-mixed"}, extra_s=25
    ),
    Cell("lightning-bf16-true", {"engine": "lightning", "precision": "bf16-true"}),
    Cell(
        "lightning-ds2-offload-16-mixed",
        {"engine": "lightning", "strategy": OFFLOAD2, "precision": "16-mixed"},
        extra_s=20,
    ),
    Cell(
        "lightning-ds3-offload-bf16-mixed",
        {"engine": "lightning", "strategy": OFFLOAD3, "precision": "bf16-mixed"},
        extra_s=25,
    ),
    Cell("hf_trainer-16-mixed", {"engine": "hf_trainer", "precision": "16-mixed"}),
    Cell(
        "hf_trainer-ds2-offload-bf16-mixed",
        {"engine": "hf_trainer", "strategy": OFFLOAD2, "precision": "bf16-mixed"},
        extra_s=20,
    ),
    Cell(
        "hf_trainer-ds3-offload-16-mixed",
        {"engine": "hf_trainer", "strategy": OFFLOAD3, "precision": "16-mixed"},
        extra_s=25,
    ),
)
TABLE = (
    Cell("plain-pytorch", {"engine": "torch", "precision": "32-true"}),
    Cell("lightning-32-true", {"engine": "lightning", "precision": "32-true"}),
    Cell("lightning-16-mixed", {"engine": "lightning", "precision": "16-mixed"}),
    Cell("lightning-bf16-mixed", {"engine": "lightning", "precision": "bf16-mixed"}),
    Cell("lightning-bf16-compile", {"engine": "lightning", "precision": "bf16-mixed", "compile": True}, extra_s=60),
    Cell("fabric-bf16-mixed", {"engine": "fabric", "precision": "bf16-mixed"}),
    Cell("hf-trainer-bf16-mixed", {"engine": "hf_trainer", "precision": "bf16-mixed"}),
)
# The CI-sized form: one resume (two attempts: the checkpoint's contents), and two table rows.
CPU_SMOKE = ("torch-16-mixed-resume",)
CPU_TABLE = ("plain-pytorch", "lightning-bf16-mixed")
BASELINE = "plain-pytorch"

# Expected seconds on one H100, for the plan: estimates until a GPU run measures them (gpu_check.json
# keeps each cell's real seconds). A cold process: imports, CUDA start-up, data, the model, evaluation.
START_S = {"torch": 20.0, "fabric": 25.0, "lightning": 30.0, "hf_trainer": 30.0}
STEP_S = {"32-true": 0.08, "16-mixed": 0.035, "bf16-mixed": 0.035, "bf16-true": 0.03}  # batch 16, ~250 tokens
BUILD_S = 20.0  # building builtin:distilbert-shape and tokenizing, once per data set
LIMIT_MIN = 8.0
BUDGET_MIB = 60.0
SKIP_DIRS = {".git", ".venv", ".whl", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "gpu-check"}


@dataclass
class Settings:
    accelerator: str
    model: str
    smoke: list[Cell]
    table: list[Cell]
    steps: int
    table_steps: int
    warmup: int
    eval_rows: int
    jobs: int
    timeout: float
    root: Path
    deadline: float = float("inf")  # perf_counter() by which the last table row must be done
    port: int = 29600
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_port(self) -> int:
        # Cells run side by side: each process group (DeepSpeed on one device has one) gets its own port.
        with self.lock:
            self.port += 1
            return self.port


def spec(s: Settings, name: str, train: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": 1,
        "experiment": "gpu_check",
        "job": name,
        "job_dir": str(s.root / name),
        "cache_dir": str(s.root / "cache"),
        "train": {
            "model": s.model,
            "epochs": 1,
            "batch_size": 16,
            "eval_batch_size": 64,
            "num_workers": 2,
            "accelerator": s.accelerator,
            "log_every_n_steps": 10,
            "lr": 5e-5,
            **train,
        },
        "data": {"dataset": "builtin:synthetic", "config": "imdb", **data},
    }


def child_env(port: int) -> dict[str, str]:
    """The entrypoint's environment: the repository first on PYTHONPATH, then what was there (the
    carried wheels' folder, which gpu_check.sh put there); offline; a process group port of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    before = os.environ.get("PYTHONPATH", "")
    env.update(
        PYTHONPATH=str(REPO) + (f":{before}" if before else ""),
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        MASTER_PORT=str(port),
    )
    return env


def run_job(s: Settings, doc: dict[str, Any], timeout: float) -> tuple[dict[str, Any] | None, str, str]:
    """(result.json or None, the first error line, the log's last lines) of one entrypoint run."""
    job = Path(doc["job_dir"])
    job.mkdir(parents=True, exist_ok=True)
    (job / "spec.json").write_text(json.dumps(doc))
    log = job / "log.txt"
    with open(log, "a") as handle:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "training", "--spec", str(job / "spec.json")],
                cwd=REPO,
                env=child_env(s.next_port()),
                stdout=handle,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout:.0f} s", tail(log)
    if done.returncode == 0 and (job / "result.json").exists():
        return json.loads((job / "result.json").read_text()), "", ""
    text = log.read_text(errors="replace")
    return None, first_error(text) + f" (exit {done.returncode})", tail(log)


def tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


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
                "training: ",
            )
        ) and not line.startswith(("training: rank", "training: data", "training: wrote", "training: FSDP2")):
            return line[:240]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (errors[-1] if errors else (lines[-1] if lines else "no output"))[:240]


def smoke_cell(s: Settings, cell: Cell) -> dict[str, Any]:
    started = time.perf_counter()
    steps = s.steps
    if cell.resume:  # an epoch of exactly `steps` batches, then the job again to two epochs
        data = {"partition": [16 * steps, 37, 35], "max_length": 128}
        doc = spec(s, f"smoke-{cell.name}", {**cell.train, "warmup_compile_steps": 1}, data)
        result, error, log = run_job(s, doc, s.timeout)
        if result is not None:
            doc["train"]["epochs"] = 2
            result, error, log = run_job(s, doc, s.timeout)
        expected, resumed = 2 * steps, True
    else:
        data = {"partition": [16 * steps + 5, 37, 35], "max_length": 128}
        train = {**cell.train, "max_steps": steps, "warmup_compile_steps": 1}
        result, error, log = run_job(s, spec(s, f"smoke-{cell.name}", train, data), s.timeout)
        expected, resumed = steps, False
    if result is not None and (result["optimizer_steps"] != expected or result["resumed"] != resumed):
        error = f"ran {result['optimizer_steps']} steps (resumed: {result['resumed']}), not {expected} ({resumed})"
    row = {"name": cell.name, "ok": not error, "error": error, "seconds": round(time.perf_counter() - started, 1)}
    if error:
        row["log_tail"] = log
    print(
        f"  {'pass' if row['ok'] else 'FAIL'}  {cell.name:<36} {row['seconds']:6.1f} s"
        + (f"  {error}" if error else ""),
        flush=True,
    )
    return row


def table_point(s: Settings, cell: Cell) -> dict[str, Any]:
    started = time.perf_counter()
    if s.accelerator == "gpu" and started + expected_s(cell, s.table_steps) > s.deadline:
        error = f"not run: it would end past the {LIMIT_MIN:.0f}-minute budget"
        print(f"  SKIP  {cell.name:<36} {error}", flush=True)
        return {"name": cell.name, "ok": False, "error": error, "seconds": 0.0}
    data = {"partition": [16 * s.table_steps, s.eval_rows // 2, s.eval_rows], "max_length": 512}
    train = {**cell.train, "warmup_compile_steps": s.warmup}
    result, error, log = run_job(s, spec(s, f"table-{cell.name}", train, data), s.timeout * 2)
    row: dict[str, Any] = {"name": cell.name, "ok": result is not None, "error": error}
    row["seconds"] = round(time.perf_counter() - started, 1)
    if result is None:
        row["log_tail"] = log
    else:
        keep = ("precision", "compile", "times_s", "throughput", "parameters", "peak_memory_mb", "test_acc")
        row["result"] = {k: result.get(k) for k in keep} | {"gpus": result["ran_on"]["gpus"]}
        row["result"]["optimizer_steps"] = result["optimizer_steps"]
    print(
        f"  {'done' if row['ok'] else 'FAIL'}  {cell.name:<36} {row['seconds']:6.1f} s"
        + (f"  {error}" if error else ""),
        flush=True,
    )
    return row


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The table: minutes of training (warm-up included), samples/s, MFU, speed-up over the plain loop."""
    base = next((r["result"]["throughput"]["samples_per_s"] for r in rows if r["ok"] and r["name"] == BASELINE), None)
    out = [f"  {'config':<24} {'minutes':>8} {'samples/s':>10} {'MFU':>7} {'peak mem':>9} {'speed-up':>9}"]
    for row in rows:
        if not row["ok"]:
            out.append(f"  {row['name']:<24} FAILED: {row['error']}")
            continue
        r = row["result"]
        rate, tokens = r["throughput"]["samples_per_s"], r["throughput"]["tokens_per_s"]
        precision = r["precision"]["effective"]
        used = mfu(r["gpus"], precision, (r["parameters"] or {}).get("total"), tokens, 1)
        memory = (r["peak_memory_mb"] or {}).get("gpu_max_reserved")
        minutes = (r["times_s"]["train"] + r["times_s"]["warmup_compile"]) / 60
        speed = f"{rate / base:8.2f}x" if base and rate else f"{'-':>9}"
        out.append(
            f"  {row['name']:<24} {minutes:8.2f} {rate or 0:10.1f} {'-' if used is None else f'{used:.1%}':>7} "
            f"{'-' if memory is None else f'{memory:,.0f}':>9} {speed}"
        )
    return out


def carried_bytes() -> tuple[int, int, int]:
    """(repository bytes, wheel bytes, wheels) brought to the machine: the working tree without caches."""
    repo = 0
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        repo += sum((Path(folder) / f).stat().st_size for f in files if not (Path(folder) / f).is_symlink())
    wheels = list((REPO / ".whl").glob("*.whl"))
    return repo, sum(w.stat().st_size for w in wheels), len(wheels)


def expected_s(cell: Cell, steps: int) -> float:
    t = cell.train
    runs = 2 if cell.resume else 1
    return runs * (START_S[t["engine"]] + steps * STEP_S[t["precision"]] + cell.extra_s)


def print_plan(s: Settings) -> dict[str, Any]:
    smoke_s = BUILD_S + sum(expected_s(c, s.steps) for c in s.smoke) / max(s.jobs, 1)
    table_s = BUILD_S + sum(expected_s(c, s.table_steps) for c in s.table)
    repo, wheels, count = carried_bytes()
    mib = (repo + wheels) / 2**20
    print("== plan ==")
    print(f"model {s.model} on {s.accelerator}; synthetic IMDB-length texts")
    print(
        f"smoke: {len(s.smoke)} cells, {s.steps} steps each, {s.jobs} at a time: {', '.join(c.name for c in s.smoke)}"
    )
    print(
        f"table: {len(s.table)} configurations, {s.table_steps} steps of 16 each (first {s.warmup} untimed), one at a time"
    )
    print(
        f"expected on one H100 (an estimate until measured): smoke {smoke_s / 60:.1f} min + table "
        f"{table_s / 60:.1f} min = {(smoke_s + table_s) / 60:.1f} min (limit {LIMIT_MIN:.0f})"
    )
    print(
        f"brought: repository {repo / 2**20:.1f} MiB + {count} wheels {wheels / 2**20:.1f} MiB = {mib:.1f} MiB "
        f"(limit {BUDGET_MIB:.0f} MiB)" + ("  OVER THE LIMIT" if mib > BUDGET_MIB else "")
    )
    return {
        "smoke": [c.name for c in s.smoke],
        "table": [c.name for c in s.table],
        "expected_min": round((smoke_s + table_s) / 60, 2),
        "brought_mib": round(mib, 2),
    }


def pick(cells: tuple[Cell, ...], names: list[str]) -> list[Cell]:
    known = {c.name: c for c in cells}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"gpu_check: no cell named {', '.join(unknown)}; the cells: {', '.join(known)}")
    return [known[n] for n in names]


def settings(args: argparse.Namespace, root: Path) -> Settings:
    cpu = args.cpu
    smoke = pick(SMOKE, args.smoke.split(",") if args.smoke else list(CPU_SMOKE if cpu else (c.name for c in SMOKE)))
    table = pick(TABLE, args.table.split(",") if args.table else list(CPU_TABLE if cpu else (c.name for c in TABLE)))
    return Settings(
        accelerator="cpu" if cpu else "gpu",
        # Chosen by --cpu in the open, never as a fallback: the CPU form checks this script, not speed.
        model=args.model or (TINY_MODEL if cpu else DISTILBERT_SHAPE_MODEL),
        smoke=[] if args.smoke == "none" else smoke,
        table=[] if args.table == "none" else table,
        steps=args.steps or (2 if cpu else 10),
        table_steps=args.table_steps or (6 if cpu else 150),
        warmup=args.warmup,
        eval_rows=args.eval_rows or (40 if cpu else 400),
        jobs=args.jobs or (1 if cpu else 5),
        timeout=args.timeout,
        root=root,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="the CI-sized form on the CPU (builtin:tiny)")
    parser.add_argument("--smoke", default="", help="smoke cells to run, comma-separated (none: skip)")
    parser.add_argument("--table", default="", help="table rows to run, comma-separated (none: skip)")
    parser.add_argument("--steps", type=int, default=0, help="optimizer steps of a smoke cell (10; --cpu 2)")
    parser.add_argument("--table-steps", type=int, default=0, help="steps of a table row (150; --cpu 6)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed warm-up batches of every table row")
    parser.add_argument("--eval-rows", type=int, default=0, help="test rows of a table row (400; --cpu 40)")
    parser.add_argument("--jobs", type=int, default=0, help="smoke cells at a time (5; --cpu 1)")
    parser.add_argument("--model", default="", help="model (builtin:distilbert-shape; --cpu builtin:tiny)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per smoke cell (a table row: twice)")
    parser.add_argument("--out", type=Path, default=REPO / "gpu-check", help="where gpu_check.json goes")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    s = settings(args, root)
    s.deadline = time.perf_counter() + LIMIT_MIN * 60
    try:
        plan = print_plan(s)
        print(f"== smoke matrix ({len(s.smoke)} cells) ==", flush=True)
        with ThreadPoolExecutor(max_workers=s.jobs) as pool:
            cells = list(pool.map(lambda c: smoke_cell(s, c), s.smoke))
        print(
            f"== single-{'GPU' if s.accelerator == 'gpu' else 'CPU'} table ({len(s.table)} configurations) ==",
            flush=True,
        )
        rows = [table_point(s, c) for c in s.table]
        gpu = next((r["result"]["gpus"][0] for r in rows if r["ok"] and r["result"]["gpus"]), None)
        if gpu:
            peaks = {p: peak_flops(gpu, p) for p in ("32-true", "16-mixed", "bf16-mixed")}
            print(
                f"  {gpu}: peaks "
                + ", ".join(f"{p} {v / 1e12:.0f}" if v else f"{p} unknown" for p, v in peaks.items())
                + " TFLOP/s"
            )
        for line in table_lines(rows):
            print(line)
        failed = [c for c in cells if not c["ok"]] + [r for r in rows if not r["ok"]]
        print(
            f"\nsmoke: {sum(c['ok'] for c in cells)} passed, {len(cells) - sum(c['ok'] for c in cells)} failed; "
            f"table: {sum(r['ok'] for r in rows)} of {len(rows)} ran"
        )
        args.out.mkdir(parents=True, exist_ok=True)
        report = {"plan": plan, "gpu": gpu, "smoke": cells, "table": rows}
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        return 1 if failed else 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
