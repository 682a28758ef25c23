"""Secrets never reach a page jobgen writes from a log (jobgen.record.store.redact)."""

from __future__ import annotations

import pytest

from jobgen.record.store import redact


def test_redact_takes_out_the_environments_secrets_and_token_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef")
    monkeypatch.setenv("SHORT_TOKEN", "abc")  # too short to be a real secret: common words stay
    text = redact(
        "key 0123456789abcdef in a line\n"
        "HF_TOKEN=hf_" + "a" * 34 + " and api_key = s3cr3t and password=hunter2\n"
        "ghp_" + "B" * 36 + " AKIA" + "C" * 16 + "\n"
        "tokens_per_s=812.5 KeyError: 'sentence' abc\n"
    )
    assert "0123456789abcdef" not in text and "[redacted $WANDB_API_KEY]" in text
    for secret in ("hf_aaaa", "s3cr3t", "hunter2", "ghp_", "AKIA"):
        assert secret not in text, secret
    assert "HF_TOKEN=[redacted]" in text and "api_key = [redacted]" in text
    assert text.endswith("tokens_per_s=812.5 KeyError: 'sentence' abc\n")  # what only looks alike stays
