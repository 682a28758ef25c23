"""Where the model comes from: a hub name, a local folder, "builtin:tiny" or "builtin:distilbert-shape".

builtin:tiny is built offline in well under a second (a WordPiece tokenizer trained on the training
texts + a 2-layer DistilBERT), saved with save_pretrained and loaded back with the Auto* classes, so
it exercises exactly the loading path a hub model takes. builtin:distilbert-shape is built the same
way with distilbert-base-uncased's architecture (6 layers, 768 wide, a 30,522-row embedding: 66,955,010
parameters with a 2-class head) and random weights: its speed and MFU are DistilBERT's, its accuracy
is not.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.contract import DISTILBERT_SHAPE_MODEL, TINY_MODEL
from training.spec import Spec

TINY = TINY_MODEL
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# DistilBertConfig of each built-in model; vocab_size None: the tokenizer's own (trained on the texts).
SHAPES: dict[str, dict[str, Any]] = {
    TINY_MODEL: {"n_layers": 2, "n_heads": 2, "dim": 64, "hidden_dim": 128, "vocab_size": None},
    DISTILBERT_SHAPE_MODEL: {"n_layers": 6, "n_heads": 12, "dim": 768, "hidden_dim": 3072, "vocab_size": 30522},
}


def resolve_source(spec: Spec, data_key: str, get_corpus: Callable[[], tuple[list[str], list[str]]]) -> str:
    """Path or hub name to load from; builds a built-in model (once per data fingerprint) if asked, from
    `get_corpus()`: the training texts and the label names (called only then: it may load the data)."""
    if spec.train.model not in SHAPES:
        return spec.train.model
    folder = "tiny-model" if spec.train.model == TINY else spec.train.model.removeprefix("builtin:")
    target = spec.cache_dir / folder / data_key
    if not target.exists():
        texts, labels = get_corpus()
        build_tiny(texts, labels, target, spec.train.seed, spec.train.model)
    return str(target)


def build_tiny(texts: list[str], labels: list[str], target: Path, seed: int = 0, shape: str = TINY) -> None:
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
    layout = SHAPES[shape]
    config = DistilBertConfig(
        vocab_size=layout["vocab_size"] or tok.get_vocab_size(),
        n_layers=layout["n_layers"],
        n_heads=layout["n_heads"],
        dim=layout["dim"],
        hidden_dim=layout["hidden_dim"],
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


def load_model(source: str, label_names: list[str]) -> Any:
    """AutoModelForSequenceClassification with a head sized by the data, in training mode."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(
        source,
        num_labels=len(label_names),
        id2label=dict(enumerate(label_names)),
        label2id={n: i for i, n in enumerate(label_names)},
    )
    # from_pretrained returns the model in eval mode (dropout off); training code must not inherit that.
    return model.train()


def transformer_blocks(model: Any) -> list[Any]:
    """The repeated layers FSDP2 shards one by one (DistilBERT, BERT, RoBERTa-style encoders)."""
    import torch

    blocks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    return list(blocks[0]) if blocks else []
