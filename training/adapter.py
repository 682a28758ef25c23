"""A LoRA job's product: the adapter (LoRA weights and the trained head) in `JOB/adapter/`, as peft saves
it, written once the test has scored the weights it holds, and read back onto the base model.

Whatever holds the weights (one process, DDP, FSDP2's DTensor shards, DeepSpeed ZeRO-3 partitions),
every trainable parameter is gathered whole before rank 0 writes: a ZeRO-3 rank alone holds a slice
of each, and saving those as they are writes an empty adapter (peft#2892).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training import console

ADAPTER_DIR = "adapter"


def unwrap(model: Any) -> Any:
    """The PeftModel inside the wrappers engines put around it (DDP, DeepSpeed's engine, Fabric's module,
    torch.compile's OptimizedModule); None when there is none. By class, not by attribute: wrappers such
    as Fabric's forward attribute look-ups to the module they hold."""
    for _ in range(10):
        if any(cls.__name__ == "PeftModel" for cls in type(model).__mro__):
            return model
        children = getattr(model, "__dict__", {}).get("_modules", {})
        inner = next((children[k] for k in ("_orig_mod", "module", "_original_module") if k in children), None)
        if inner is None or inner is model:
            return None
        model = inner
    return None


def trainable_state(model: Any) -> dict[str, Any]:
    """Every trainable parameter whole, on the CPU, by its name in the model. A collective: every rank
    calls it (ZeRO-3 partitions and FSDP2 shards are gathered from all ranks)."""
    named = [(name, p) for name, p in (unwrap(model) or model).named_parameters() if p.requires_grad]
    partitioned = [p for _, p in named if hasattr(p, "ds_tensor")]
    if partitioned:
        import deepspeed

        with deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None):
            return {name: p.detach().cpu().clone() for name, p in named}
    # FSDP2: full_tensor() all-gathers the shards, on every rank in the same (named_parameters) order.
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone() for name, p in named}


def save(model: Any, job_dir: Path, rank: int) -> Path | None:
    """JOB/adapter/ from the weights the model holds now, when it has LoRA adapters (None otherwise).
    A collective, as `trainable_state`; rank 0 writes."""
    peft_model = unwrap(model)
    if peft_model is None:
        return None
    state = trainable_state(model)
    target = job_dir / ADAPTER_DIR
    if rank == 0:
        peft_model.save_pretrained(str(target), state_dict=state, is_main_process=True)
        console.line(f"training: saved the LoRA adapter and the head to {target}")
    return target


def load(base: str, label_names: list[str], adapter_dir: Path, problem_type: str = "single_label") -> Any:
    """The base model with the saved adapter and head on it, in eval mode: what the job tested."""
    from peft import PeftModel

    from training import model as model_lib

    tokenizer = model_lib.load_tokenizer(base)
    model = model_lib.load_model(base, label_names, problem_type)
    model.config.pad_token_id = tokenizer.pad_token_id
    return PeftModel.from_pretrained(model, str(adapter_dir)).eval()
