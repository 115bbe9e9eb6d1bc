"""Every answer of the OpenAI-style routes that is not a success is OpenAI's error object
``{"error": {"message", "type", "param", "code"}}`` (issue 48), whatever refused the request: the
body cap (413, before the route reads a byte), the key routes' admin check (401, 403), a key that
is not there (404), a method the route does not take (405), a path OpenAI's clients call that is not
served (404), a body that fails its schema (400), a server with no model loaded (404), a route's own
failure (500). Read with the official ``openai`` client where it raises on them, with httpx for the
rest. The device protocol's routes keep FastAPI's ``{"detail"}``, which the device client reads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI, HTTPException

from edge.contract.protocol import ROUTES
from server.ports import free_port
from server.service import ServeConfig, Service
from tests.language import Models
from tests.server.llm.test_openai import ADMIN, MODEL, _key

ERROR_FIELDS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def served(models: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A server of the tiny target: its URL, an API key and a device's token."""
    state = tmp_path_factory.mktemp("errors")
    config = ServeConfig(state_dir=state, port=free_port(), mqtt_port=free_port(), admin_token=ADMIN, llm=models.target)
    with Service(config).background():
        device = httpx.post(config.url + ROUTES["devices"], json={"device": "d1"},
                            headers={"Authorization": f"Bearer {ADMIN}"}).json()["token"]
        yield {"url": config.url, "key": _key(config.url, "alice"), "device": device}


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    """The response's OpenAI error object, checked for its shape (and never the request echoed)."""
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json"), r.headers["content-type"]
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_FIELDS, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"] and len(r.content) < 1024
    return dict(body["error"])


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_prompt_over_the_body_cap_is_an_openai_error_like_one_over_the_context(served: dict[str, str]) -> None:
    url, key = served["url"], served["key"]
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as long:  # 60 KB: read, then refused for the model's context
        client.completions.create(model=MODEL, prompt="x" * 60_000, max_tokens=4)
    with pytest.raises(openai.APIStatusError) as huge:  # 1 MB: refused by the body cap before it is read
        client.completions.create(model=MODEL, prompt="x" * (1 << 20), max_tokens=4)
    assert huge.value.status_code == 413 and isinstance(huge.value.body, dict) and isinstance(long.value.body, dict)
    assert set(huge.value.body) == set(long.value.body) == ERROR_FIELDS  # the client unwraps {"error": ...}
    assert huge.value.body["type"] == "invalid_request_error" and "65536 bytes" in huge.value.body["message"]
    # declared by Content-Length, or found while the body streams in without one
    declared = _error(httpx.post(url + "/v1/chat/completions", content=b"{" + b" " * (1 << 20) + b"}",
                                 headers={**_bearer(key), "content-type": "application/json"}), 413)
    streamed = _error(httpx.post(url + "/v1/completions", content=iter([b"{", b" " * (1 << 20), b"}"]),
                                 headers={**_bearer(key), "content-type": "application/json"}), 413)
    assert declared == streamed == huge.value.body


def test_the_key_routes_answer_others_with_openai_errors(served: dict[str, str]) -> None:
    url, key, device = served["url"], served["key"], served["device"]
    keys = url + "/v1/llm/keys"
    for headers, status, kind in (({}, 401, "authentication_error"), (_bearer("not-a-token"), 401, "authentication_error"),
                                  (_bearer(key), 403, "permission_error"), (_bearer(device), 403, "permission_error")):
        assert _error(httpx.get(keys, headers=headers), status)["type"] == kind, headers
        assert _error(httpx.post(keys, json={"name": "eve"}, headers=headers), status)["type"] == kind, headers
        assert _error(httpx.delete(keys + "/alice", headers=headers), status)["type"] == kind, headers
    admin = _bearer(ADMIN)
    assert _error(httpx.delete(keys + "/nobody", headers=admin), 404)["code"] == "key_not_found"
    assert _error(httpx.post(keys, json={"name": "alice"}, headers=admin), 409)["code"] == "key_exists"
    bad = _error(httpx.post(keys, json={"name": "no spaces"}, headers=admin), 400)
    assert bad["param"] == "name" and bad["code"] == "invalid_value"
    assert _error(httpx.post(keys, json={"name": "eve", "admin": True}, headers=admin), 400)["param"] == "admin"
    # the admin still gets the keys
    assert httpx.get(keys, headers=admin).status_code == 200


def test_wrong_methods_and_paths_not_served_are_openai_errors(served: dict[str, str]) -> None:
    url, key = served["url"], served["key"]
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.embeddings.create(model=MODEL, input="To be")
    wrong = httpx.get(url + "/v1/completions", headers=_bearer(key))
    assert _error(wrong, 405)["code"] == "method_not_allowed" and wrong.headers["allow"] == "POST"
    assert _error(httpx.put(url + "/v1/models", headers=_bearer(key)), 405)["type"] == "invalid_request_error"
    assert _error(httpx.get(url + "/v1/models/" + MODEL + "/x", headers=_bearer(key)), 404)["code"] == "not_found"
    # the device protocol's routes keep FastAPI's shape, which the device client reads
    for r in (httpx.get(url + ROUTES["devices"], headers=_bearer(key)), httpx.get(url + "/v1/devices/d1/nothing/x"),
              httpx.post(url + ROUTES["verify"], json={})):
        assert "detail" in r.json() and "error" not in r.json(), r.text


def test_a_server_without_a_model_answers_openai_clients_with_an_openai_error(tmp_path: Path) -> None:
    config = ServeConfig(state_dir=tmp_path, port=free_port(), mqtt_port=free_port(), admin_token=ADMIN)
    with Service(config).background():
        client = openai.OpenAI(base_url=config.url + "/v1", api_key=ADMIN, max_retries=0)
        with pytest.raises(openai.NotFoundError, match="no language model is served here"):
            client.completions.create(model=MODEL, prompt="To be", max_tokens=2)
        assert _error(httpx.get(config.url + "/v1/models", headers=_bearer(ADMIN)), 404)["code"] == "not_found"


def test_statuses_no_route_here_makes_are_openai_errors_too() -> None:
    """429 and 500 on an OpenAI path (a rate limit, a bug), through the same handlers on an app of
    two routes; elsewhere FastAPI's and Starlette's own answers stay."""
    from starlette.testclient import TestClient

    from server.llm.errors import add_openai_errors

    app = FastAPI()
    add_openai_errors(app)

    @app.post("/v1/completions")
    def limited() -> None:
        raise HTTPException(429, "slow down", headers={"Retry-After": "3"})

    @app.post("/v1/chat/completions")
    def broken() -> None:
        raise RuntimeError("a bug with a secret inside")

    @app.get("/v1/devices")
    def device_route() -> None:
        raise RuntimeError("a bug")

    client = TestClient(app, raise_server_exceptions=False)
    r = client.post("/v1/completions")
    assert _error(r, 429) == {"message": "slow down", "type": "rate_limit_error", "param": None,
                              "code": "rate_limit_exceeded"} and r.headers["retry-after"] == "3"
    failed = _error(client.post("/v1/chat/completions"), 500)
    assert failed["type"] == "server_error" and "secret" not in failed["message"]
    plain = client.get("/v1/devices")
    assert plain.status_code == 500 and plain.text == "Internal Server Error"
