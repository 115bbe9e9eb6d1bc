"""The MoA draft split across the link: exported to ONNX for the device (parity with torch at
export), fed the target's states by the server after each round, and lossless over HTTP."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from edge.generate import HttpLink, generate
from edge.lm_draft import OnnxMoADraft, decode_states
from edge.protocol import ROUTES
from tests.models.test_lm import corpus as corpus
from tests.server.test_llm import Models, _serve
from tests.server.test_llm import models as models
from tests.server.test_verify import PROMPTS, _greedy


@pytest.fixture(scope="module")
def moa(models: Models, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from export.lm_draft import export_moa_draft
    from models.draft import train_draft

    root = tmp_path_factory.mktemp("moa")
    train_draft(models.target, "moa", corpus, root / "draft", steps=2, batch=2, context=32, checkpoint_minutes=60)
    doc = export_moa_draft(root / "draft", models.target, root / "device")
    assert doc["parity_max_abs_logit"] < 1e-3 and (root / "device" / "tokenizer.json").is_file()
    return root / "draft", root / "device"


@pytest.fixture(scope="module")
def server(models: Models, moa: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    state = tmp_path_factory.mktemp("moa-server")
    with _serve(state, llm=models.target, llm_draft=moa[0]) as url:
        admin = {"Authorization": f"Bearer {(state / 'admin.token').read_text().strip()}"}
        r = httpx.post(url + ROUTES["devices"], json={"device": "m1"}, headers=admin)
        r.raise_for_status()
        yield url, r.json()["token"]


def test_the_onnx_moa_draft_over_http_is_lossless_and_gets_every_state(server: tuple[str, str], models: Models,
                                                                       moa: tuple[Path, Path]) -> None:
    url, token = server
    draft = OnnxMoADraft(moa[1])
    link = HttpLink(url, token)
    for prompt in PROMPTS:
        result = generate(draft, link, prompt, 24, k=4)
        assert result.tokens == _greedy(models.target, prompt, 24), prompt
        assert draft.states_held >= len(prompt) + 24 - 1  # every verified token but the last (the server may hold more)


def test_states_are_compact_and_only_for_what_the_target_holds(server: tuple[str, str], moa: tuple[Path, Path]) -> None:
    url, token = server
    auth = {"Authorization": f"Bearer {token}"}
    r = httpx.post(url + ROUTES["verify"], json={"session": "st", "start": 0, "tokens": list(range(1, 11)), "draft": [3],
                                                 "states_from": 0}, headers=auth)
    body = r.json()
    hidden = OnnxMoADraft(moa[1]).hidden
    states = decode_states(body["states"], hidden)
    assert r.status_code == 200 and states.shape == (body["history"] - 1, hidden) and np.isfinite(states).all()
    assert len(base64.b64decode(body["states"])) == (hidden + 2) * states.shape[0]  # int8 values and a float16 scale a token
    late = httpx.post(url + ROUTES["verify"], json={"session": "st", "start": body["history"], "states_from": 99}, headers=auth)
    assert late.status_code == 400 and "states_from = 99" in late.text


def test_the_cli_exports_and_generates_against_the_server(server: tuple[str, str], moa: tuple[Path, Path], models: Models,
                                                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from trickle.cli import main

    assert main(["export", str(moa[0]), "--target", str(models.target), "--out", str(tmp_path / "device"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parity_max_abs_logit"] < 1e-3
    url, token = server
    (tmp_path / "m1.token").write_text(token)
    args = ["edge", "generate", "--draft", str(tmp_path / "device"), "--server", url, "--token-file", str(tmp_path / "m1.token"),
            "--max-tokens", "12", "--json", "To be, or not"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tokens"] == doc["verified"] == 12 and doc["server_calls"] >= 1 and doc["offline_tokens"] == 0
    assert main([*args[:3], str(tmp_path / "device"), "--max-tokens", "5", "--json", "To be"]) == 0  # no server
    alone = json.loads(capsys.readouterr().out)
    assert alone["verified"] == 0 and alone["offline_tokens"] == 5
    assert main(["edge", "generate", "--draft", str(tmp_path / "device"), "--server", url, "x"]) == 1
    assert "--token-file" in capsys.readouterr().err


def test_states_survive_the_wire_to_within_int8_rounding() -> None:
    from edge.lm_draft import encode_states

    rng = np.random.default_rng(0)
    states = rng.normal(0, 3, (7, 48)).astype(np.float32)
    back = decode_states(encode_states(states), 48)
    assert back.shape == states.shape
    assert np.all(np.abs(back - states) <= np.abs(states).max(1, keepdims=True) / 127 * 0.51 + 1e-3)
    assert decode_states(encode_states(np.zeros((0, 48))), 48).shape == (0, 48)
