"""The end of a multi-rank run (issue 20): gloo ranks that exit cleanly, and a result that survives a
rank dying on the way out.

The abort of issue 20 came from the default process group outliving destroy_process_group():
torch.distributed.nn, imported after init_process_group (DDP does, through torch._dynamo), holds it in
its functions' default arguments; its gloo worker threads then ran into interpreter exit, and one
still dropping the last collective's tensors needed the GIL there: CPython ended that thread with
pthread_exit, and the unwinding through the worker's noexcept frames called std::terminate.
The ranks run as srun starts them, killed together as under `srun --kill-on-bad-exit=1`
(bench/exit_repeat.py, which repeats the same shapes 20 times)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.training.conftest import REPO, write_spec

pytestmark = [pytest.mark.training, pytest.mark.slow]

ABORT = "terminate called without an active exception"


def _bench() -> ModuleType:
    path = REPO / "bench" / "exit_repeat.py"
    spec = importlib.util.spec_from_file_location("exit_repeat", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("exit_repeat", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(180)
def test_four_gloo_ranks_end_cleanly_again_and_again(tmp_path: Path) -> None:
    """The shape that aborted, in bare torch.distributed, torn down by training's own teardown three
    times over: every rank exits 0 and no rank has backend threads left after its teardown. Torn down
    as before (`--teardown old`), every rank keeps them, and about one run in seven aborts."""
    bench = _bench()
    for n in range(3):
        out = bench.run_bare(tmp_path / f"rep{n}", 4, "new", timeout=120)
        assert out["codes"] == [0, 0, 0, 0] and ABORT not in out["log"], out["log"][-4000:]
        assert out["lingering"] == 0, out["log"][-4000:]


# Groups that other code holds past destroy_process_group(): a default argument evaluated after the group
# was made (as deepspeed.comm's TorchBackend.barrier, imported late by the HF Trainer), a 2-D
# DeviceMesh kept alive (as torch's DTensor caches keep FSDP2's), holding its own sub-groups, and an
# object that keeps groups as attributes and in a list (as DeepSpeed ZeRO's Init, offload and optimizer
# objects do, kept alive by gradient hooks where the garbage collector cannot see).
HELD_ELSEWHERE = r"""
import os, sys
import torch.distributed as dist
from training import ranks
from training.engines import common
os.environ.update(ranks.from_slurm())
common.before_process_group()
dist.init_process_group("gloo")
from torch.distributed.device_mesh import init_device_mesh
def barrier(group=dist.group.WORLD):
    return group
KEPT = [init_device_mesh("cpu", (dist.get_world_size(), 1), mesh_dim_names=("dp", "tp"))["dp"]]
dist.barrier(group=KEPT[0].get_group())
class Holder:
    def __init__(self):
        everyone = list(range(dist.get_world_size()))
        self.ds_process_group = dist.new_group(everyone)
        self.real_dp_process_group = [dist.new_group(everyone)]
HOLDER = Holder()
dist.barrier(group=HOLDER.ds_process_group)
dist.barrier(group=HOLDER.real_dp_process_group[0])
common.end_process_group()
print("backend threads after teardown:", len(common.backend_threads()), flush=True)
assert barrier() is None
assert HOLDER.ds_process_group is None and HOLDER.real_dp_process_group == [None]
"""


@pytest.mark.timeout(180)
def test_teardown_lets_go_of_groups_held_elsewhere(tmp_path: Path) -> None:
    out = _bench().run_ranks(tmp_path, 2, ["-c", HELD_ELSEWHERE], timeout=150)
    assert out["codes"] == [0, 0], out["log"][-4000:]
    assert out["log"].count("backend threads after teardown: 0") == 2, out["log"][-4000:]
    assert "still running after destroy_process_group" not in out["log"]


# A rank whose process-group teardown aborts, as issue 20's did; the run itself is the real entrypoint.
ABORTING_TEARDOWN = r"""
import os, sys
import torch.distributed as dist
if os.environ["SLURM_PROCID"] == "1":
    def destroy_process_group(group=None):
        print("terminate called without an active exception", file=sys.stderr, flush=True)
        os.abort()
    dist.destroy_process_group = destroy_process_group
from training.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.timeout(240)
def test_result_is_on_disk_before_a_rank_can_die_on_the_way_out(tmp_path: Path, cache_dir: Path) -> None:
    """Two ranks of the plain loop under srun's rules: rank 1 aborts the moment it tears down its
    process group, and rank 0 is killed as soon as that happens. The result is there all the same:
    rank 0 wrote it before the barrier that comes before any teardown."""
    bench = _bench()
    job = tmp_path / "job"
    spec = write_spec(job, cache_dir, train={"engine": "torch", "strategy": "ddp", "devices": 2})
    out = bench.run_ranks(job, 2, ["-c", ABORTING_TEARDOWN, "--spec", str(spec)], timeout=200)
    assert out["codes"][1] == -6, out["log"][-4000:]  # SIGABRT, as "terminate called ..."
    result = json.loads((job / "result.json").read_text())
    assert result["world_size"] == 2 and result["epochs_done"] == 2 and result["test_acc"] >= 0.9, result
    assert "training: wrote" in out["log"]
