"""Where the model comes from (a hub name, a local folder, "builtin:tiny", "builtin:tiny-decoder" or
"builtin:distilbert-shape") and what is done to it before any engine sees it (`prepare`: pad token,
gradient checkpointing, LoRA).

builtin:tiny is built offline in well under a second (a WordPiece tokenizer whose vocabulary is the
training texts' characters and commonest words + a 2-layer DistilBERT), saved with save_pretrained and
loaded back with the Auto* classes, so it exercises exactly the loading path a hub model takes.
builtin:tiny-decoder is its decoder-only twin (a byte-level BPE tokenizer without a pad token, padding
on the left, + a 2-layer Llama), the shape of Llama, Qwen and Mistral classifiers.
builtin:distilbert-shape is built as builtin:tiny with distilbert-base-uncased's architecture (6 layers,
768 wide, a 30,522-row embedding: 66,955,010 parameters with a 2-class head) and random weights: its
speed and MFU are DistilBERT's, its accuracy is not.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.contract import DISTILBERT_SHAPE_MODEL, TINY_DECODER, TINY_MODEL
from training.spec import Spec, SpecError, TrainSpec

TINY = TINY_MODEL
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
DECODER_SPECIALS = ["<s>", "</s>"]  # BOS, EOS; no pad token, as Llama's own tokenizer
# LoRA's target modules for model types peft has no default for: the attention's query and value, as
# peft's defaults for BERT and Llama.
LORA_TARGETS = {"distilbert": ["q_lin", "v_lin"]}
# DistilBertConfig of each built-in encoder; vocab_size None: the tokenizer's own (made from the texts).
SHAPES: dict[str, dict[str, Any]] = {
    TINY_MODEL: {"n_layers": 2, "n_heads": 2, "dim": 64, "hidden_dim": 128, "vocab_size": None},
    DISTILBERT_SHAPE_MODEL: {"n_layers": 6, "n_heads": 12, "dim": 768, "hidden_dim": 3072, "vocab_size": 30522},
}


def resolve_source(spec: Spec, data_key: str, get_corpus: Callable[[], tuple[list[str], list[str]]]) -> str:
    """Path or hub name to load from; builds a built-in model (once per data fingerprint) if asked, from
    `get_corpus()`: the training texts and the label names (called only then: it may load the data)."""
    if spec.train.model == TINY_DECODER:
        target = spec.cache_dir / "tiny-decoder" / data_key
        if not target.exists():
            texts, labels = get_corpus()
            build_tiny_decoder(texts, labels, target, spec.train.seed)
        return str(target)
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
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import AutoModelForSequenceClassification, DistilBertConfig, PreTrainedTokenizerFast

    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    tok = Tokenizer(models.WordPiece(_wordpiece_vocab(texts, normalizer, pre_tokenizer), unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
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
    _save_built(AutoModelForSequenceClassification.from_config(config), tokenizer, target)


def _wordpiece_vocab(texts: list[str], normalizer: Any, pre_tokenizer: Any, size: int = 2000) -> dict[str, int]:
    """The special tokens, every character alone and as a word's continuation (`##c`), then the commonest
    words (ties by the word): made the same on every machine and in every process. The tokenizers
    library's WordPiece trainer breaks ties between equally frequent merges in no fixed order, so two
    builds of one corpus gave two vocabularies, and one seed two results."""
    counts = Counter(
        word for text in texts for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))
    )
    chars = sorted({char for word in counts for char in word})
    tokens = [*SPECIALS, *chars, *(f"##{char}" for char in chars)]
    words = sorted((word for word in counts if len(word) > 1), key=lambda word: (-counts[word], word))
    tokens += words[: max(size - len(tokens), 0)]
    return {token: i for i, token in enumerate(tokens)}


def build_tiny_decoder(texts: list[str], labels: list[str], target: Path, seed: int = 0) -> None:
    """A Llama-shaped classifier with random weights: grouped-query attention, rotary positions, the
    score head on the last real token; its tokenizer has no pad token and pads on the left."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoModelForSequenceClassification, LlamaConfig, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=DECODER_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=512,
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
    )
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=bos,
        eos_token_id=tok.token_to_id("</s>"),
        pad_token_id=None,
        tie_word_embeddings=False,
        num_labels=len(labels),  # type: ignore[call-arg]
        id2label=dict(enumerate(labels)),
        label2id={n: i for i, n in enumerate(labels)},
    )
    torch.manual_seed(seed)
    _save_built(AutoModelForSequenceClassification.from_config(config), tokenizer, target)


def _save_built(model: Any, tokenizer: Any, target: Path) -> None:
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
    """The model's tokenizer, ready to pad batches for a classifier: a pad token (EOS where it has none,
    as decoder tokenizers do), and padding on the right. Right padding keeps every real token at the
    position it has unpadded, which a classifier needs whatever it pools: an encoder's first token, or
    a decoder's last real one (with absolute positions, left padding would shift them)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise SpecError(
                f"train.model {source!r}: its tokenizer has neither a pad token nor an EOS token to pad with"
            )
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer


def load_model(source: str, label_names: list[str], problem_type: str = "single_label") -> Any:
    """AutoModelForSequenceClassification with a head sized by the data, in training mode. The config's
    problem_type (training.contract.TASKS) picks the loss: cross-entropy, BCE with logits or MSE."""
    return load_model_info(source, label_names, problem_type)[0]


def load_model_info(source: str, label_names: list[str], problem_type: str = "single_label") -> tuple[Any, list[str]]:
    """The model (as load_model) and the names of its modules whose weights the checkpoint did not hold:
    the freshly initialised head (classifier, score, a BERT pooler a sentence encoder was saved without)."""
    from transformers import AutoModelForSequenceClassification

    from training.contract import TASKS

    model, info = AutoModelForSequenceClassification.from_pretrained(
        source,
        num_labels=len(label_names),
        id2label=dict(enumerate(label_names)),
        label2id={n: i for i, n in enumerate(label_names)},
        problem_type=TASKS[problem_type].hf_problem_type,
        output_loading_info=True,
    )
    params = {name for name, _ in model.named_parameters()}  # not buffers a checkpoint need not hold
    fresh = sorted({key.rsplit(".", 1)[0] for key in info.get("missing_keys", ()) if key in params and "." in key})
    # from_pretrained returns the model in eval mode (dropout off); training code must not inherit that.
    return model.train(), fresh


def prepare(model: Any, t: TrainSpec, tokenizer: Any, fresh: list[str]) -> Any:
    """The model as every engine gets it: the tokenizer's pad token on its config (a decoder classifier
    refuses batches of more than one without it, and pools the last token that is not it), gradient
    checkpointing (non-reentrant: with reentrant checkpointing, frozen embeddings leave LoRA weights
    without gradients), and the LoRA adapters (peft, task SEQ_CLS) with the head and every module the
    checkpoint did not hold (`fresh`) in modules_to_save: trained in full and saved with the adapter."""
    model.config.pad_token_id = tokenizer.pad_token_id
    if t.gradient_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise SpecError(
                f"train.gradient_checkpointing: {type(model).__name__} does not support it; set it to false"
            )
        kwargs = {"use_reentrant": False}
        enable = getattr(model, "activation_checkpointing_enable", None)  # its name since transformers 5.x
        if enable is not None:
            enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if t.peft != "lora":
        return model
    return with_lora(model, t, fresh)


def with_lora(model: Any, t: TrainSpec, fresh: list[str]) -> Any:
    try:
        from peft import LoraConfig, TaskType, get_peft_model
    except ImportError:
        raise SpecError(
            "train.peft = 'lora' needs the peft package where the job runs: pip install 'jobgen[train]'"
        ) from None
    config = LoraConfig(
        task_type=TaskType.SEQ_CLS,
        r=t.lora_r,
        lora_alpha=t.lora_alpha,
        lora_dropout=t.lora_dropout,
        target_modules=list(t.lora_target_modules) or LORA_TARGETS.get(model.config.model_type),
        modules_to_save=list(fresh) or None,
    )
    try:
        return get_peft_model(model, config)
    except ValueError as exc:  # no default target modules for this model type, or names it lacks
        found = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if type(m).__name__ == "Linear"})
        raise SpecError(
            f"train.lora_target_modules: {str(exc).splitlines()[0]}; name its linear layers, e.g. {found[:8]}"
        ) from None


def trainable_names(model: Any) -> list[str]:
    return [name for name, p in model.named_parameters() if p.requires_grad]


def transformer_blocks(model: Any) -> list[Any]:
    """The repeated layers FSDP2 shards one by one (DistilBERT, BERT, RoBERTa-style encoders)."""
    import torch

    blocks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    return list(blocks[0]) if blocks else []
