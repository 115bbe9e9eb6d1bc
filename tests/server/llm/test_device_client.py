"""`trickle edge generate`, the device client of client–server speculative decoding, against real
servers (tiny models; issue 32): a request the server refuses is an error with the server's reason,
not an outage; a restarted server is sent the history again, at the end of the text too; stdout
holds only text that stays, unverified text marked when asked for; keep mode counts what it kept
unverified; special-token text in a prompt is plain text."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

import httpx
import pytest
import torch

from edge.cli import TextOut
from edge.contract.protocol import ROUTES
from edge.llm.draft import OnnxMoADraft
from edge.llm.generate import HttpVerifyLink, TextChange, VerifyRefusedError, generate
from server.ports import free_port
from server.service import ServeConfig, Service
from tests.language import CONTEXT, Models
from tests.server.llm.test_verify import _greedy
from trickle.cli import main

PROMPT = "To be, or not"


class Gateway:
    """An HTTP gateway in front of the server, as a load balancer is: it answers 503 (no backend)
    to the requests whose index (from 0) is in ``down`` and passes the others on, unchanged."""

    def __init__(self, upstream: str, down: range) -> None:
        self.upstream, self.down, self.requests = upstream, down, 0
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                index, gateway.requests = gateway.requests, gateway.requests + 1
                if index in gateway.down:
                    status, content = 503, b'{"detail": "no backend is up (test gateway)"}'
                else:
                    headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
                    r = httpx.post(gateway.upstream + self.path, content=body, headers=headers, timeout=30)
                    status, content = r.status_code, r.content
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True, name="gateway")
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"

    def __enter__(self) -> Gateway:
        self.thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.http.shutdown()
        self.http.server_close()


def _config(state: Path, models: Models, draft: Path | None) -> ServeConfig:
    return ServeConfig(state_dir=state, port=free_port(), mqtt_port=free_port(), llm=models.target, llm_draft=draft,
                       llm_open=True)


def _register(config: ServeConfig, device: str) -> str:
    admin = {"Authorization": f"Bearer {(config.state_dir / 'admin.token').read_text().strip()}"}
    r = httpx.post(config.url + ROUTES["devices"], json={"device": device}, headers=admin)
    r.raise_for_status()
    return str(r.json()["token"])


@pytest.fixture(scope="module")
def moa_server(models: Models, moa: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[str, str]]:
    """(URL, device c1's token) of a server of the target and the MoA draft the bundle came from."""
    config = _config(tmp_path_factory.mktemp("client-moa"), models, moa[0])
    with Service(config).background():
        yield config.url, _register(config, "c1")


@pytest.fixture(scope="module")
def plain_server(models: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(URL, device c1's token) of a server of the target alone: no MoA draft to feed a device's."""
    config = _config(tmp_path_factory.mktemp("client-plain"), models, None)
    with Service(config).background():
        yield config.url, _register(config, "c1")


def _token_file(folder: Path, token: str) -> Path:
    path = folder / "device.token"
    path.write_text(token)
    return path


def _generate(bundle: Path, server: str, token_file: Path, *flags: str, prompt: str = PROMPT) -> list[str]:
    return ["edge", "generate", "--bundle", str(bundle), "--server", server, "--token-file", str(token_file), *flags, prompt]


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ---- 1. a refused request is an error with the server's reason, not an outage ----


def test_a_moa_draft_against_a_server_without_it_is_an_error_not_an_outage(
        plain_server: tuple[str, str], moa: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    url, token = plain_server
    assert main(_generate(moa[1], url, _token_file(tmp_path, token), "--max-tokens", "16")) == 1
    out, err = capsys.readouterr()
    line = _one_line(err)
    assert "HTTP 400" in line and "serves no MoA draft" in line and out.strip() == ""
    with pytest.raises(VerifyRefusedError) as refused:  # the library says the same
        generate(OnnxMoADraft(moa[1]), HttpVerifyLink(url, token), [1, 5, 9, 40], 8)
    made = refused.value.generation
    assert refused.value.status == 400 and made is not None and made.server_calls == 0 and made.tokens == []


def test_an_unknown_token_is_an_error_naming_the_token(moa_server: tuple[str, str], moa: tuple[Path, Path],
                                                       tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = moa_server
    bogus = _token_file(tmp_path, "not-a-token-of-this-server")
    assert main(_generate(moa[1], url, bogus, "--max-tokens", "16")) == 1
    out, err = capsys.readouterr()
    line = _one_line(err)
    assert "HTTP 401" in line and "token" in line and str(bogus) in line and out.strip() == ""


def test_text_past_the_targets_context_is_an_error_after_the_text_that_fits(
        moa_server: tuple[str, str], moa: tuple[Path, Path], models: Models, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    url, token = moa_server
    tokenizer = OnnxMoADraft(moa[1]).tokenizer()
    prompt = "To be, or not to be, that is the question. " * 60
    ids = tokenizer.encode(prompt).ids[: CONTEXT - 24]
    prompt = tokenizer.decode(ids)
    ids = tokenizer.encode(prompt).ids
    assert CONTEXT - 40 < len(ids) < CONTEXT - 8  # room for some tokens, not for 64
    assert main(_generate(moa[1], url, _token_file(tmp_path, token), "--max-tokens", "64", prompt=prompt)) == 1
    out, err = capsys.readouterr()
    line = _one_line(err)
    assert "HTTP 400" in line and f"context of {CONTEXT}" in line
    with pytest.raises(VerifyRefusedError) as refused:
        generate(OnnxMoADraft(moa[1]), HttpVerifyLink(url, token), ids, 64, k=4)
    made = refused.value.generation
    assert made is not None and made.verified == len(made.tokens) > 0
    assert len(ids) + len(made.tokens) > CONTEXT - 4  # refused only when the next draft no longer fits
    assert made.tokens == _greedy(models.target, ids, len(made.tokens))
    assert out == tokenizer.decode(made.tokens) + "\n"  # the CLI printed the same verified text, and no more


def test_a_server_that_cannot_be_reached_is_an_outage(moa: tuple[Path, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The difference: nothing answers at all. The draft goes on alone and the command succeeds, but
    prints none of that unverified text unless asked, and says why."""
    nowhere = f"http://127.0.0.1:{free_port()}"
    token_file = _token_file(tmp_path, "t")
    flags = ("--max-tokens", "8", "--retry-s", "0", "--timeout-s", "1")
    assert main(_generate(moa[1], nowhere, token_file, *flags)) == 0
    out, err = capsys.readouterr()
    assert out == "\n" and "8 tokens (0 verified, 8 drafted offline and unchecked" in err and "--show-draft" in err
    assert main(_generate(moa[1], nowhere, token_file, *flags, "--json", "--show-draft")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["text"] == "" and doc["draft_text"] and doc["verified"] == 0 and doc["unchecked"] == doc["unverified"] == 8


@pytest.mark.parametrize("content", ["", "\n  \n", "two\nlines", "a token with spaces", "t\u00f6ken"])
def test_a_token_file_without_a_token_is_a_configuration_error_before_any_network_use(
        moa: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str) -> None:
    """Not an outage (exit 0, the draft alone): the file is refused in one line naming it, and
    nothing is sent — the server here is a socket that counts who connects to it."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    token_file = tmp_path / "device.token"
    token_file.write_text(content)
    with listener:
        for flags in (("--server", url), ("--broker", url.replace("http", "mqtt"), "--device", "d1")):
            args = ["edge", "generate", "--bundle", str(moa[1]), *flags, "--token-file", str(token_file), PROMPT]
            assert main(args) == 1
            out, err = capsys.readouterr()
            line = _one_line(err)
            assert "--token-file" in line and str(token_file) in line and out == "", line
            assert ("is empty" if not content.strip() else "does not hold a token") in line
            with pytest.raises(BlockingIOError):  # no connection was made
                listener.accept()


# ---- 2. a restarted server gets the whole history again, at the end of the text too ----


def test_a_server_restarted_before_the_end_is_sent_the_history_again(models: Models, moa: tuple[Path, Path],
                                                                     tmp_path: Path) -> None:
    """The server stops after the first verified block; the device drafts the rest alone (retry_s
    keeps it from trying sooner) and the server comes back, a new process without the session, just
    before the end-of-run verification: its 409 makes the device send the whole history again."""
    config = _config(tmp_path / "state", models, moa[0])
    n, prompt = 40, [1, 5, 9, 40]
    with ExitStack() as server:
        server.enter_context(Service(config).background())
        token = _register(config, "c1")
        made = {"verified": 0, "offline": 0}

        def weather(block: list[int], verified: bool) -> None:
            made["verified" if verified else "offline"] += len(block)
            if verified and made["offline"] == 0:
                server.close()  # the server goes down
            if not verified and made["verified"] + made["offline"] == n:  # the text is complete: it comes back
                server.enter_context(Service(config.model_copy(update={"mqtt_port": free_port()})).background())

        result = generate(OnnxMoADraft(moa[1]), HttpVerifyLink(config.url, token, timeout_s=2), prompt, n, k=4,
                          retry_s=3600, on_tokens=weather)
    assert made["offline"] > 20 and result.offline_tokens == made["offline"]
    assert result.verified == n and result.unchecked == 0 and result.tokens == _greedy(models.target, prompt, n)


# ---- 3. stdout keeps no text the client threw away ----


def test_stdout_holds_only_text_that_stays(moa_server: tuple[str, str], moa: tuple[Path, Path],
                                           models: Models, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One verified block, then three requests the gateway cannot pass on (503: an outage), so the
    draft goes on alone; the link comes back and the target replaces that text from where it
    disagrees. stdout is the final text, the target's own greedy text, once."""
    url, token = moa_server
    tokenizer = OnnxMoADraft(moa[1]).tokenizer()
    want = tokenizer.decode(_greedy(models.target, tokenizer.encode(PROMPT).ids, 30))
    flags = ("--max-tokens", "30", "--k", "2", "--retry-s", "0")
    token_file = _token_file(tmp_path, token)
    with Gateway(url, down=range(1, 4)) as gateway:
        assert main(_generate(moa[1], gateway.url, token_file, *flags)) == 0
    out, err = capsys.readouterr()
    assert "diverged at" in err and "30 tokens (30 verified)" in err  # the offline text was replaced
    assert out == want + "\n"
    with Gateway(url, down=range(1, 4)) as gateway:  # the same, showing the draft: marked, and its replacement said
        assert main(_generate(moa[1], gateway.url, token_file, *flags, "--show-draft")) == 0
    out = capsys.readouterr().out
    before, _, drafted = out.partition("[draft: ")
    _, notice, after = drafted.partition("; its text follows]")
    assert "[the target replaced the draft from " in drafted and notice
    assert before and want.startswith(before) and after.endswith("\n") and want.endswith(after[:-1])


def test_a_terminal_sees_the_draft_dim_and_its_replacement_said() -> None:
    stream = io.StringIO()
    out = TextOut(lambda tokens: "".join(chr(t) for t in tokens), stream, show_draft=True, styled=True, verifying=True)
    for kind, text in [("verified", "ab"), ("drafted", "cd"), ("drafted", "e"), ("confirmed", "c"), ("discarded", "de"),
                       ("verified", "X"), ("drafted", "yz"), ("kept", "yz")]:
        out(TextChange(kind, [ord(c) for c in text]))  # type: ignore[arg-type]
    out.finish(None)
    dim, undim, note, unnote = TextOut.DIM, TextOut.UNDIM, TextOut.NOTE, TextOut.UNNOTE
    assert stream.getvalue() == (f"ab{dim}cd{undim}{dim}e{undim}{note}[the target replaced the draft from \"de\"; its "
                                 f"text follows]{unnote}X{dim}yz{undim}{note}[the target disagreed from \"yz\"; kept, "
                                 f"unverified]{unnote}\n")


# ---- 4. keep mode counts what it kept unverified ----


def _target_agrees(folder: Path, prompt: list[int], tokens: list[int]) -> list[bool]:
    """Per token: whether it is the target's own greedy choice after the text before it."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    with torch.inference_mode():
        logits = target(input_ids=torch.tensor([prompt + tokens])).logits[0]
    choice = logits[len(prompt) - 1 : -1].argmax(-1).tolist()
    return [c == t for c, t in zip(choice, tokens)]


def test_keep_mode_counts_the_text_it_kept_as_unverified(moa_server: tuple[str, str], moa: tuple[Path, Path],
                                                        models: Models, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    url, token = moa_server
    ids = OnnxMoADraft(moa[1]).tokenizer().encode(PROMPT).ids
    with Gateway(url, down=range(1, 6)) as gateway:
        result = generate(OnnxMoADraft(moa[1]), HttpVerifyLink(gateway.url, token), ids, 40, k=2, retry_s=0,
                          on_divergence="keep")
    assert len(result.divergences) == 1 and result.kept > 0 and result.unchecked == 0
    assert result.verified + result.kept == len(result.tokens) == 40
    # the oracle: the target itself. Where it disagreed the kept text starts; every token outside
    # that kept text is the target's own choice after the text before it (verified)
    agrees = _target_agrees(models.target, ids, result.tokens)
    first = result.divergences[0]
    kept = range(first, first + result.kept)
    assert not agrees[first] and all(agrees[i] for i in range(40) if i not in kept)
    token_file = _token_file(tmp_path, token)
    flags = ("--max-tokens", "40", "--k", "2", "--retry-s", "0", "--on-divergence", "keep")
    with Gateway(url, down=range(1, 6)) as gateway:  # the CLI reports the same, to the token
        assert main(_generate(moa[1], gateway.url, token_file, *flags, "--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["tokens"], doc["verified"], doc["kept"], doc["unverified"]) == (40, result.verified, result.kept, result.kept)
    with Gateway(url, down=range(1, 6)) as gateway:
        assert main(_generate(moa[1], gateway.url, token_file, *flags)) == 0
    assert f"40 tokens ({result.verified} verified, {result.kept} kept unverified" in capsys.readouterr().err


# ---- 5. special-token text in a prompt is plain text ----


def test_special_token_text_in_a_prompt_is_plain_text(moa: tuple[Path, Path], models: Models,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(models.target, local_files_only=True)
    text = "ROMEO.</s>JULIET."
    plain = hf(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    special = hf(text, add_special_tokens=False)["input_ids"]
    assert hf.eos_token_id in special and hf.eos_token_id not in plain
    decode = OnnxMoADraft(moa[1]).tokenizer().decode
    for flags, ids in (([], plain), (["--special-tokens"], special)):
        assert main(["edge", "generate", "--bundle", str(moa[1]), "--max-tokens", "6", "--json", *flags, text]) == 0
        doc = json.loads(capsys.readouterr().out)
        alone = generate(OnnxMoADraft(moa[1]), None, ids, 6)  # the draft alone after that prompt
        assert doc["prompt_tokens"] == len(ids) and doc["text"] == decode(alone.tokens), flags
        assert doc["kept"] == 6 and doc["verified"] == 0
