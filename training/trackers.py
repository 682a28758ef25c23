"""Experiment trackers beside metrics.csv: TensorBoard, Weights & Biases, MLflow (`train.loggers`).

Every engine writes its rows through `results.MetricsLog` on rank 0; the log hands each row here too,
so all trackers get exactly the metrics of metrics.csv, under the same step. A job is named by its
sweep point (`spec.job`) and grouped by experiment and run; its resolved spec is the config.

- tensorboard: event files in JOB_DIR/tensorboard (`tensorboard --logdir runs/<experiment>` shows the
  whole sweep side by side).
- wandb: `train.wandb_mode` (default offline: compute nodes often have no internet) into JOB_DIR/wandb;
  `jobgen sync RUN` uploads from the login node. The API key is read by wandb from the environment of
  whoever runs it; jobgen never reads, writes or passes it.
- mlflow: `train.mlflow_uri`, else $MLFLOW_TRACKING_URI, else a file store RUN_DIR/mlruns.

The tracker libraries are imported only when a job asks for them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Protocol, cast

from training import console
from training.contract import WANDB_MODES, one_of
from training.spec import Spec

NUMERIC = ("loss", "acc", "f1", "lr", "samples_per_s")


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def close(self, status: str) -> None: ...


def run_id(spec: Spec) -> str:
    return Path(spec.run_dir).name if spec.run_dir else spec.job_dir.parent.parent.name


def config(spec: Spec) -> dict[str, Any]:
    """The resolved spec, JSON-able (what jobgen wrote; it never holds secrets)."""
    from training.spec import to_dict

    return cast(dict[str, Any], json.loads(json.dumps(to_dict(spec), default=str)))


def metrics_of(row: dict[str, Any]) -> tuple[dict[str, float], int | None]:
    """A metrics.csv row -> ({"train/loss": 0.41, ...}, step)."""
    split = row.get("split") or "train"
    out = {}
    for key in NUMERIC:
        value = row.get(key)
        if value is not None and value != "" and not isinstance(value, (bool, str)):
            out[f"{split}/{key}"] = float(value)  # floats, ints and 0-d tensors alike
    step = row.get("step")
    return out, int(step) if isinstance(step, (int, float)) else None


class TensorBoard:
    def __init__(self, spec: Spec) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(spec.job_dir / "tensorboard"))
        self.writer.add_text("config", "```\n" + json.dumps(config(spec), indent=2) + "\n```")

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.close()


class WandB:
    def __init__(self, spec: Spec) -> None:
        import wandb

        # One W&B run per job across requeues: the same id, resumed.
        ident = hashlib.sha1(f"{spec.run_dir}|{spec.job}".encode()).hexdigest()[:16]
        settings = wandb.Settings(
            console="off",
            silent=True,
            x_disable_stats=True,
            x_disable_machine_info=True,
            disable_git=True,
            save_code=False,
        )
        self.run = wandb.init(
            project=spec.experiment or "jobgen",
            group=run_id(spec),
            name=spec.job,
            job_type="train",
            id=ident,
            resume="allow",
            config=config(spec),
            dir=str(spec.job_dir),
            mode=one_of(spec.train.wandb_mode, WANDB_MODES),
            settings=settings,
            reinit="create_new",
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)


class MLflow:
    def __init__(self, spec: Spec) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = spec.train.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_mlflow_uri(spec)
        if uri.startswith("file:"):
            # MLflow 3 keeps its file store in "maintenance mode" behind this switch; a folder in the run
            # needs no server and no database, which is what a job on a compute node can count on.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self._experiment(spec.experiment or "jobgen")
        key = f"{run_id(spec)}/{spec.job}"
        found = self.client.search_runs([experiment], filter_string=f"tags.`jobgen.key` = '{key}'", max_results=1)
        if found:  # a requeued job continues its run
            self.run_id = found[0].info.run_id
            return
        tags = {
            "jobgen.experiment": spec.experiment,
            "jobgen.run": run_id(spec),
            "jobgen.job": spec.job,
            "jobgen.key": key,
            "mlflow.runName": spec.job,
        }
        self.run_id = self.client.create_run(experiment, run_name=spec.job, tags=tags).info.run_id
        flat = _flatten({"train": config(spec)["train"], "data": config(spec)["data"], "sweep": spec.sweep})
        self.client.log_batch(self.run_id, params=[Param(k, str(v)[:500]) for k, v in flat.items()])
        self.client.log_dict(self.run_id, config(spec), "spec.json")

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except Exception:  # another job of the sweep created it a moment ago
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=status)


def default_mlflow_uri(spec: Spec) -> str:
    base = Path(spec.run_dir) if spec.run_dir else spec.job_dir.parent.parent
    return (base / "mlruns").resolve().as_uri()


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


KINDS: dict[str, type] = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}


@dataclasses.dataclass
class Trackers:
    """The trackers of one job (rank 0), opened on first use so other ranks never open any."""

    spec: Spec
    opened: list[Any] | None = None
    step: int = 0

    def log(self, row: dict[str, Any]) -> None:
        if self.opened is None:
            self.opened = [KINDS[name](self.spec) for name in self.spec.train.loggers if name in KINDS]
        metrics, step = metrics_of(row)
        self.step = self.step if step is None else step
        if metrics:
            for tracker in self.opened:
                tracker.log(metrics, self.step)

    def close(self, status: str = "FINISHED") -> None:
        for tracker in self.opened or []:
            try:
                tracker.close(status)
            except Exception as exc:  # a tracker must never fail a finished training
                console.line(f"training: closing {type(tracker).__name__} failed: {exc}", err=True)
        self.opened = None


_active: Trackers | None = None


def start(spec: Spec) -> None:
    """Called once per process by training.run: MetricsLogs made from now on feed these trackers."""
    global _active
    _active = Trackers(spec) if set(spec.train.loggers) - {"csv"} else None


def active() -> Trackers | None:
    return _active


def finish(status: str) -> None:
    global _active
    if _active is not None:
        _active.close(status)
    _active = None
