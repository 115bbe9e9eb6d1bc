"""The MoA draft split across the link: exported to ONNX for the device (parity with torch at
export), fed the target's states by the server after each round, and lossless over HTTP."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from bench.netem import NetemProxy
from edge.contract.protocol import ROUTES, VerifyRequest, decode_states
from edge.core.errors import LinkError
from edge.llm.draft import OnnxMoADraft
from edge.llm.generate import HttpVerifyLink, MqttVerifyLink, SessionLostError, VerifyRefusedError, generate
from server.ports import free_port
from server.service import ServeConfig, Service
from tests.language import Models
from tests.server.llm.test_verify import PROMPTS, _greedy


@pytest.fixture(scope="module")
def eagle(models: Models, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from export.lm_draft import export_lm_draft
    from models.lm.draft import train_draft

    root = tmp_path_factory.mktemp("eagle")
    train_draft(models.target, "eagle", corpus, root / "draft", steps=2, batch=2, context=32, checkpoint_minutes=60)
    manifest = export_lm_draft(root / "draft", models.target, root / "device.tar")
    assert manifest.model == "eagle" and manifest.parity_max_abs_logit < 1e-3
    return root / "device.tar"


@pytest.fixture(scope="module")
def served(models: Models, moa: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[str, str, str]]:
    """(HTTP URL, the device m1's token, the embedded broker's URL)."""
    state = tmp_path_factory.mktemp("moa-server")
    config = ServeConfig(state_dir=state, port=free_port(), mqtt_port=free_port(), llm=models.target, llm_draft=moa[0])
    with Service(config).background():
        admin = {"Authorization": f"Bearer {(state / 'admin.token').read_text().strip()}"}
        r = httpx.post(config.url + ROUTES["devices"], json={"device": "m1"}, headers=admin)
        r.raise_for_status()
        yield config.url, r.json()["token"], f"mqtt://127.0.0.1:{config.mqtt_port}"


@pytest.fixture(scope="module")
def server(served: tuple[str, str, str]) -> tuple[str, str]:
    return served[0], served[1]


def test_the_moa_draft_over_mqtt_through_the_embedded_broker_is_lossless(served: tuple[str, str, str], models: Models,
                                                                          moa: tuple[Path, Path]) -> None:
    _, token, broker = served
    draft = OnnxMoADraft(moa[1])
    link = MqttVerifyLink.connect(broker, "default", "m1", token)
    try:
        for prompt in PROMPTS:
            result = generate(draft, link, prompt, 16, k=4)
            assert result.tokens == _greedy(models.target, prompt, 16) and result.verified == 16, prompt
            assert result.offline_tokens == 0 and draft.states_held >= len(prompt) + 16 - 1
        # a round about a session the server does not hold: 409 over MQTT too
        with pytest.raises(SessionLostError):
            link.verify(VerifyRequest(session="never-started", start=5, draft=[1]))
        with pytest.raises(VerifyRefusedError, match="outside the target's vocabulary"):  # an error, not an outage
            link.verify(VerifyRequest(session="big", start=0, tokens=[10**6], draft=[1]))
    finally:
        link.close()
    with pytest.raises(LinkError, match="refused"):
        MqttVerifyLink.connect(broker, "default", "m1", "not-the-token", timeout_s=3)


def test_a_dropped_mqtt_link_goes_on_offline_and_reverifies(served: tuple[str, str, str], models: Models,
                                                            moa: tuple[Path, Path]) -> None:
    _, token, broker = served
    host, port = broker.removeprefix("mqtt://").split(":")
    with NetemProxy(host, int(port), rtt_s=0.02) as proxy:
        link = MqttVerifyLink.connect(f"mqtt://127.0.0.1:{proxy.port}", "default", "m1", token, timeout_s=2)
        cut = {"done": False}

        def drop_once(block: list[int], verified: bool) -> None:
            if verified and not cut["done"]:
                cut["done"] = True
                proxy.drop()  # the connection dies mid-generation; paho reconnects through the proxy (after 1 s)
            if not verified:
                time.sleep(0.1)  # a device's pace, so that the link returns before the text is done
        try:
            result = generate(OnnxMoADraft(moa[1]), link, PROMPTS[0], 40, k=4, retry_s=0.3, on_tokens=drop_once)
        finally:
            link.close()
    assert cut["done"] and result.offline_tokens > 0 and result.verified == 40
    assert result.tokens == _greedy(models.target, PROMPTS[0], 40)  # corrected where the offline text diverged


def test_the_onnx_moa_draft_over_http_is_lossless_and_gets_every_state(server: tuple[str, str], models: Models,
                                                                       moa: tuple[Path, Path]) -> None:
    url, token = server
    draft = OnnxMoADraft(moa[1])
    link = HttpVerifyLink(url, token)
    for prompt in PROMPTS:
        result = generate(draft, link, prompt, 24, k=4)
        assert result.tokens == _greedy(models.target, prompt, 24), prompt
        assert draft.states_held >= len(prompt) + 24 - 1  # every verified token but the last (the server may hold more)


def test_the_onnx_eagle_draft_over_http_is_lossless_on_the_targets_features(server: tuple[str, str], models: Models,
                                                                             eagle: Path) -> None:
    from edge.llm.draft import OnnxEagleDraft, load_lm_draft

    url, token = server
    draft = load_lm_draft(eagle)
    assert isinstance(draft, OnnxEagleDraft) and draft.state_kind == "features"
    link = HttpVerifyLink(url, token)
    for prompt in PROMPTS:
        result = generate(draft, link, prompt, 24, k=4)
        assert result.tokens == _greedy(models.target, prompt, 24), prompt
        assert draft.states_held >= len(prompt) + 24 - 1
    # the features are the target's own last hidden states, to within int8 rounding
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(models.target, local_files_only=True).eval()
    with torch.inference_mode():
        want = target(input_ids=torch.tensor([PROMPTS[2]]), output_hidden_states=True).hidden_states[-1][0].numpy()
    r = httpx.post(url + ROUTES["verify"], json={"session": "feat", "start": 0, "tokens": PROMPTS[2], "draft": [],
                                                 "states_from": 0, "state_kind": "features"},
                   headers={"Authorization": f"Bearer {token}"})
    got = decode_states(r.json()["states"], draft.hidden)
    assert got.shape == (len(PROMPTS[2]), draft.hidden)  # the prompt's: the server's next token follows it
    np.testing.assert_allclose(got, want, atol=float(np.abs(want).max()) / 127)


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

    assert main(["keygen", str(tmp_path / "keys")]) == 0
    capsys.readouterr()
    key, pub = tmp_path / "keys" / "signing.key", tmp_path / "keys" / "signing.pub"
    bundle = tmp_path / "device.tar"
    assert main(["export", str(moa[0]), "--target", str(models.target), "--out", str(bundle), "--key", str(key),
                 "--json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["parity_max_abs_logit"] < 1e-3 and exported["signed"] and bundle.is_file()
    url, token = server
    (tmp_path / "m1.token").write_text(token)
    args = ["edge", "generate", "--bundle", str(bundle), "--trust", str(pub), "--server", url,
            "--token-file", str(tmp_path / "m1.token"), "--max-tokens", "12", "--json", "To be, or not"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tokens"] == doc["verified"] == 12 and doc["server_calls"] >= 1 and doc["offline_tokens"] == 0
    assert main(["edge", "generate", "--bundle", str(bundle), "--max-tokens", "5", "--json", "To be"]) == 0  # no server
    alone = json.loads(capsys.readouterr().out)
    assert alone["verified"] == 0 and alone["offline_tokens"] == alone["kept"] == 5 and alone["text"]
    assert main(["edge", "generate", "--bundle", str(bundle), "--server", url, "x"]) == 1
    assert "--token-file" in capsys.readouterr().err
    # an unsigned bundle where a key is trusted, and a classifier's bundle, are refused in one line
    assert main(["edge", "generate", "--bundle", str(moa[1]), "--trust", str(pub), "x"]) == 1
    assert "signature is required" in capsys.readouterr().err
    folder = tmp_path / "unpacked"
    folder.mkdir()
    import tarfile

    with tarfile.open(bundle) as tar:
        tar.extractall(folder, filter="data")
    (folder / "tokenizer.json").write_text("{}")
    assert main(["edge", "generate", "--bundle", str(folder), "x"]) == 1
    assert "tokenizer.json does not match its sha256" in capsys.readouterr().err


def test_states_survive_the_wire_to_within_int8_rounding() -> None:
    from edge.contract.protocol import encode_states

    rng = np.random.default_rng(0)
    states = rng.normal(0, 3, (7, 48)).astype(np.float32)
    back = decode_states(encode_states(states), 48)
    assert back.shape == states.shape
    assert np.all(np.abs(back - states) <= np.abs(states).max(1, keepdims=True) / 127 * 0.51 + 1e-3)
    assert decode_states(encode_states(np.zeros((0, 48))), 48).shape == (0, 48)


def test_an_int8_moa_draft_is_smaller_agrees_and_stays_lossless(server: tuple[str, str], models: Models,
                                                                moa: tuple[Path, Path], tmp_path: Path) -> None:
    from export.lm_draft import export_moa_draft

    manifest = export_moa_draft(moa[0], models.target, tmp_path / "int8", precision="int8")
    assert manifest.precision == "int8" and manifest.top1_agreement is not None and manifest.top1_agreement > 0.5
    size = {name: sum((folder / f).stat().st_size for f in manifest.files if f.endswith(".onnx"))
            for name, folder in (("fp32", moa[1]), ("int8", tmp_path / "int8"))}
    assert size["int8"] < 0.6 * size["fp32"]
    url, token = server
    draft = OnnxMoADraft(tmp_path / "int8")
    for prompt in PROMPTS[:2]:  # verification keeps the text the target's, whatever the draft's precision
        assert generate(draft, HttpVerifyLink(url, token), prompt, 24, k=4).tokens == _greedy(models.target, prompt, 24)


def test_auto_mode_asks_for_a_block_without_the_states_nothing_will_read(server: tuple[str, str], models: Models,
                                                                          moa: tuple[Path, Path]) -> None:
    """A block the server decodes itself holds the rest of the text: the MoA draft will not draft
    after it, so its target states (about 1 kB a token) are not sent; a drafting round that
    follows a block in another generation starts from a reset draft anyway."""
    from edge.llm.generate import LinkEstimates

    url, token = server
    draft = OnnxMoADraft(moa[1])
    first = generate(draft, HttpVerifyLink(url, token), PROMPTS[0], 24, k=4, auto=True, estimates=LinkEstimates())
    assert first.tokens == _greedy(models.target, PROMPTS[0], 24) and first.server_calls == 1  # one block
    assert draft.states_held == 0
    estimates = LinkEstimates(rtt_s=0.0, verify_s=0.01, server_token_s=0.01)
    estimates.acceptance.kept = 0.95 * estimates.acceptance.tried  # drafting pays: rounds, and their states
    drafted = generate(draft, HttpVerifyLink(url, token), PROMPTS[0], 24, k=4, auto=True, estimates=estimates)
    assert drafted.tokens == first.tokens and drafted.server_calls > 1 and draft.states_held >= len(PROMPTS[0])
