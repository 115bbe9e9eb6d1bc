"""What the LLM server tests share: a MoA draft of the tiny target, trained a few steps and exported
for the device, once a session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.language import Models


@pytest.fixture(scope="session")
def moa(models: Models, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the MoA draft's folder, its device bundle folder)."""
    from export.lm_draft import export_moa_draft
    from models.lm.draft import train_draft

    root = tmp_path_factory.mktemp("moa")
    train_draft(models.target, "moa", corpus, root / "draft", steps=2, batch=2, context=32, checkpoint_minutes=60)
    manifest = export_moa_draft(root / "draft", models.target, root / "device")
    assert manifest.parity_max_abs_logit < 1e-3 and "tokenizer.json" in manifest.files
    return root / "draft", root / "device"
