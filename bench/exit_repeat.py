"""Repeat the end of a multi-rank job and count the runs that die on the way out (issue 20).

The shape of tests/slurm/test_launchers.py's `engine-torch` job under srun: the plain loop, DDP, 4 ranks
(gloo), each a `python -m training --spec` process with the variables srun gives its tasks. A run
fails when any rank exits non-zero (e.g. 134, "terminate called without an active exception") or
rank 0 wrote no result.json.

    --mode local    4 processes on this machine, MASTER_ADDR 127.0.0.1 (no Slurm needed); as srun's
                    --kill-on-bad-exit, the first rank to exit non-zero gets the others killed
    --mode cluster  2 nodes x 2 tasks on the test cluster (tests/cluster/up.sh), one sbatch job per
                    repetition, srun --kill-on-bad-exit=1 as jobgen's srun template
    --mode bare     no training, bare torch.distributed: 4 local gloo ranks import what DDP imports,
                    end with an all_gather, and tear down as `--teardown` says: `new` is training's
                    (engines/common.py), `old` a plain destroy_process_group() as before issue 20.
                    Also counts the repetitions where a rank's backend threads outlived teardown.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/exit_repeat.py --mode local --repeats 20
    source /tmp/jobgen-cluster/env.sh; .venv/bin/python bench/exit_repeat.py --mode cluster --repeats 20
    .venv/bin/python bench/exit_repeat.py --mode bare --teardown old --repeats 20

Prints one line per repetition (rank exit codes, whether result.json exists, the abort line if any)
and the failure count at the end; exits 1 when any repetition failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ENTRY = ["-m", "training"]  # what each rank runs (a test or a debugging session may wrap it)
ABORT = "terminate called without an active exception"

TRAIN = {
    "engine": "torch",
    "strategy": "ddp",
    "model": "builtin:tiny",
    "accelerator": "cpu",
    "epochs": 2,
    "batch_size": 16,
    "eval_batch_size": 64,
    "lr": 3e-3,
    "num_workers": 0,
    "log_every_n_steps": 5,
    "seed": 7,
}
DATA = {"dataset": "builtin:synthetic", "partition": [800, 200, 200], "max_length": 32}


# One rank of --mode bare. DDP's constructor imports torch._dynamo, which imports torch.distributed.nn;
# this imports it directly (a third of the start-up time): with the default group already up, its
# functions' `group=group.WORLD` default arguments hold that group for good.
BARE = r"""
import os, sys
import torch, torch.distributed as dist
from training import ranks
from training.engines import common
os.environ.update(ranks.from_slurm())  # as the torch engine does under srun
new = sys.argv[1] == "new"
if new:
    common.before_process_group()
dist.init_process_group("gloo")
import torch.distributed.nn  # what DDP(...) imports, through torch._dynamo -> fsdp -> _shard
x = torch.randn(1000)
out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
dist.all_gather(out, x)  # the run's last collective, as Scores.compute's after the test split
del out, x
if new:
    common.end_process_group()
else:
    import gc
    gc.collect()
    dist.destroy_process_group()
print("backend threads after teardown:", len(common.backend_threads()), flush=True)
"""


def spec_for(job_dir: Path, cache_dir: Path, nodes: int, devices: int, train: dict[str, Any]) -> Path:
    job_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "schema": 1,
        "experiment": "exit_repeat",
        "job": job_dir.name,
        "job_dir": str(job_dir),
        "cache_dir": str(cache_dir),
        "train": {**TRAIN, "num_nodes": nodes, "devices": devices, **train},
        "data": DATA,
        "requeue": {},
    }
    path = job_dir / "spec.json"
    path.write_text(json.dumps(spec))
    return path


CODE = REPO  # the checkout whose training/ the ranks run (--code)


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYTHONDONTWRITEBYTECODE"):
        env.pop(key, None)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(CODE),
        PYTHONUNBUFFERED="1",
    )
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def srun_like_env(world: int) -> dict[str, str]:
    """What srun gives the tasks of a one-node step (the rank variables come per task)."""
    return {
        **base_env(),
        "SLURM_NTASKS": str(world),
        "SLURM_NTASKS_PER_NODE": str(world),
        "SLURM_NNODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "localhost",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "exit-repeat",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }


def run_ranks(
    job_dir: Path, world: int, args: list[str], timeout: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """`python -X faulthandler ARGS` as `world` ranks on this machine, started as srun starts its
    tasks; like `srun --kill-on-bad-exit=1`, the first rank that exits non-zero gets the others
    killed (SIGKILL here). Returns each rank's exit status (None: killed or timed out) and the logs."""
    job_dir.mkdir(parents=True, exist_ok=True)
    common = {**srun_like_env(world), **(env or {})}
    procs, logs = [], []
    for rank in range(world):
        log = job_dir / f"rank{rank}.log"
        logs.append(log)
        with open(log, "w") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-X", "faulthandler", *args],
                    cwd=job_dir,  # a core file (ulimit -c) lands in the job folder
                    env={**common, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    deadline = time.monotonic() + timeout
    codes: list[int | None] = [None] * world
    while time.monotonic() < deadline and None in codes:
        for rank, proc in enumerate(procs):
            if codes[rank] is None:
                codes[rank] = proc.poll()
        if any(c not in (None, 0) for c in codes):
            break  # a rank died: kill the rest, as srun does
        time.sleep(0.05)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    text = "\n".join(f"--- rank {r} ---\n" + p.read_text(errors="replace") for r, p in enumerate(logs))
    return {"codes": codes, "log": text}


def run_local(job_dir: Path, cache_dir: Path, world: int, train: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The training entrypoint as `world` ranks on this machine (one node, SLURM_* set)."""
    spec = spec_for(job_dir, cache_dir, 1, world, train)
    out = run_ranks(job_dir, world, [*ENTRY, "--spec", str(spec)], timeout)
    return {**out, "result": (job_dir / "result.json").is_file()}


def run_bare(job_dir: Path, world: int, teardown: str, timeout: float) -> dict[str, Any]:
    """--mode bare once: each rank's exit status, and how many ranks still had backend threads."""
    out = run_ranks(job_dir, world, ["-c", BARE, teardown], timeout)
    said = re.findall(r"backend threads after teardown: (\d+)", out["log"])
    return {**out, "result": None, "lingering": sum(int(n) > 0 for n in said)}


SBATCH = """#!/bin/bash
#SBATCH --job-name=exit-repeat
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=2
#SBATCH --output={out}
#SBATCH --error={err}
#SBATCH --chdir={chdir}
set -euo pipefail
MASTER_ADDR="$(scontrol show hostnames "${{SLURM_JOB_NODELIST}}" | head -n 1)"
MASTER_PORT=$(( 10000 + SLURM_JOB_ID % 20000 ))
export MASTER_ADDR MASTER_PORT
export SRUN_CPUS_PER_TASK="${{SLURM_CPUS_PER_TASK:-1}}"
{exports}
srun --label --kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=2 --cpus-per-task="${{SRUN_CPUS_PER_TASK}}" \\
    {python} -X faulthandler -u -m training --spec {spec}
"""


def submit_cluster(job_dir: Path, cache_dir: Path, train: dict[str, Any]) -> str:
    spec = spec_for(job_dir, cache_dir, 2, 2, train)
    env = base_env()
    keep = (
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "TOKENIZERS_PARALLELISM",
        "OMP_NUM_THREADS",
        "PYTHONPATH",
    )
    exports = "\n".join(f"export {k}={env[k]}" for k in keep)
    extra = "\n".join(f"export {k}={v}" for k, v in os.environ.items() if k.startswith("TORCH_"))
    script = job_dir / "job.sbatch"
    script.write_text(
        SBATCH.format(
            out=job_dir / "slurm.out",
            err=job_dir / "slurm.err",
            chdir=job_dir,  # a core file (ulimit -c, inherited by the job) lands in the job folder
            exports=exports + ("\n" + extra if extra else ""),
            python=sys.executable,
            spec=spec,
        )
    )
    done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True)
    return done.stdout.strip().split(";")[0]


def wait_cluster(job_id: str, timeout: float) -> tuple[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        said = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False
        ).stdout
        fields = dict(part.split("=", 1) for part in said.split() if "=" in part)
        state = fields.get("JobState", "")
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return state, fields.get("ExitCode", "")
        time.sleep(2)
    subprocess.run(["scancel", job_id], check=False)
    return "TIMEOUT(bench)", ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("local", "cluster", "bare"), default="local")
    parser.add_argument("--teardown", choices=("new", "old"), default="new", help="--mode bare: whose teardown")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--world", type=int, default=4, help="ranks (local mode)")
    parser.add_argument("--engine", default="torch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--keep", type=Path, default=None, help="keep every job folder under this one")
    parser.add_argument(
        "--code", type=Path, default=REPO, help="whose training/ to run (default this checkout; e.g. an export of main)"
    )
    args = parser.parse_args(argv)
    global CODE
    CODE = args.code.resolve()
    root = args.keep or Path(tempfile.mkdtemp(prefix="exit-repeat-"))
    root.mkdir(parents=True, exist_ok=True)
    # Jobs on the cluster's nodes see this machine's filesystem: any folder works, /tmp included.
    cache_dir = root / "cache"
    train = {"engine": args.engine, "epochs": args.epochs}
    failures = lingering = 0
    started = time.monotonic()
    for n in range(args.repeats):
        job_dir = root / f"rep{n:02d}"
        shutil.rmtree(job_dir, ignore_errors=True)
        tick = time.monotonic()
        if args.mode == "local":
            out = run_local(job_dir, cache_dir, args.world, train, args.timeout)
            ok = all(c == 0 for c in out["codes"]) and out["result"]
            said, log = f"rc {out['codes']}", out["log"]
        elif args.mode == "bare":
            out = run_bare(job_dir, args.world, args.teardown, args.timeout)
            ok = all(c == 0 for c in out["codes"])
            lingering += out["lingering"] > 0
            said, log = f"rc {out['codes']} ranks with backend threads after teardown {out['lingering']}", out["log"]
        else:
            job_id = submit_cluster(job_dir, cache_dir, train)
            state, code = wait_cluster(job_id, args.timeout)
            result = (job_dir / "result.json").is_file()
            ok = state == "COMPLETED" and result
            said = f"job {job_id} {state} {code}"
            log = "".join(
                (job_dir / f).read_text(errors="replace") for f in ("slurm.out", "slurm.err") if (job_dir / f).exists()
            )
            out = {"result": result}
        failures += not ok
        abort = next((line.strip() for line in log.splitlines() if ABORT in line), "")
        shown = "" if out["result"] is None else f" result={out['result']}"
        print(
            f"{n + 1:2d}/{args.repeats} {'ok  ' if ok else 'FAIL'} {said}{shown} "
            f"{time.monotonic() - tick:5.1f}s {abort}",
            flush=True,
        )
    if args.mode == "bare":
        print(f"repetitions with backend threads alive after teardown: {lingering}/{args.repeats}")
    print(f"failures: {failures}/{args.repeats} ({args.mode}, {time.monotonic() - started:.0f} s; folders in {root})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
