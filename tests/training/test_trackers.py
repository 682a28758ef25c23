"""train.loggers: TensorBoard, W&B (offline) and MLflow (file store) get the rows of metrics.csv.

Each tracker's files are read back with that tracker's own reader: TensorBoard's EventAccumulator,
W&B's protobuf records from the offline run file, MLflow's client on the file store. Nothing reaches
the internet: W&B runs offline with its host pointed at a closed local port, and, where this runs as
root, the whole job runs in a network namespace that has only a loopback.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.conftest import REPO, spec_dict, subprocess_env, write_spec
from training.run import run
from training.spec import from_dict

pytestmark = [pytest.mark.training, pytest.mark.timeout(240)]


def _csv(job_dir: Path) -> dict[str, dict[int, float]]:
    """metrics.csv as {"train/loss": {step: value}, "validation/acc": ...}."""
    out: dict[str, dict[int, float]] = {}
    for row in csv.DictReader((job_dir / "metrics.csv").open()):
        for key in ("loss", "acc", "f1", "lr"):
            if row[key]:
                out.setdefault(f"{row['split']}/{key}", {})[int(row["step"])] = float(row[key])
    return out


def _same(expected: dict[int, float], found: dict[int, float]) -> None:
    assert sorted(found) == sorted(expected)
    for step, value in expected.items():
        assert found[step] == pytest.approx(value, rel=1e-5, abs=1e-7), step  # metrics.csv keeps 6 digits


def _tensorboard(job_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(job_dir / "tensorboard"))
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def _wandb_records(path: Path) -> list[object]:
    """The records of a W&B run file: W&B's own protobuf messages in leveldb-log framing (32 KiB blocks,
    7-byte chunk headers: crc, length, type), after the file's 7-byte ':W&B' header."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, pending, records = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B", data[:8]
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:  # block padding
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _wandb(job_dir: Path) -> tuple[object, dict[str, dict[int, float]]]:
    (run_file,) = job_dir.glob("wandb/offline-run-*/run-*.wandb")
    records = _wandb_records(run_file)
    (meta,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    history: dict[str, dict[int, float]] = {}
    for record in records:
        if record.WhichOneof("record_type") != "history":
            continue
        items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
        for key, value in items.items():
            if not key.startswith("_"):
                history.setdefault(key, {})[int(items["_step"])] = value
    return meta, history


def _mlflow(run_dir: Path, experiment: str) -> tuple[object, dict[str, dict[int, float]], object]:
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    exp = client.get_experiment_by_name(experiment)
    (found,) = client.search_runs([exp.experiment_id])
    metrics = {
        key: {m.step: m.value for m in client.get_metric_history(found.info.run_id, key)} for key in found.data.metrics
    }
    return found, metrics, client


def test_every_tracker_gets_the_rows_of_metrics_csv(tmp_path: Path, cache_dir: Path) -> None:
    """The Lightning Trainer, launched as a job is: the entrypoint in its own process, srun on PATH."""
    run_dir = tmp_path / "20261201-000000-ab12"
    job_dir = run_dir / "jobs" / "engine-lightning"
    path = write_spec(
        job_dir,
        cache_dir,
        train={"engine": "lightning", "epochs": 1, "loggers": ["csv", "tensorboard", "wandb", "mlflow"]},
    )
    spec = json.loads(path.read_text())
    path.write_text(
        json.dumps({**spec, "experiment": "sweep", "run_dir": str(run_dir), "sweep": {"train.engine": "lightning"}})
    )
    fake_bin = tmp_path / "bin"  # Lightning warns "srun is available but not used" where srun exists
    fake_bin.mkdir()
    (fake_bin / "srun").write_text("#!/bin/sh\nexit 1\n")
    (fake_bin / "srun").chmod(0o755)
    env = subprocess_env(
        {
            "PATH": f"{fake_bin}:{os.environ['PATH']}",
            "WANDB_MODE": "online",
            "WANDB_BASE_URL": "http://127.0.0.1:9",
            "WANDB_API_KEY": "x" * 40,
        }
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    command = [sys.executable, "-m", "training", "--spec", str(path)]
    if os.geteuid() == 0 and shutil.which("unshare") and shutil.which("ip"):
        command = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *command]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=200)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-6000:]
    assert "srun" not in log, log[-3000:]
    expected = _csv(job_dir)
    assert {"train/loss", "train/lr", "validation/acc", "test/acc"} <= set(expected)

    board = _tensorboard(job_dir)
    for key, values in expected.items():
        _same(values, board[key])

    meta, history = _wandb(job_dir)
    assert (meta.project, meta.run_group, meta.display_name) == ("sweep", run_dir.name, "engine-lightning")
    config = {u.key: json.loads(u.value_json) for u in meta.config.update}
    assert config["train"]["engine"] == "lightning" and config["sweep"] == {"train.engine": "lightning"}
    for key, values in expected.items():
        _same(values, history[key])
    assert "x" * 40 not in "".join(
        p.read_text(errors="replace") for p in job_dir.rglob("*") if p.is_file() and p.suffix != ".ckpt"
    )

    found, metrics, _ = _mlflow(run_dir, "sweep")
    assert found.info.run_name == "engine-lightning" and found.info.status == "FINISHED"
    assert found.data.tags["jobgen.run"] == run_dir.name and found.data.params["train.engine"] == "lightning"
    for key, values in expected.items():
        _same(values, metrics[key])


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("engine", ["torch", "fabric"])
def test_the_other_engines_feed_tensorboard_and_time_the_rows(engine: str, tmp_path: Path, cache_dir: Path) -> None:
    job_dir = tmp_path / "run" / "jobs" / engine
    spec = from_dict(
        spec_dict(job_dir, cache_dir, train={"engine": engine, "epochs": 1, "loggers": ["csv", "tensorboard"]})
    )
    assert run(spec) == 0
    expected = _csv(job_dir)
    board = _tensorboard(job_dir)
    assert set(board) == set(expected)
    for key, values in expected.items():
        _same(values, board[key])
    times = [float(r["time_s"]) for r in csv.DictReader((job_dir / "metrics.csv").open())]
    assert times == sorted(times) and times[0] >= 0 and times[-1] > 0


def test_csv_only_opens_no_tracker(tmp_path: Path, cache_dir: Path, one_thread: None) -> None:
    job_dir = tmp_path / "run" / "jobs" / "plain"
    assert run(from_dict(spec_dict(job_dir, cache_dir, train={"epochs": 1, "max_steps": 12}))) == 0
    assert not (job_dir / "tensorboard").exists() and not (job_dir / "wandb").exists()
    assert not (tmp_path / "run" / "mlruns").exists()
