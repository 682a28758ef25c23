"""Real 2-rank runs (gloo on CPU) through the entrypoint, one subprocess tree each.

Every strategy must finish with world_size 2 and pass the same accuracy bar as one process.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.training.conftest import run_entrypoint, start, subprocess_env, write_spec
from tests.training.logcheck import check_two_rank_log
from training import progress

pytestmark = [pytest.mark.training, pytest.mark.slow, pytest.mark.timeout(480)]
# The default rows: with 800 training rows two epochs on two ranks reach 0.85, under the bar.
DATA = {"partition": [1600, 300, 400]}


def _check(result: dict, engine: str, strategy: str) -> None:
    assert result["world_size"] == 2 and result["devices_per_node"] == 2, result
    assert (result["engine"], result["strategy"]) == (engine, strategy)
    assert result["test_acc"] >= 0.90, result
    assert result["epochs_done"] == 2 and len(result["val_acc_per_epoch"]) == 2
    assert result["samples"]["train"] == 1600
    assert result["scored"] == {"validation": 300, "test": 400}  # each row once over both ranks
    params = result["parameters"]
    if strategy.startswith(("fsdp", "deepspeed_stage_3")):
        # Sharded: each rank holds about half of every parameter, together all of them once.
        assert sum(params["per_rank"]) == params["total"], params
        assert max(params["per_rank"]) < 0.55 * params["total"], params
    else:
        assert params["per_rank"] == [params["total"]] * 2, params


@pytest.mark.parametrize(
    ("engine", "strategy", "precision"),
    [
        # DDP on two ranks runs in test_preemption.py for torch, Lightning and Fabric (with these checks,
        # across a preemption), and for the Trainer in test_resume.py and, bf16-mixed, below.
        ("lightning", "fsdp", "32-true"),
        ("fabric", "fsdp", "bf16-mixed"),
        # DeepSpeed for real once per engine and per stage (ZeRO 2 under the Trainer); the strategy object
        # of every engine x stage x offload is checked in-process in test_strategies.py.
        ("fabric", "deepspeed_stage_3", "32-true"),
        ("lightning", "deepspeed_stage_3", "32-true"),
        # The offload variants differ from their family only in the strategy object test_strategies.py
        # checks in-process; each runs for real with LoRA (FSDP2's under the Trainer, ZeRO-3's under
        # Fabric) in test_lora_distributed.py, ZeRO-3's under the Trainer here.
        ("hf_trainer", "deepspeed_stage_2", "32-true"),
        ("hf_trainer", "deepspeed_stage_3_offload", "32-true"),
    ],
)
def test_two_ranks_launched_locally(
    engine: str, strategy: str, precision: str, tmp_path: Path, cache_dir: Path
) -> None:
    """devices=2 without Slurm: the entrypoint starts the second process itself."""
    spec = write_spec(
        tmp_path / "job",
        cache_dir,
        train={"engine": engine, "strategy": strategy, "devices": 2, "precision": precision},
        data=DATA,
    )
    # A guard against a hang, not a speed bound: Lightning's DeepSpeed runs took over 200 s on CI's loaded 2 cores.
    result = run_entrypoint(spec, subprocess_env(), timeout=420)
    _check(result, engine, strategy)
    assert result["precision"]["effective"] == precision
    assert any((tmp_path / "job" / "checkpoints").iterdir())
    log = (tmp_path / "job" / "entrypoint.log").read_text()
    check_two_rank_log(log, epochs=2)
    assert "Warning: " not in log, log[-3000:]  # torch's deprecations of what DeepSpeed calls, among others
    # Each score once, from rank 0: 2 validations and the test.
    assert sum(1 for ln in log.splitlines() if progress.EPOCH_LINE.match(ln)) == 3, log[-3000:]
    # What each rank's strategy did: the DeepSpeed config it holds, the policy FSDP2 was given.
    expected = {
        "fsdp": "offload=none",
        "fsdp_offload": "offload=cpu",
        "deepspeed_stage_2": "ZeRO stage 2, offload optimizer=none param=none",
        "deepspeed_stage_3": "ZeRO stage 3, offload optimizer=none param=none",
        "deepspeed_stage_2_offload": "ZeRO stage 2, offload optimizer=cpu param=none",
        "deepspeed_stage_3_offload": "ZeRO stage 3, offload optimizer=cpu param=cpu",
    }.get(strategy)
    if expected:
        assert log.count(expected) == 2, log[-3000:]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(("engine", "via"), [("fabric", "SLURMEnvironment"), ("hf_trainer", "srun")])
def test_ranks_come_from_slurm_variables(engine: str, via: str, tmp_path: Path, cache_dir: Path) -> None:
    """Two tasks started as srun would (SLURM_PROCID=0/1 ...): ddp, bf16-mixed, no self-launch."""
    job = tmp_path / "job"
    spec = write_spec(
        job, cache_dir, train={"engine": engine, "strategy": "ddp", "devices": 2, "precision": "bf16-mixed"}, data=DATA
    )
    common = {
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_NNODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "localhost",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "jobgen-test",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "CUDA_VISIBLE_DEVICES": "0,1",
    }  # Slurm sets it on GPU nodes; accelerator="cpu" must still win
    procs = [
        start(spec, subprocess_env({**common, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)}), job / f"task{r}.log")
        for r in (0, 1)
    ]
    try:
        codes = [p.wait(timeout=200) for p in procs]
    finally:
        for p in procs:
            p.kill()
    logs = [(job / f"task{r}.log").read_text() for r in (0, 1)]
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    for r in (0, 1):
        assert f"rank {r}/2 via {via}" in logs[r]
        assert "still running after destroy_process_group" not in logs[r], logs[r][-3000:]
    assert "wrote" in logs[0] and "wrote" not in logs[1]  # only rank 0 writes
    import json

    result = json.loads((job / "result.json").read_text())
    _check(result, engine, "ddp")
    assert result["precision"] == {"requested": "bf16-mixed", "effective": "bf16-mixed"}
    assert result["slurm"] == {"job_id": "4242", "array_task_id": None, "nodelist": "localhost"}
