"""Where the model comes from: a hub name, a local folder, or "builtin:tiny".

builtin:tiny is built offline in well under a second (a WordPiece tokenizer trained on the training
texts + a 2-layer DistilBERT), saved with save_pretrained and loaded back with the Auto* classes, so
it exercises exactly the loading path a hub model takes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.contract import TINY_MODEL
from training.spec import Spec

TINY = TINY_MODEL
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def resolve_source(spec: Spec, data_key: str, get_corpus: Callable[[], tuple[list[str], list[str]]]) -> str:
    """Path or hub name to load from; builds the tiny model (once per data fingerprint) if asked, from
    `get_corpus()`: the training texts and the label names (called only then: it may load the data)."""
    if spec.train.model != TINY:
        return spec.train.model
    target = spec.cache_dir / "tiny-model" / data_key
    if not target.exists():
        texts, labels = get_corpus()
        build_tiny(texts, labels, target, spec.train.seed)
    return str(target)


def build_tiny(texts: list[str], labels: list[str], target: Path, seed: int = 0) -> None:
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import AutoModelForSequenceClassification, DistilBertConfig, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # show_progress=False: without a terminal its bars are blank lines in the job log.
    trainer = trainers.WordPieceTrainer(vocab_size=2000, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
        model_input_names=["input_ids", "attention_mask"],
    )
    config = DistilBertConfig(
        vocab_size=tok.get_vocab_size(),
        n_layers=2,
        n_heads=2,
        dim=64,
        hidden_dim=128,
        max_position_embeddings=512,
        # A PreTrainedConfig kwarg (a property there): its dataclass_transform'd __init__ does not list it.
        num_labels=len(labels),  # type: ignore[call-arg]
        pad_token_id=0,
        id2label=dict(enumerate(labels)),
        label2id={n: i for i, n in enumerate(labels)},
    )
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save_pretrained(tmp)
    # What save_pretrained writes for this model (config.json, model.safetensors), without its
    # unwrap_model step: with accelerate installed that imports deepspeed (3-4 s of CPU, and DeepSpeed's
    # "Setting accelerator to CPU" line in a job that uses no DeepSpeed).
    from safetensors.torch import save_file

    model.config.save_pretrained(tmp)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"), {"format": "pt"}
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, target)


def load_tokenizer(source: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source)


def load_model(source: str, label_names: list[str], problem_type: str = "single_label") -> Any:
    """AutoModelForSequenceClassification with a head sized by the data, in training mode. The config's
    problem_type (training.contract.TASKS) picks the loss: cross-entropy, BCE with logits or MSE."""
    from transformers import AutoModelForSequenceClassification

    from training.contract import TASKS

    model = AutoModelForSequenceClassification.from_pretrained(
        source,
        num_labels=len(label_names),
        id2label=dict(enumerate(label_names)),
        label2id={n: i for i, n in enumerate(label_names)},
        problem_type=TASKS[problem_type].hf_problem_type,
    )
    # from_pretrained returns the model in eval mode (dropout off); training code must not inherit that.
    return model.train()


def transformer_blocks(model: Any) -> list[Any]:
    """The repeated layers FSDP2 shards one by one (DistilBERT, BERT, RoBERTa-style encoders)."""
    import torch

    blocks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    return list(blocks[0]) if blocks else []
