"""The transformers.Trainer engine: sentence pairs with F1, the best validation epoch tested; and the
relay that passes the requeue signal through a launcher to the ranks.

(Learning, precision, dropout and reporting are checked with the other engines in test_engines.py;
2 ranks in test_distributed.py; FSDP on CPU in test_hf_trainer_fsdp.py; requeue in test_resume.py.)
"""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.training.conftest import REPO, TINY_TRAIN, spec_dict, subprocess_env
from training import synthetic
from training.spec import from_dict

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.training, pytest.mark.timeout(240)]


def _pairs(path: Path, n: int, seed: int) -> None:
    """Sentence pairs whose label is the polarity of the second sentence; the first is filler."""
    rows = synthetic.make_rows(n, seed)
    filler = synthetic.make_rows(n, seed + 100)["text"]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sentence1", "sentence2", "label"])
        for first, (second, label) in zip(filler, zip(rows["text"], rows["label"], strict=True), strict=True):
            writer.writerow([" ".join(w for w in first.split() if w in synthetic.FILLER), second, label])


def test_sentence_pairs_scored_with_f1(tmp_path: Path, cache_dir: Path) -> None:
    from training.run import run

    _pairs(tmp_path / "train.csv", 1600, 1)
    _pairs(tmp_path / "test.csv", 400, 2)
    data = {
        "dataset": "",
        "files": {"train": str(tmp_path / "train.csv"), "test": str(tmp_path / "test.csv")},
        "text_field": "sentence1",
        "text_pair_field": "sentence2",
        "partition": [],
        "val_fraction": 0.15,
    }
    job = tmp_path / "job"
    spec = from_dict(spec_dict(job, cache_dir, train={"engine": "hf_trainer"}, data=data))
    assert run(spec) == 0
    result = json.loads((job / "result.json").read_text())
    assert result["test_acc"] >= 0.90 and result["test_f1"] >= 0.85, result
    assert result["scored"] == {"validation": 240, "test": 400}


def test_the_best_validation_epoch_is_the_one_tested(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Validation says epoch 1 of 3 was best: the test must score epoch 1's weights, not the last."""
    from training.engines import hf_trainer_engine as hf
    from training.run import run

    fake = iter([0.90, 0.99, 0.95])
    seen: list[float] = []
    tested: list[float] = []
    original = hf._trainer_class

    def probing() -> type:
        base = original()

        class Probe(base):
            def score(self, split: str) -> dict:
                result = super().score(split)
                weights = float(sum(p.detach().double().sum() for p in self.model.parameters()))
                if split == "validation":
                    seen.append(weights)
                    # The primary metric (accuracy) picks the best epoch; acc is what result.json lists.
                    value = next(fake)
                    return {**result, "acc": value, "metrics": {**result["metrics"], "accuracy": value}}
                tested.append(weights)
                return result

        return Probe

    monkeypatch.setattr(hf, "_trainer_class", probing)
    job = tmp_path / "job"
    spec = from_dict(spec_dict(job, cache_dir, train={"engine": "hf_trainer", "epochs": 3}))
    assert run(spec) == 0
    result = json.loads((job / "result.json").read_text())
    assert result["val_acc_per_epoch"] == [0.9, 0.99, 0.95] and result["tested_epoch"] == 1
    assert len(seen) == 3 and len(tested) == 1
    assert tested[0] == pytest.approx(seen[1], rel=1e-9) and tested[0] != pytest.approx(seen[2], rel=1e-9)


LAUNCHER = """
import signal, subprocess, sys, time
# A launcher that, like torchrun, does not handle SIGUSR2 (its default action would kill it).
rank = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
sys.exit(rank.wait())
"""
RANK = """
import signal, sys, time, pathlib
got = []
signal.signal(signal.SIGUSR2, lambda *a: got.append(1))
pathlib.Path(sys.argv[1], "ready").touch()
deadline = time.monotonic() + 30
while not got and time.monotonic() < deadline:
    time.sleep(0.05)
pathlib.Path(sys.argv[1], "got-signal" if got else "timed-out").touch()
"""


def test_a_trainer_job_without_deepspeed_never_imports_it(tmp_path: Path, cache_dir: Path) -> None:
    """accelerate asks whether the model is a DeepSpeedEngine at every unwrap, importing deepspeed
    wherever it is installed (1.7 s of each rank's start, with mlflow); a job of another strategy asks
    only once it is imported (training/engines/hf_trainer_engine.py), and still saves and evaluates."""
    from tests.training.conftest import write_spec

    spec = write_spec(tmp_path / "job", cache_dir, train={"engine": "hf_trainer"})
    code = (
        "import sys; from training.__main__ import main; code = main(['--spec', sys.argv[1]]); "
        "print('deepspeed imported:', 'deepspeed' in sys.modules, 'exit', code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(spec)], cwd=REPO, env=subprocess_env(), capture_output=True, text=True
    )
    assert done.stdout.splitlines()[-1] == "deepspeed imported: False exit 0", done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "job" / "result.json").read_text())
    assert result["epochs_done"] == TINY_TRAIN["epochs"] and result["tested_epoch"] is not None, result
    assert any((tmp_path / "job" / "checkpoints").iterdir())  # saved, through the unwrap


def test_relay_passes_the_signal_through_a_launcher_to_the_rank(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "training.relay",
        "--signal",
        "USR2",
        "--",
        sys.executable,
        "-c",
        LAUNCHER,
        RANK,
        str(tmp_path),
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(timeout=30) == 0, proc.stderr.read()  # the launcher survived and its rank ended well
    assert (tmp_path / "got-signal").exists()
    assert "training.relay: signal" in proc.stderr.read()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_local_backend_runs_accelerate_launch(tmp_path: Path, cache_dir: Path, runner: object) -> None:
    """The course's way on one machine: `accelerate launch` with 2 processes, from an experiment file."""
    from jobgen.cli import main

    experiment = tmp_path / "course.toml"
    experiment.write_text(f"""
[experiment]
name = "course"
[launch]
backend = "local"
launcher = "accelerate"
cache_dir = "{cache_dir}"
[env]
vars = {{ OMP_NUM_THREADS = "1" }}
[train]
engine = "hf_trainer"
devices = 2
model = "builtin:tiny"
accelerator = "cpu"
precision = "bf16-mixed"
epochs = 2
batch_size = 32
eval_batch_size = 128
lr = 3e-3
num_workers = 0
[data]
dataset = "builtin:synthetic"
partition = [1600, 300, 400]
max_length = 64
""")
    root = tmp_path / "runs"
    done = runner.invoke(main, ["--output-root", str(root), "submit", str(experiment)], env=subprocess_env())
    assert done.exit_code == 0, done.output
    (run,) = (root / "course").iterdir()
    job = run / "jobs" / "course"
    script = (job / "job.sh").read_text()
    assert "accelerate.commands.launch --multi_gpu --num_machines=1" in script and "--num_processes=2" in script
    result = json.loads((job / "result.json").read_text())
    assert result["world_size"] == 2 and result["engine"] == "hf_trainer" and result["test_acc"] >= 0.90
    assert result["precision"] == {"requested": "bf16-mixed", "effective": "bf16-mixed"}
