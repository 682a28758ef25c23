"""LoRA (train.peft = "lora"), gradient checkpointing and decoder-only classifiers, in-process on one rank.

The 2-rank runs (DDP, FSDP, DeepSpeed ZeRO-3, and the real pretrained MiniLM) are in
test_lora_distributed.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.training.conftest import spec_dict
from training import model as model_lib
from training.spec import SpecError, from_dict

pytestmark = pytest.mark.training

LABELS = ["negative", "positive"]


def _texts(n: int = 200) -> tuple[list[str], list[int]]:
    from training import synthetic

    rows = synthetic.make_rows(n, seed=3)
    return rows["text"], [LABELS.index(label) for label in rows["label"]]


@pytest.fixture(scope="module")
def tiny_decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("decoder") / "tiny-decoder"
    model_lib.build_tiny_decoder(_texts()[0], LABELS, target, seed=1)
    return target


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("encoder") / "tiny"
    model_lib.build_tiny(_texts()[0], LABELS, target, seed=1)
    return target


def _train_spec(tmp_path: Path, **train: Any):
    return from_dict(spec_dict(tmp_path / "job", tmp_path, train=train)).train


def _with_padding_side(source: Path, side: str, target: Path) -> Path:
    """A copy of the model folder whose tokenizer pads on `side` (tokenizer_config.json)."""
    import shutil

    shutil.copytree(source, target)
    config = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**config, "padding_side": side}))
    return target


def _prepared(source: Path, tmp_path: Path, **train: Any) -> tuple[Any, Any]:
    tokenizer = model_lib.load_tokenizer(str(source))
    model, fresh = model_lib.load_model_info(str(source), LABELS)
    return model_lib.prepare(model, _train_spec(tmp_path, **train), tokenizer, fresh), tokenizer


def _batch(tokenizer: Any, texts: list[str]) -> dict[str, Any]:
    from training.loaders import Collator

    rows = [dict(tokenizer(text, truncation=True, max_length=64)) for text in texts]
    return dict(Collator(tokenizer, "dynamic", 64)(rows))


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_decoder_classifier_gives_the_same_logits_alone_and_padded(
    side: str, tiny_decoder: Path, tmp_path: Path, one_thread: None
) -> None:
    import torch

    source = _with_padding_side(tiny_decoder, side, tmp_path / side)
    raw = json.loads((source / "tokenizer_config.json").read_text())
    assert raw["padding_side"] == side and raw.get("pad_token") is None  # a decoder tokenizer without a pad token
    model, tokenizer = _prepared(source, tmp_path)
    model.eval()
    assert tokenizer.pad_token == tokenizer.eos_token == "</s>"
    assert model.config.pad_token_id == tokenizer.eos_token_id
    texts = ["good", "a very good film with a lovely plot", "bad acting and a dull story"]
    padded = _batch(tokenizer, texts)
    assert (padded["attention_mask"] == 0).sum() > 0  # the batch is really padded
    with torch.no_grad():
        together = model(**padded).logits
        alone = torch.cat([model(**_batch(tokenizer, [text])).logits for text in texts])
    assert torch.allclose(together, alone, atol=1e-5), (together, alone)
    assert not torch.allclose(together[0], together[1], atol=1e-3)  # the logits depend on the text


def test_a_decoder_without_the_pad_token_on_its_config_refuses_a_batch(tiny_decoder: Path) -> None:
    """The trap the pad token on the model's config avoids: the tokenizer's alone is not enough."""
    tokenizer = model_lib.load_tokenizer(str(tiny_decoder))
    model = model_lib.load_model(str(tiny_decoder), LABELS)
    with pytest.raises(ValueError, match="padding token"):
        model(**_batch(tokenizer, ["good", "a bad film"]))


def _two_steps(model: Any, tokenizer: Any) -> list[dict[str, Any]]:
    """Each trainable parameter's gradient after step 1 and after step 2 (None where it got none)."""
    import torch

    texts, labels = _texts(16)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    grads = []
    for step in range(2):
        batch = _batch(tokenizer, texts[step * 8 : step * 8 + 8])
        model(**batch, labels=torch.tensor(labels[step * 8 : step * 8 + 8])).loss.backward()
        grads.append(
            {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("peft", ["none", "lora"])
@pytest.mark.parametrize("which", ["decoder", "encoder"])
def test_gradient_checkpointing_gives_every_trainable_parameter_a_gradient(
    peft: str, which: str, tiny_decoder: Path, tiny_encoder: Path, tmp_path: Path, one_thread: None
) -> None:
    source = tiny_decoder if which == "decoder" else tiny_encoder
    model, tokenizer = _prepared(source, tmp_path, peft=peft, gradient_checkpointing=True, lora_dropout=0.0)
    model.train()
    base = model.get_base_model() if peft == "lora" else model
    assert base.is_activation_checkpointing
    first, second = _two_steps(model, tokenizer)
    assert first and all(g is not None for g in first.values()), [n for n, g in first.items() if g is None]
    # LoRA's B starts at zero, so at step 1 the gradient of A (B^T times what reaches the layer) is zero
    # by construction; every other trainable parameter's is not, and after one step none is.
    zero_first = sorted(n for n, g in first.items() if not g.abs().sum() > 0)
    assert all(".lora_A." in n for n in zero_first), zero_first
    zero_second = sorted(n for n, g in second.items() if g is None or not g.abs().sum() > 0)
    assert not zero_second, zero_second
    if peft == "lora":
        assert any(".lora_B." in n for n in first) and any("modules_to_save" in n for n in first)


def test_lora_trains_the_adapters_and_the_head_and_nothing_else(tiny_encoder: Path, tmp_path: Path) -> None:
    model, _ = _prepared(tiny_encoder, tmp_path, peft="lora", lora_r=4)
    names = model_lib.trainable_names(model)
    assert names and all(".lora_" in n or ".modules_to_save." in n for n in names), names
    assert any("classifier.modules_to_save" in n for n in names)
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in names if ".lora_" in n} == {"q_lin", "v_lin"}
    chosen, _ = _prepared(tiny_encoder, tmp_path, peft="lora", lora_target_modules=["out_lin"])
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in model_lib.trainable_names(chosen) if ".lora_" in n} == {
        "out_lin"
    }


def test_a_module_the_model_lacks_is_one_line_naming_the_key(tiny_decoder: Path, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"^train\.lora_target_modules: .*q_proj") as caught:
        _prepared(tiny_decoder, tmp_path, peft="lora", lora_target_modules=["q_lin"])
    assert "\n" not in str(caught.value)


def test_the_head_the_checkpoint_lacks_is_trained_and_saved(tiny_encoder: Path, tmp_path: Path) -> None:
    """A checkpoint without the head (a sentence encoder, a base decoder): the fresh head trains in full."""
    import shutil

    from safetensors.torch import load_file, save_file

    source = tmp_path / "headless"
    shutil.copytree(tiny_encoder, source)
    weights = load_file(source / "model.safetensors")
    save_file(
        {k: v for k, v in weights.items() if not k.startswith(("pre_classifier.", "classifier."))},
        source / "model.safetensors",
    )
    model, fresh = model_lib.load_model_info(str(source), LABELS)
    assert fresh == ["classifier", "pre_classifier"]
    wrapped = model_lib.prepare(model, _train_spec(tmp_path, peft="lora"), model_lib.load_tokenizer(str(source)), fresh)
    assert any(
        n.startswith("base_model.model.pre_classifier.modules_to_save") for n in model_lib.trainable_names(wrapped)
    )


def test_a_lora_job_probes_and_its_adapter_reloads_to_the_tested_score(tmp_path: Path, cache_dir: Path) -> None:
    """One process, the tiny decoder with LoRA and gradient checkpointing: the job trains, tests, writes
    its adapter and counts its trainable parameters; reloaded on the base model, the adapter scores the
    test split exactly as the job did. Its probe measures the same job's memory, which `jobgen probe`
    turns into a prediction as for any other job."""
    from jobgen.results.predict import predict
    from training.run import run

    train = {
        "model": "builtin:tiny-decoder",
        "peft": "lora",
        "lora_r": 4,
        "gradient_checkpointing": True,
        "epochs": 2,
        "lr": 2e-2,
    }
    job = tmp_path / "job"
    spec = from_dict(spec_dict(job, cache_dir, train=train))
    assert run(spec) == 0
    result = json.loads((job / "result.json").read_text())
    params = result["parameters"]
    assert 0 < params["trainable"] < params["total"]
    assert result["test_acc"] >= 0.8, result  # chance is 0.5
    assert reevaluate(spec, job) == result["test_metrics"]
    probe_job = tmp_path / "probe"
    probed = from_dict({**spec_dict(probe_job, cache_dir, train=train), "probe": {"steps": 4, "warmup_steps": 2}})
    assert run(probed) == 0
    measured = json.loads((probe_job / "probe.json").read_text())
    prediction = predict("probe", measured, elapsed_s=None, ranks_per_node=1)
    assert prediction.predicted_peak_mem_mb is not None and prediction.predicted_peak_mem_mb > 100


def reevaluate(spec: Any, job: Path) -> dict[str, Any]:
    """The test metrics of the job's saved adapter on its base model, scored here on one process."""
    import torch

    from training import adapter, data
    from training.loaders import make_loader, model_inputs
    from training.metrics import Scores

    prepared = data.prepare(spec)
    model = adapter.load(prepared.model_source, prepared.label_names, job / adapter.ADAPTER_DIR, prepared.problem_type)
    test = prepared.splits["test"]
    scores = Scores(prepared.problem_type, prepared.num_labels, "cpu", test["labels"])
    with torch.no_grad():
        for batch in make_loader(test, spec, prepared.tokenizer, False):
            scores.update(model(**model_inputs(batch)).logits.float(), batch["labels"], batch["row"])
    return dict(scores.compute()["metrics"])


def _without_dropout(prepare: Any) -> Any:
    def prepared(*args: Any, **kwargs: Any) -> Any:
        import torch

        model = prepare(*args, **kwargs)
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        return model

    return prepared


@pytest.mark.usefixtures("one_thread")
def test_every_engine_makes_the_same_lora_updates(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three optimizer steps of two accumulated batches each, dropout off: every engine leaves the same
    adapter and head (the same AdamW, parameter groups, warm-up and loss scale as the plain loop), and
    logs the same training loss."""
    import csv

    from safetensors.torch import load_file

    from training.run import run

    monkeypatch.setattr(model_lib, "prepare", _without_dropout(model_lib.prepare))
    train = {"peft": "lora", "epochs": 1, "batch_size": 16, "grad_accum": 2, "max_steps": 3, "warmup_steps": 2}
    train |= {"lr": 1e-2, "log_every_n_steps": 1}
    weights, losses = {}, {}
    for engine in ("torch", "lightning", "fabric", "hf_trainer"):
        job = tmp_path / engine
        spec = spec_dict(job, cache_dir, train={**train, "engine": engine}, data={"partition": [200, 64, 64]})
        assert run(from_dict(spec)) == 0
        weights[engine] = load_file(job / "adapter" / "adapter_model.safetensors")
        rows = csv.DictReader((job / "metrics.csv").open())
        losses[engine] = [(int(r["step"]), float(r["loss"])) for r in rows if r["split"] == "train"]
    import torch

    for engine in weights:
        assert weights[engine].keys() == weights["torch"].keys(), engine
        for key, value in weights[engine].items():
            torch.testing.assert_close(value, weights["torch"][key], msg=lambda m, e=engine, k=key: f"{e} {k}: {m}")
    # A row per optimizer step, the loss of the batch that stepped; the Trainer's is its own mean of the
    # step's two batches: near the others', where a loss scaled by grad_accum would be twice theirs.
    assert [step for step, _ in losses["torch"]] == [1, 2, 3], losses
    assert losses["lightning"] == losses["fabric"] == losses["torch"], losses
    assert [step for step, _ in losses["hf_trainer"]] == [1, 2, 3], losses
    assert all(abs(a[1] - b[1]) < 0.05 for a, b in zip(losses["hf_trainer"], losses["torch"], strict=True)), losses
