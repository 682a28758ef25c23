"""GPU memory in result.json and probe.json: the peaks of the fullest rank, reserved beside allocated."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.conftest import REPO, subprocess_env
from training.results import Stats, peak_memory_mb

pytestmark = [pytest.mark.training, pytest.mark.timeout(180)]

RANKS = """
import json, sys, torch.distributed as dist
from training.results import gpu_peaks_over_ranks
rank, world, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
# Rank 1 gathers the most tensors, rank 2's allocator reserved the most: the job needs both maxima.
local = [[100.0, 150.0], [400.0, 410.0], [120.0, 900.0]][rank]
print(json.dumps(gpu_peaks_over_ranks(local, "cpu")))
dist.destroy_process_group()
"""


def test_the_peaks_are_the_largest_over_three_ranks(tmp_path: Path) -> None:
    env = subprocess_env()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANKS, str(rank), "3", str(tmp_path / "store")],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(3)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert [json.loads(out) for out in outs] == [[400.0, 900.0]] * 3  # every rank gets the job's peaks


def test_one_process_keeps_its_own_peaks() -> None:
    from training.results import gpu_peaks_over_ranks

    assert gpu_peaks_over_ranks([1.5, 2.5], "cpu") == [1.5, 2.5]


def test_result_reports_the_peaks_over_ranks_on_a_gpu_and_none_on_the_cpu() -> None:
    gpu = peak_memory_mb(Stats(accelerator="gpu", gpu_peaks_mb=[400.04, 900.06]))
    assert gpu["gpu_max_allocated"] == 400.0 and gpu["gpu_max_reserved"] == 900.1
    cpu = peak_memory_mb(Stats(accelerator="cpu"))
    assert cpu["gpu_max_allocated"] is None and cpu["gpu_max_reserved"] is None and cpu["host_rss"] > 0


def test_the_probes_prediction_takes_reserved_memory() -> None:
    """What the job held of its device, not what tensors used; a probe recorded before holds only that."""
    from jobgen.results.predict import predict
    from tests.core.test_probe import MEASURED

    m = json.loads(json.dumps(MEASURED))
    m["peak_memory_mb"] = {"host_rss": 900.0, "gpu_max_allocated": 700.0, "gpu_max_reserved": 1024.0}
    assert predict("j", m, elapsed_s=40, ranks_per_node=1).peak_gpu_mb == 1024.0
    del m["peak_memory_mb"]["gpu_max_reserved"]
    assert predict("j", m, elapsed_s=40, ranks_per_node=1).peak_gpu_mb == 700.0
