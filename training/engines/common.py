"""Pieces the engines assemble the same way: the model (optionally compiled), the data loaders, and
what comes before and after a process group (training.run calls those for every engine)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from training import console
from training import model as model_lib
from training.data import Prepared
from training.loaders import make_loader
from training.spec import Spec

SPLITS = ("train", "validation", "test")


def build_model(spec: Spec, prepared: Prepared) -> Any:
    """The model every engine trains: loaded, then prepared (pad token, gradient checkpointing, LoRA)."""
    console.phase("loading the model")
    # Looked up through the module so tests can wrap the loader (e.g. to watch dropout during fit).
    model, fresh = model_lib.load_model_info(prepared.model_source, prepared.label_names, prepared.problem_type)
    return model_lib.prepare(model, spec.train, prepared.tokenizer, fresh)


def maybe_compile(module: Any, spec: Spec) -> Any:
    if not spec.train.compile:
        return module
    import torch

    return torch.compile(module, mode=spec.train.compile_mode)


def loaders(spec: Spec, prepared: Prepared, rank: int, world: int) -> dict[str, Any]:
    """One loader per prepared split (train, validation, test and data.extra_test_splits')."""
    return {
        split: make_loader(prepared.splits[split], spec, prepared.tokenizer, split == "train", rank, world)
        for split in prepared.splits
    }


def record_sizes(stats: Any, prepared: Prepared) -> None:
    stats.samples = {split: len(prepared.splits[split]) for split in prepared.splits}


def parameter_shards(module: Any, rank: int, world: int, reduce_sum: Any) -> dict[str, Any]:
    """How many parameter elements each rank holds, against the whole model's, and how many of the
    whole model's the optimizer trains (all, or LoRA's adapters and the head): FSDP2 (DTensor) and
    ZeRO-3 (ds_tensor) ranks hold a shard, the others a full copy. A collective: every rank calls it."""
    local = total = trainable = 0
    for p in module.parameters():
        if hasattr(p, "ds_tensor"):  # DeepSpeed ZeRO-3: this rank's partition of a flattened parameter
            mine_n, whole = p.ds_tensor.numel(), p.ds_numel
        elif hasattr(p, "to_local"):  # FSDP2: a DTensor sharded over the ranks
            mine_n, whole = p.to_local().numel(), p.numel()
        else:
            mine_n = whole = p.numel()
        local, total = local + mine_n, total + whole
        trainable += whole if p.requires_grad else 0
    mine = [0.0] * world
    mine[rank] = float(local)
    return {"total": total, "trainable": trainable, "per_rank": [int(v) for v in reduce_sum(mine)]}


def announce(rank: int, world: int, strategy: Any) -> None:
    """One line per rank in the job log: which rank this is, who said so (Slurm, or our launcher), and
    what the strategy really does (for DeepSpeed: its ZeRO stage and offload targets)."""
    from training.ranks import launched_by
    from training.strategies import describe

    found = getattr(strategy, "cluster_environment", None)
    # One process has no cluster environment: say who started it instead of "NoneType".
    environment = type(found).__name__ if found is not None else launched_by()
    say_rank(rank, world, environment, describe(strategy))


def say_rank(rank: int, world: int, via: str, strategy: str) -> None:
    """The rank line every engine prints; with the CPU threads of this rank's math (training.hardware.
    cpu_threads), which a CPU run's speed depends on."""
    import torch

    threads = torch.get_num_threads()
    console.line(
        f"training: rank {rank}/{world} via {via}; strategy {strategy}; "
        f"{threads} CPU thread{'s' if threads != 1 else ''}"
    )


def before_process_group() -> None:
    """Called before any process group exists (training.run, every engine, several ranks).

    torch.distributed.nn.functional takes `group=group.WORLD` as default arguments, evaluated when it
    is imported. DDP imports it (through torch._dynamo -> fsdp -> _shard) after init_process_group,
    and then those defaults hold the default group for good: destroy_process_group() cannot free it,
    and its gloo worker threads live on into interpreter exit. A worker still dropping the last
    collective's tensors there needs the GIL, CPython ends that thread with pthread_exit, and the
    unwinding through the worker's noexcept frames calls std::terminate: "terminate called without
    an active exception", the rank aborts (issue 20). Imported here first, the defaults are None."""
    import torch.distributed as dist

    if dist.is_available() and not dist.is_initialized():
        import torch.distributed.nn  # noqa: F401


def end_process_group(orderly: bool = True) -> None:
    """The end of a run with a process group, the same on every rank and for every engine.

    1. A barrier (`orderly`, i.e. this rank finished): no rank tears down while another still has a
       collective in flight, and rank 0, which hosts the TCPStore at MASTER_ADDR, does not go first.
    2. Garbage collection: the DDP wrapper (its Reducer holds the group) goes before the group, or
       the gloo group's destructor can wait forever at exit.
    3. destroy_process_group(): every group, in the same order on every rank, with the references
       DeepSpeed keeps (see _destroy); this joins the backend's threads while the interpreter is fully
       alive. Groups that other code still holds (default arguments, DeviceMeshes in torch's caches,
       attributes of objects that live on) are let go of if threads remain.
    Not orderly (this rank failed): no barrier, a peer may be gone; the local teardown only."""
    import gc

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        gc.collect()
        return
    if orderly:
        try:
            _barrier(dist)
        except Exception as exc:  # a peer that died after its last collective: tear down ours anyway
            console.line(f"training: barrier before teardown failed: {exc}", err=True)
    gc.collect()
    _destroy(dist)
    if backend_threads():
        import warnings

        with warnings.catch_warnings():  # looking at every object touches torch's deprecated `reduce_op`
            warnings.simplefilter("ignore")
            _release_lingering_groups(dist)
        gc.collect()
    left = _threads_left_after(2.0)
    if left:
        console.line(
            f"training: warning: {', '.join(left)} still running after destroy_process_group(): something "
            "still holds the process group, and this rank may abort at exit (issue 20)",
            err=True,
        )


def _destroy(dist: Any) -> None:
    """destroy_process_group(), then drop the groups DeepSpeed keeps in module globals
    (deepspeed.utils.groups: _WORLD_GROUP, the data/expert parallel groups). deepspeed.comm's own
    destroy_process_group() does that, but only when deepspeed.comm made the groups; under the HF
    Trainer and Lightning torch made them, deepspeed.comm is not initialized, and torch's alone leaves
    DeepSpeed's copies alive with their gloo threads (issue 20)."""
    dist.destroy_process_group()
    groups = sys.modules.get("deepspeed.utils.groups")
    release = getattr(groups, "_release_process_group_references", None)
    if callable(release):
        release(None)  # None: the whole world was destroyed


def _release_lingering_groups(dist: Any) -> None:
    """Let go of process groups that outlive destroy_process_group() in other code's hands; they are of
    no use to anyone then, and once freed their threads are joined now instead of at interpreter exit:
    - default arguments `group=group.WORLD`, evaluated when a module is imported after the group was
      made (deepspeed.comm's TorchBackend.barrier under the HF Trainer; torch.distributed.nn when it
      was not imported first): set to None, which means "the default group" to those functions;
    - DeviceMeshes kept in torch's DTensor caches (FSDP2: sharding propagation, MeshTopoInfo, the
      redistribute planner), each holding its groups in `_pg_registry`: emptied;
    - attributes, dict entries and list items that hold a group: set to None. DeepSpeed's ZeRO keeps
      them on each parameter (`param._dp_group`, `ds_process_group`), in its ZeRO-3 offload and Init
      objects (`dp_process_group`) and in its optimizer (`real_dp_process_group`), which gradient hooks
      keep alive through autograd's C++ side, where the garbage collector cannot see."""
    import gc
    import types

    group = dist.ProcessGroup
    mesh: Any = None
    try:
        from torch.distributed.device_mesh import DeviceMesh

        mesh = DeviceMesh
    except ImportError:  # pragma: no cover - torch without distributed tensors
        pass
    for obj in gc.get_objects():
        kind = type(obj)
        if kind is types.FunctionType:
            defaults, keywords = obj.__defaults__, obj.__kwdefaults__
            if defaults and any(isinstance(d, group) for d in defaults):
                obj.__defaults__ = tuple(None if isinstance(d, group) else d for d in defaults)
            if keywords and any(isinstance(v, group) for v in keywords.values()):
                obj.__kwdefaults__ = {k: None if isinstance(v, group) else v for k, v in keywords.items()}
        elif kind is dict:  # module namespaces among them
            _drop_groups(obj, group)
        elif kind is list:
            for index in [index for index, value in enumerate(obj) if isinstance(value, group)]:
                obj[index] = None
        elif mesh is not None and mesh in kind.__mro__:  # no isinstance: no metaclass hooks
            registry = getattr(obj, "_pg_registry", None)
            if isinstance(registry, dict):
                registry.clear()
        elif not isinstance(obj, type):
            # An instance's attributes: since Python 3.11 they live in the object itself until someone
            # asks for __dict__, so the garbage collector lists no dict for them.
            try:
                namespace = object.__getattribute__(obj, "__dict__")
            except Exception:  # no __dict__, or one that will not be read
                continue
            if type(namespace) is dict:
                _drop_groups(namespace, group)


def _drop_groups(namespace: dict[Any, Any], group: type) -> None:
    for key in [key for key, value in namespace.items() if isinstance(value, group)]:
        namespace[key] = None


def _barrier(dist: Any) -> None:
    if dist.get_backend() == "nccl":
        import torch

        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def _threads_left_after(grace_s: float) -> list[str]:
    """The backend threads still running `grace_s` from now: on a loaded machine a gloo loop thread has
    been seen to outlive destroy_process_group() by a moment, which is no leak to warn about."""
    import time

    deadline = time.monotonic() + grace_s
    while (left := backend_threads()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


BACKEND_THREADS = ("pt_gloo", "gloo_", "pt_nccl")  # thread names torch gives its backends' threads


def backend_threads() -> list[str]:
    """Names of this process' threads that belong to a process group backend (Linux; else none)."""
    names = []
    try:
        tasks = list(Path("/proc/self/task").iterdir())
    except OSError:
        return []
    for task in tasks:
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        if name.startswith(BACKEND_THREADS):
            names.append(name)
    return sorted(names)
