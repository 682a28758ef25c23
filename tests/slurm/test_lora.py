"""A decoder-only classifier with LoRA on the real test cluster: the tiny Llama-shaped model, two ranks
under srun (DDP), gradient checkpointing on. The job completes, trains a small share of the weights,
and leaves an adapter whose every LoRA matrix is whole and trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobgen.states import State
from tests.slurm.helpers import TINY_TRAIN, all_final, jobgen, manifest, only_run, wait_states, write_experiment

pytestmark = [pytest.mark.slurm, pytest.mark.training]

DECODER_LORA = """
[slurm]
gpus_per_node = 2
cpus_per_task = 1
time = "00:10:00"
""" + TINY_TRAIN.replace(
    'model = "builtin:tiny"',
    'model = "builtin:tiny-decoder"\nengine = "torch"\nstrategy = "ddp"\npeft = "lora"\n'
    "gradient_checkpointing = true\nwarmup_ratio = 0.1",
).replace("epochs = 1", "epochs = 2").replace("lr = 3e-3", "lr = 1e-2").replace("[400, 100, 100]", "[1600, 300, 400]")


@pytest.mark.timeout(600)
def test_a_decoder_with_lora_completes_on_the_cluster(slurm, root: Path, tmp_path: Path):
    exp = write_experiment(tmp_path, "decoder_lora", DECODER_LORA)
    jobgen("submit", str(exp), "--backend", "sbatch", root=root)
    run_dir = only_run(root, "decoder_lora")
    states = wait_states(run_dir, all_final, timeout=540, poll=5)
    job = manifest(run_dir)["jobs"][0]
    assert states[job["name"]] is State.COMPLETED, jobgen("logs", str(run_dir), "--err", root=root, check=False).stdout
    job_dir = run_dir / job["dir"]
    result = json.loads((job_dir / "result.json").read_text())
    assert result["world_size"] == 2 and result["model"] == "builtin:tiny-decoder"
    assert result["scored"] == {"validation": 300, "test": 400}
    assert result["test_acc"] >= 0.75, result  # chance is 0.5
    params = result["parameters"]
    assert 0 < params["trainable"] < 0.2 * params["total"], params
    from safetensors.torch import load_file

    weights = load_file(job_dir / "adapter" / "adapter_model.safetensors")
    lora_b = [v for k, v in weights.items() if ".lora_B." in k]
    assert lora_b and all(v.numel() > 0 and v.abs().sum() > 0 for v in lora_b)
    assert any(k.endswith("score.weight") for k in weights), sorted(weights)
    assert sum(v.numel() for v in weights.values()) == params["trainable"]
    logs = jobgen("logs", str(run_dir), root=root).stdout
    assert "saved the LoRA adapter" in logs, logs[-2000:]
