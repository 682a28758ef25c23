"""builtin:distilbert-shape: distilbert-base-uncased's architecture with random weights, built offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.training.conftest import spec_dict
from training import data
from training.spec import from_dict

pytestmark = [pytest.mark.training, pytest.mark.timeout(300)]


def test_distilbert_shape_has_distilberts_parameters_and_layout(tmp_path: Path, cache_dir: Path) -> None:
    from transformers import AutoConfig

    from training import model as model_lib

    spec = from_dict(
        spec_dict(
            tmp_path / "job", cache_dir, train={"model": "builtin:distilbert-shape"}, data={"partition": [60, 10, 10]}
        )
    )
    prepared = data.prepare(spec)
    assert Path(prepared.model_source).parent.name == "distilbert-shape"
    config = AutoConfig.from_pretrained(prepared.model_source)
    assert (config.n_layers, config.n_heads, config.dim, config.hidden_dim) == (6, 12, 768, 3072)
    assert config.vocab_size == 30522 and config.max_position_embeddings == 512
    model = model_lib.load_model(prepared.model_source, prepared.label_names)
    # distilbert-base-uncased with a 2-class head (AutoModelForSequenceClassification), as the hub's has
    assert sum(p.numel() for p in model.parameters()) == 66_955_010
    ids = prepared.tokenizer("a good film")["input_ids"]
    assert max(ids) < config.vocab_size  # the tokenizer trained on the texts fits the embedding


def test_jobgen_accepts_both_builtin_models_and_names_them(runner, tmp_path: Path) -> None:
    from jobgen.cli import main

    demo = Path(__file__).resolve().parents[2] / "experiments" / "local_demo.toml"
    ok = runner.invoke(main, ["validate", str(demo), "--set", "train.model=builtin:distilbert-shape"])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(main, ["validate", str(demo), "--set", "train.model=builtin:bert"])
    assert bad.exit_code != 0 and "builtin:tiny, builtin:tiny-decoder, builtin:distilbert-shape" in bad.output
