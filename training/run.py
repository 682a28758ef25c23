"""One job, start to end: read the spec, prepare data once, run the engine, write result.json, and only
then tear down the process group (engines/common.py) and close the trackers."""

from __future__ import annotations

import importlib
import json
import os
import warnings
from pathlib import Path

from training import console, halving, hardware, probe, progress, ranks, requeue, trackers
from training.data import Prepared
from training.results import Clock, Stats, build_result, gpu_peaks_mb, gpu_peaks_over_ranks, write_result
from training.spec import Spec, to_dict

ENGINE_MODULES = {
    "torch": "training.engines.torch_loop",
    "lightning": "training.engines.lightning_engine",
    "fabric": "training.engines.fabric_engine",
    "hf_trainer": "training.engines.hf_trainer_engine",
}


def run(spec: Spec, spec_path: Path | None = None, started: float | None = None) -> int:
    """Returns the process exit status; raises SystemExit(EXIT_REQUEUE) after a checkpoint on signal.
    `started`: the monotonic time the process began (`python -m training`), from which the heartbeat
    counts the silence; None (a run inside a longer-lived process) counts from now."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "SLURM_JOB_ID" not in os.environ:
        # Outside a Slurm job, Lightning's "srun is available but not used" (seen wherever slurm-client is
        # installed) is noise: a local run is not meant to use srun. Inside a job it stays a real hint.
        warnings.filterwarnings("ignore", message="The `srun` command is available on your system but is not used")
    spec.job_dir.mkdir(parents=True, exist_ok=True)
    # A job whose device cannot be had stops here, in one line, before any data work (DeviceError).
    console.quiet_libraries(on_cpu=hardware.check_device(spec.train) == "cpu")
    spec = probe.budget(spec)  # a probe: the same job on a step budget (jobgen probe)
    if ranks.needs_local_launch(spec):  # Lightning and Fabric start their own ranks; these engines cannot
        return ranks.launch_locally(spec, spec_path or _write_spec(spec))
    hardware.use_cpu_threads()  # a rank's own (the launcher above leaves its ranks' to torchrun)
    # The heartbeat: a line at least every JOBGEN_HEARTBEAT_S, counted from the process' start.
    console.start(console.rank_from_env(), since=started)
    try:
        return _run(spec)
    finally:
        console.stop()


def _run(spec: Spec) -> int:
    stats = Stats(world_size=spec.train.world_size)
    watcher = None
    if spec.requeue.enabled:
        watcher = requeue.Watcher()
        watcher.install_all(spec.requeue.signal)  # the warning signal, and SIGTERM (preemption)
    console.phase("preparing data")
    from datasets.utils.logging import disable_progress_bar

    from training import data

    disable_progress_bar()  # per-map bars from every rank drown the job log
    with Clock(stats, "data_prep"):
        prepared = data.prepare(spec)
    _say_ready(spec, prepared)
    from training.metrics import resolve_primary

    stats.primary_metric = resolve_primary(prepared.problem_type, spec.data.primary_metric, prepared.num_labels)
    _check_halving_metric(spec, prepared)
    prepared = probe.slice_eval(spec, prepared)
    console.phase(f"starting the {spec.train.engine} engine")
    engine = importlib.import_module(ENGINE_MODULES[spec.train.engine])
    from training.engines import common

    if spec.train.world_size > 1:
        common.before_process_group()
    trackers.start(spec)
    hardware.set_deterministic(spec.train.deterministic)  # every engine alike, before its first CUDA work
    try:
        rank = engine.run(spec, prepared, stats, watcher)  # fit and test; the process group is still up
        probe.engine_done()
        if stats.accelerator == "gpu":  # every rank, at the same point: the peaks of the fullest device
            import torch

            stats.gpu_peaks_mb = gpu_peaks_over_ranks(gpu_peaks_mb(), torch.device("cuda", torch.cuda.current_device()))
    except SystemExit as exc:
        _end_after_failure(exc)
        # A library that ends the run with a clean exit (Lightning on SIGTERM) must not leave a job without
        # its result looking COMPLETED.
        raise SystemExit(exc.code or 1) from None
    except BaseException as exc:
        _end_after_failure(exc)
        raise
    console.phase("ending")
    try:
        if not stats.interrupted:
            stats.finish()
            if rank == 0:
                # First, before anything that can crash on the way out (process-group teardown, trackers,
                # interpreter exit): every collective of the run is done, so the result is final, and a
                # step that dies after this point has lost no work (jobgen/templates/_result_guard.j2).
                result = build_result(spec, stats, requeue.requeue_count())
                path = write_result(spec, result)
                console.say(progress.result_line(result["throughput"]["samples_per_s"], stats.times_s["train"]))
                console.say(f"training: wrote {path}")
                probe.write(spec, stats, rank)
    finally:
        common.end_process_group()  # the other ranks wait in its barrier, even if writing failed
    trackers.finish("KILLED" if stats.interrupted else "FINISHED")
    if stats.paused_at:
        raise SystemExit(halving.paused_status())  # rank 0 wrote the pause marker: the batch script ends with 0
    if stats.interrupted:
        requeue.leave_for_requeue(rank, spec.checkpoint_dir, spec.requeue.signal)
    return 0


def _check_halving_metric(spec: Spec, prepared: Prepared) -> None:
    """A rung metric this job does not score stops it before training (validation refuses it where the
    problem type is known; with data.problem_type = "auto" only the data says)."""
    if not spec.halving or spec.probe:
        return
    from training.spec import SpecError

    metric = halving.Settings.from_record(spec.halving).metric
    problem = halving.job_metric_problem(metric, prepared.problem_type, prepared.num_labels)
    if problem:
        raise SpecError(f"sweep.halving.metric = {problem}")


def _end_after_failure(exc: BaseException) -> None:
    """This rank failed: tear down its part without waiting for the others, close the trackers, and
    let the exception go on. The traceback's frames hold the engine's objects (the DDP wrapper holds
    the process group): cleared first, so the group really goes instead of lingering into exit."""
    import traceback

    from training.engines import common

    try:
        traceback.clear_frames(exc.__traceback__)
        common.end_process_group(orderly=False)
    except Exception as teardown:  # never hide the failure that brought us here
        console.line(f"training: teardown after failure failed: {teardown}", err=True)
    trackers.finish("FAILED")


def prepare_only(spec: Spec) -> int:
    """Fetch and cache what the job needs (dataset, tokenized splits, model weights) and stop: run on a
    login node with internet (`jobgen prefetch`) so jobs on nodes without it find everything cached."""
    from datasets.utils.logging import disable_progress_bar

    from training import data
    from training import model as model_lib

    disable_progress_bar()
    prepared = data.prepare(spec)
    _say_ready(spec, prepared)
    model_lib.load_model(
        prepared.model_source, prepared.label_names, prepared.problem_type
    )  # downloads into the HF cache once
    console.line(f"training: model {prepared.model_source} ready")
    return 0


def _say_ready(spec: Spec, prepared: Prepared) -> None:
    sizes = ", ".join(f"{split} {len(rows)}" for split, rows in prepared.splits.items())
    origin = "from the cache" if prepared.from_cache else "tokenized now"
    console.say(f"training: data for {spec.job} ready: {sizes} ({origin})")


def _write_spec(spec: Spec) -> Path:
    """A spec given as an object (tests, the local launcher) as a file the ranks can read."""
    path = spec.job_dir / "spec.ranks.json"
    path.write_text(json.dumps(to_dict(spec)))
    return path
