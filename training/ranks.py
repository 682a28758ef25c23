"""Where the ranks of the torch and hf_trainer engines come from (Lightning and Fabric have their own).

- torchrun / `accelerate launch`: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT are set: used as is.
- srun, one task per device: the same variables, copied from SLURM_PROCID & co. (`from_slurm`).
- neither, with several devices (local backend, a bare `python -m training`): the entrypoint runs
  itself under `torchrun --standalone` on this machine (`launch_locally`), through training.relay
  so that the requeue signal reaches the ranks.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from training import halving, requeue, results
from training.spec import Spec

# Engines that take their ranks from torch.distributed's variables and need a launcher for several.
NEED_LAUNCHER = ("torch", "hf_trainer")


def from_slurm(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """torch.distributed's variables from srun's, for ranks srun started (one task per device)."""
    env = os.environ if env is None else env
    if "RANK" in env or int(env.get("SLURM_NTASKS", "1") or 1) < 2 or "SLURM_PROCID" not in env:
        return {}
    return {
        "RANK": env["SLURM_PROCID"],
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "WORLD_SIZE": env["SLURM_NTASKS"],
        "LOCAL_WORLD_SIZE": env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0],
    }


def needs_local_launch(spec: Spec) -> bool:
    """Several ranks asked for, but no launcher started them (no RANK, no srun tasks)."""
    return (
        spec.train.engine in NEED_LAUNCHER
        and spec.train.world_size > 1
        and "RANK" not in os.environ
        and not from_slurm()
    )


def launch_locally(spec: Spec, spec_path: Path) -> int:
    """One machine, N devices, no launcher: run this spec under torchrun --standalone, passing the
    requeue signal on to the ranks (training/relay.py)."""
    from training import relay

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={spec.train.devices}",
        "-m",
        "training",
        "--spec",
        str(spec_path),
    ]
    signal = spec.requeue.signal if spec.requeue.enabled else None
    before, started = results.result_stamp(spec.job_dir), time.time()
    rc, relayed = relay.run(cmd, signal)
    if results.finished_anyway(spec.job_dir, before, rc):
        return 0
    if rc != 0 and halving.paused_since(spec.checkpoint_dir, started):
        return halving.paused_status()  # torchrun reports its ranks' pause at a rung as a failure
    # torchrun reports a rank's "requeue me" exit as a failure of its own; say what the ranks meant.
    return requeue.EXIT_REQUEUE if rc != 0 and relayed and requeue.newest_checkpoint(spec.checkpoint_dir) else rc


def launched_by() -> str:
    """Who started this rank, for the job log."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return "accelerate launch (torchrun)" if "ACCELERATE_DYNAMO_BACKEND" in os.environ else "torchrun"
    if "SLURM_PROCID" in os.environ and "RANK" in os.environ:
        return "srun"
    return "this process"
