"""``trickle edge`` (``infer``: one-off inference; ``run``: the device agent) and ``trickle keygen``.

Light at import (onnxruntime, paho, httpx and the bundle code load only when a verb runs), so
``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from edge.classify.backends import BACKENDS
from edge.core.errors import ConfigError, DataError

if TYPE_CHECKING:
    from edge.classify.runtime import Runtime
    from edge.contract.bundle import Bundle
    from edge.llm.generate import Generation, TextChange, VerifyLink

RUN_HELP = """Run the device agent: read SOURCE, infer with the bundle, publish results and telemetry.

    trickle edge run --bundle bundles/digits.tar --server http://127.0.0.1:8080 \\
        --broker mqtt://127.0.0.1:1883 --device-id node-1 --token-file node-1.token --source samples.npz
    trickle edge run --config node-1.toml --set period_s=0.5 --json

Every message is written to an on-disk queue (STATE_DIR/outbox.sqlite) before it is sent and
deleted when the server acknowledges storing it, so a kill -9, a broker restart or a server
restart loses nothing; the server drops repeats by idempotency key. OTA bundles announced by the
server are verified (signature with --trust, hashes, newer version), switched to atomically,
self-tested on the test vectors they carry (older bundles: on the first samples of the source),
and rolled back if the self-test fails. SOURCE: an .npz with 'x' (raw samples) and optionally
'y' (labels), or a folder of .npy/.csv/.txt/.wav files.

Options: defaults < the --config file (TOML, keys are the fields of edge.agent.agent.AgentConfig:
device, token_file (or token), server, broker, state_dir, fleet, bundle, source, period_s, count,
telemetry_every, trusted_keys, backend, exit_when_done, max_in_flight, resend_s) < the flags
given < --set FIELD=VALUE items (the value in TOML syntax)."""


INFER_HELP = """Classify raw input files with a bundle, on this machine.

    trickle edge infer bundles/digits.tar sample.npy
    trickle edge infer bundles/fsdd.tar 7_jackson_12.wav --backend litert --trust keys/signing.pub
    trickle edge infer bundles/digits.tar x.npy --voltage-v 2.4 --capacitance-f 0.01 --v-cut-v 2.0
    trickle edge infer bundles/digits.tar --self-test

INPUT files hold one raw example each, as the sensor gives it (the manifest's raw shape):
.npy, .csv/.txt (numbers), or .wav for audio bundles; the bundle's pre-processing turns it into
the model's input. --features skips pre-processing (the input is already the model's input).
The variant is the most accurate one, --variant NAME, or DynInfer's choice for the energy that
--voltage-v/--capacitance-f leave above --v-cut-v, priced for --mcu. --backend executorch loads
the export tier's backend (it needs torch; see edge/classify/backends.py); the others run without.
--self-test runs every variant on the test vectors the bundle carries and compares them with the
outputs recorded at export, as a device does before it switches to a new bundle.
--early (a bundle with an early-decision rule, export.early): each INPUT is a whole series,
(channels, T) or (T,) in .npy/.csv/.txt; it is streamed sample by sample and the decision is
printed with the number of samples the rule took before it stopped.

    trickle edge infer bundles/gestures-early series.npy --early"""


GENERATE_HELP = """Generate text with a draft on this machine, verified by the server's language model.

    trickle edge generate --bundle drafts/moa --server http://127.0.0.1:8080 --token-file m1.token $'ROMEO.\\n'
    trickle edge generate --bundle drafts/moa --broker mqtt://127.0.0.1:1883 --device m1 --token-file m1.token $'ROMEO.\\n'
    trickle edge generate --bundle drafts/moa --server URL --token-file F --temperature 0.8 --seed 3 "prompt"
    trickle edge generate --bundle drafts/moa "prompt"                # no server: the draft alone

The bundle is a MoA or EAGLE-style draft's device form (trickle export DRAFT --target T: signed,
ONNX graphs and the tokenizer; no torch here); with --trust it must be signed by that key. Each round drafts K
tokens and sends them for verification, over HTTP (POST /v1/llm/verify, --server) or MQTT (the
device's verify/verified topics, --broker), with the device's token, and prints what the target
keeps as it is kept: greedy output is the target's own, sampling is distributed as the target's.
--auto asks the server for the rest as one block (its own decoding, batched with other devices')
whenever that is faster than drafting.

When the server cannot be reached (no connection, a timeout, HTTP 5xx) the draft goes on alone;
that text is unverified and is not printed (--show-draft prints it, dim on a terminal, else inside
[draft: ...]). When the link returns it is re-verified: --on-divergence correct (the default)
replaces it from the first token the target disagrees with (with --show-draft a notice says so);
keep keeps it (printed then, dim on a terminal: unverified) and verification goes on from it. Text
the server never saw again stays unprinted (unchecked). A server that lost the session (restarted) is sent the history again. A
request the server refuses (a draft it cannot serve, an unknown token, the target's context
exceeded) ends the command with the server's reason and exit status 1. Special-token text in the
prompt (</s>) is plain text unless --special-tokens. The summary (stderr, or --json) counts
verified, kept and unchecked tokens and gives tokens/s, server calls and where the text diverged."""


def add_edge_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True,
                           help="infer, run or generate (see trickle edge ACTION --help)")
    gen = sub.add_parser("generate", help="generate text with a local draft, verified by the server's LM",
                         description=GENERATE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    gen.add_argument("prompt", help="the text to continue")
    gen.add_argument("--bundle", "--draft", dest="bundle", type=Path, required=True,
                     help="a MoA or EAGLE-style draft bundle, folder or .tar (trickle export DRAFT --target T)")
    gen.add_argument("--trust", type=Path, action="append", default=[], metavar="PUBKEY",
                     help="trusted public key file; with one, the bundle must be signed by a trusted key")
    gen.add_argument("--server", help="server URL, http(s)://HOST:PORT: verify over HTTP")
    gen.add_argument("--broker", help="MQTT broker URL, mqtt://HOST:PORT: verify over MQTT (with --device)")
    gen.add_argument("--device", help="this device's id, as registered on the server (with --broker)")
    gen.add_argument("--fleet", default="default", help="the device's fleet (with --broker; default 'default')")
    gen.add_argument("--token-file", type=Path, help="file holding the device's token (with --server or --broker)")
    gen.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default 64)")
    gen.add_argument("--k", type=int, default=4, help="draft tokens per round (the most, with --adaptive; default 4)")
    gen.add_argument("--adaptive", action="store_true", help="choose each round's K from the round time and acceptance")
    gen.add_argument("--auto", action="store_true",
                     help="each round, draft (adaptive K) or ask the server to decode the rest itself, whichever the "
                          "measured round trip, server speed and acceptance say is faster (a first block measures them)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1)")
    gen.add_argument("--seed", type=int, default=0, help="seeds sampling (default 0)")
    gen.add_argument("--timeout-s", type=float, default=5.0, help="per request, before going on offline (default 5)")
    gen.add_argument("--retry-s", type=float, default=1.0,
                     help="after a failed request, draft at least K tokens alone and wait this long before trying "
                          "the server again (default 1)")
    gen.add_argument("--on-divergence", choices=["correct", "keep"], default="correct",
                     help="text drafted offline that the target disagrees with: replace it (default) or keep it, unverified")
    gen.add_argument("--show-draft", action="store_true",
                     help="also print unverified text drafted offline, marked: dim on a terminal, else [draft: ...]; "
                          "a notice says where the target replaced it (--json: its unchecked rest as draft_text)")
    gen.add_argument("--special-tokens", action="store_true",
                     help="read special-token text in the prompt (</s>) as those tokens (default: as plain text)")
    gen.add_argument("--json", action="store_true",
                     help="print one JSON object (the settled text and figures) instead of streaming")
    infer = sub.add_parser("infer", help="classify input files with a bundle", description=INFER_HELP,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    infer.add_argument("bundle", type=Path, help="bundle folder or .tar")
    infer.add_argument("inputs", type=Path, nargs="*", metavar="INPUT", help="raw example files (.npy, .csv, .txt, .wav)")
    infer.add_argument("--backend", choices=list(BACKENDS), default="onnxruntime", help="inference engine (default onnxruntime)")
    infer.add_argument("--variant", help="run this variant (see the manifest) instead of choosing one")
    infer.add_argument("--voltage-v", type=float, help="capacitor voltage now, V: DynInfer picks what it affords")
    infer.add_argument("--capacitance-f", type=float, default=0.01, help="storage capacitance, F (default 0.01)")
    infer.add_argument("--v-cut-v", type=float, default=2.0, help="voltage at which the MCU browns out, V (default 2.0)")
    infer.add_argument("--mcu", default="msp430fr5994",
                       help="MCU profile whose energy costs DynInfer uses (default msp430fr5994; the bundle lists its MCUs)")
    infer.add_argument("--self-test", action="store_true",
                       help="run every variant on the bundle's own test vectors against the outputs recorded at export")
    infer.add_argument("--trust", type=Path, action="append", default=[], metavar="PUBKEY",
                       help="trusted public key file; with one, the bundle must be signed by a trusted key")
    infer.add_argument("--features", action="store_true", help="inputs are already pre-processed model inputs")
    infer.add_argument("--early", action="store_true",
                       help="stream each input series sample by sample and stop when the bundle's rule says so")
    infer.add_argument("--json", action="store_true", help="print one JSON object per input instead of a table")
    agent = sub.add_parser("run", help="the device agent: infer on a source, report over MQTT, take OTA",
                           description=RUN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    # no defaults here (None: not given), so a --config file's values are not overridden; the
    # defaults are AgentConfig's, named in each help text
    agent.add_argument("--config", type=Path, metavar="FILE", help="TOML file whose keys are the agent's config fields")
    agent.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                       help="set one config field, the value in TOML syntax (repeatable; overrides the file and the flags)")
    agent.add_argument("--device-id", help="this device's id, as registered on the server (required here or in --config)")
    agent.add_argument("--token-file", type=Path,
                       help="file holding the device's token, from registration (required here or in --config)")
    agent.add_argument("--fleet", help="the device's fleet (default 'default')")
    agent.add_argument("--server", help="server URL, http(s)://HOST:PORT, for bundle downloads (required here or in --config)")
    agent.add_argument("--broker", help="MQTT broker URL, mqtt://HOST:PORT or mqtts://HOST:PORT over TLS (required "
                                        "here or in --config)")
    agent.add_argument("--ca-file", type=Path, metavar="PEM",
                       help="CA certificates to trust for an https:// server and an mqtts:// broker (default: the system's)")
    agent.add_argument("--client-cert", type=Path, metavar="PEM",
                       help="this device's certificate, for a broker or server that asks for one (mutual TLS)")
    agent.add_argument("--client-key", type=Path, metavar="PEM", help="the private key of --client-cert")
    agent.add_argument("--bundle", type=Path, help="the bundle to start with (needed on first run)")
    agent.add_argument("--source", type=Path, help=".npz of raw samples ('x', optional 'y') or a folder of input files")
    agent.add_argument("--state-dir", type=Path, help="state folder (default runs/edge/DEVICE)")
    agent.add_argument("--period-s", type=float, help="seconds between samples (default 0: as fast as possible)")
    agent.add_argument("--count", type=int, help="take only the first N samples (default: all)")
    agent.add_argument("--trust", type=Path, action="append", metavar="PUBKEY",
                       help="trusted public key; with one, every bundle must be signed by a trusted key (repeatable)")
    agent.add_argument("--backend", choices=list(BACKENDS), help="inference engine (default onnxruntime)")
    agent.add_argument("--exit-when-done", action="store_true", default=None,
                       help="exit once the source is reported and acknowledged (default: keep serving OTA)")
    agent.add_argument("--recover-outbox", action="store_true", default=None,
                       help="save a damaged or missing outbox aside (STATE_DIR/outbox.sqlite.damaged-TIME) and start a new "
                            "one with the messages and cursor that can still be read from it")
    agent.add_argument("--json", action="store_true", help="print the start-up line and the summary as one JSON object each")


def run_edge(args: argparse.Namespace) -> int:
    """Run a bundle on this machine: ``trickle edge infer`` (one-off inference, or a self-test on the
    bundle's test vectors) and ``trickle edge run`` (the device agent: infer on a sensor source,
    report to the server over MQTT, take OTA updates). See trickle edge ACTION --help."""
    if args.action == "generate":
        return run_generate(args)
    return run_agent(args) if args.action == "run" else infer(args)


def run_generate(args: argparse.Namespace) -> int:
    import os
    import sys

    from edge.llm.draft import load_lm_draft
    from edge.llm.generate import VerifyRefusedError, generate

    if args.max_tokens < 1 or args.k < 1:
        raise ConfigError("--max-tokens/--k", (args.max_tokens, args.k), "must be >= 1")
    if args.retry_s < 0:
        raise ConfigError("--retry-s", args.retry_s, "must be >= 0")
    token = _check_generate_link(args)  # a bad flag or token file is refused before the bundle or the network
    draft = load_lm_draft(args.bundle, trust=args.trust)
    tokenizer = draft.tokenizer(special_tokens=args.special_tokens)
    prompt = tokenizer.encode(args.prompt).ids
    if not prompt:
        raise ConfigError("prompt", args.prompt, "has no tokens")
    link = _generate_link(args, token)
    styled = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    out = None if args.json else TextOut(tokenizer.decode, sys.stdout, args.show_draft, styled, link is not None)
    try:
        result = generate(draft, link, prompt, args.max_tokens, k=args.k, temperature=args.temperature, top_p=args.top_p,
                          seed=args.seed, retry_s=args.retry_s, adaptive=args.adaptive, on_divergence=args.on_divergence,
                          on_text=out, auto=args.auto)
    except VerifyRefusedError as err:
        if out is not None:
            out.finish(unchecked="not verified: the server refused the request")
        if err.status in (401, 403) and args.token_file is not None:
            raise VerifyRefusedError(err.status, f"{err.detail} (the token in {args.token_file})") from None
        raise
    finally:
        if link is not None:
            link.close()
    summary = {"text": tokenizer.decode(result.settled_tokens), "prompt_tokens": len(prompt), "tokens": len(result.tokens),
               "verified": result.verified, "unverified": result.unverified, "kept": result.kept,
               "unchecked": result.unchecked, "offline_tokens": result.offline_tokens, "server_calls": result.server_calls,
               "divergences": result.divergences, "tokens_per_second": round(result.tokens_per_second, 2)}
    if args.json:
        if args.show_draft:
            summary["draft_text"] = tokenizer.decode(result.tokens[len(result.settled_tokens):])
        print(json.dumps(summary))
        return 0
    assert out is not None
    out.finish(unchecked="not verified: the server could not be reached again" if result.unchecked else None)
    print(_generate_summary(result, link is not None, args.show_draft), file=sys.stderr)
    return 0


def _check_generate_link(args: argparse.Namespace) -> str | None:
    """The device's token from --token-file (None without one), the link's flags checked."""
    if args.server is not None and args.broker is not None:
        raise ConfigError("--server/--broker", (args.server, args.broker), "give one: verify over HTTP or over MQTT")
    if (args.server is not None or args.broker is not None) and args.token_file is None:
        raise ConfigError("--token-file", None, "needed with --server or --broker (the device's token from registration)")
    if args.broker is not None and args.device is None:
        raise ConfigError("--device", None, "needed with --broker (the device id the token belongs to)")
    return None if args.token_file is None else read_token(args.token_file)


def read_token(path: Path) -> str:
    """The device's token in ``path``: one line of printable ASCII without spaces (what registration
    hands out), surrounding whitespace ignored. An empty file, or one that is not a token, is a
    ConfigError naming the file: sent to the server it would be refused, or not even sent."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        raise ConfigError("--token-file", str(path), "no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError("--token-file", str(path), f"cannot be read ({getattr(err, 'strerror', None) or err})") from None
    if not token:
        raise ConfigError("--token-file", str(path), "is empty: it must hold the device's token (from registration)")
    if not (token.isascii() and token.isprintable()) or any(c.isspace() for c in token) or len(token) > 512:
        raise ConfigError("--token-file", str(path), "does not hold a token: one line of at most 512 printable ASCII "
                          "characters without spaces (the device's token, from registration)")
    return token


def _generate_link(args: argparse.Namespace, token: str | None) -> VerifyLink | None:
    """The way to the server's verification that the flags name (None: the draft alone)."""
    from edge.llm.generate import HttpVerifyLink, MqttVerifyLink

    if token is None:
        return None
    if args.server is not None:
        return HttpVerifyLink(args.server, token, timeout_s=args.timeout_s)
    if args.broker is not None:
        return MqttVerifyLink.connect(args.broker, args.fleet, args.device, token, timeout_s=args.timeout_s)
    return None


def _generate_summary(result: Generation, verifying: bool, show_draft: bool) -> str:
    """The one line ``edge generate`` ends with (stderr): what of the text is verified."""
    timing = f"in {result.seconds:.2f} s, {result.server_calls} server calls"
    if not verifying:
        return f"{len(result.tokens)} tokens by the draft alone (no server, none verified) {timing}"
    parts = [f"{result.verified} verified"]
    if result.kept:
        parts.append(f"{result.kept} kept unverified where the target disagreed")
    if result.unchecked:
        parts.append(f"{result.unchecked} drafted offline and unchecked (the server could not be reached again; "
                     + ("shown as draft)" if show_draft else "not printed: --show-draft prints them)"))
    diverged = f"; diverged at {result.divergences}" if result.divergences else ""
    return f"{len(result.tokens)} tokens ({', '.join(parts)}) {timing}{diverged}"


class TextOut:
    """What ``edge generate`` writes while it runs (an ``on_text`` listener): settled text as it
    settles (kept text dim on a terminal); with ``show_draft`` also pending text, marked (dim on a
    terminal, else inside ``[draft: ...]``), and a notice where the target replaced or kept it.
    Text the target throws away is never printed as if it stayed."""

    DIM, UNDIM, NOTE, UNNOTE = "\x1b[2m", "\x1b[22m", "\x1b[33m", "\x1b[39m"

    def __init__(self, decode: Callable[[list[int]], str], stream: TextIO, show_draft: bool, styled: bool,
                 verifying: bool) -> None:
        self.decode, self.stream, self.show_draft, self.styled, self.verifying = decode, stream, show_draft, styled, verifying
        self.settled: list[int] = []
        self.pending: list[int] = []
        self.screen: list[int] = []  # the tokens whose text is written, as one sequence (from the last notice on)
        self.chars = 0  # characters of the screen's text written
        self.open = False  # a [draft: ...] is open (not styled)

    def __call__(self, change: TextChange) -> None:
        kind, tokens = change.kind, change.tokens
        if kind == "verified":
            self.settled += tokens
            self._put(tokens, "settled")
        elif kind == "drafted":
            self.pending += tokens
            if self.show_draft:
                self._put(tokens, "draft")
        elif kind == "confirmed":  # already on screen with show_draft
            self.settled += tokens
            del self.pending[: len(tokens)]
            if not self.show_draft:
                self._put(tokens, "settled")
            elif not self.pending:
                self._close()
        elif kind == "discarded":
            self.pending = []
            if self.show_draft:
                self._close()
                self._notice(f"the target replaced the draft from {self._quote(tokens)}; its text follows")
                self.screen, self.chars = list(self.settled), len(self._stable(self.settled))
        elif kind == "kept":
            from_pending, self.pending = bool(self.pending), []
            self.settled += tokens
            if self.show_draft and from_pending:
                self._close()
                self._notice(f"the target disagreed from {self._quote(tokens)}; kept, unverified")
            else:
                self._put(tokens, "kept" if self.verifying else "settled")

    def finish(self, unchecked: str | None) -> None:
        """The end: the rest of the text, a notice (``unchecked``: why) on pending text shown, a newline."""
        text = self.decode(self.screen)
        self._write(text[self.chars :])
        if unchecked and self.show_draft and self.pending:
            self._close()
            self._notice(unchecked)
        self._write("\n")

    def _stable(self, tokens: list[int]) -> str:
        return self.decode(tokens).rstrip("\ufffd")  # an incomplete UTF-8 character waits for its last bytes

    def _put(self, tokens: list[int], style: str) -> None:
        if style == "settled" and self.open:
            self._close()
        self.screen += tokens
        stable = self._stable(self.screen)
        text, self.chars = stable[self.chars :], len(stable)
        if style == "draft" and not self.styled and not self.open:
            text, self.open = "[draft: " + text, True
        dim = self.styled and style in ("draft", "kept")
        self._write(self.DIM + text + self.UNDIM if dim and text else text)

    def _close(self) -> None:
        if self.open:
            self._write("]")
            self.open = False

    def _notice(self, words: str) -> None:
        self._write(f"{self.NOTE}[{words}]{self.UNNOTE}" if self.styled else f"[{words}]")

    def _quote(self, tokens: list[int]) -> str:
        text = self.decode(tokens)
        return json.dumps(text[:24] + ("..." if len(text) > 24 else ""))

    def _write(self, text: str) -> None:
        if text:
            self.stream.write(text)
            self.stream.flush()


def run_agent(args: argparse.Namespace) -> int:
    import logging
    import signal

    from edge.agent.agent import Agent, AgentConfig
    from edge.core.config import load_config
    if args.token_file is not None and not args.token_file.exists():
        raise ConfigError("--token-file", str(args.token_file), "no such file")
    flags = {"device": args.device_id, "token_file": args.token_file, "fleet": args.fleet, "server": args.server,
             "broker": args.broker, "bundle": args.bundle, "source": args.source, "state_dir": args.state_dir,
             "period_s": args.period_s, "count": args.count, "trusted_keys": args.trust, "backend": args.backend,
             "exit_when_done": args.exit_when_done, "ca_file": args.ca_file, "client_cert": args.client_cert,
             "client_key": args.client_key, "recover_outbox": args.recover_outbox}
    config = load_config(AgentConfig, args.config, args.set, flags)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    agent = Agent(config)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    if args.json:
        print(json.dumps({"device": config.device, "event": "started", "bundle_version": agent.version,
                          "broker": config.broker, "state_dir": str(config.state_dir)}), flush=True)
    else:
        print(f"{config.device}: running bundle v{agent.version}, reporting to {config.broker}", flush=True)
    produced = agent.run()
    if args.json:
        print(json.dumps({"device": config.device, "event": "stopped", "results": produced,
                          "bundle_version": agent.version}), flush=True)
    else:
        print(f"{config.device}: {produced} results reported this run", flush=True)
    return 0


def infer(args: argparse.Namespace) -> int:
    import numpy as np

    from edge.classify.preprocess import read_input
    from edge.classify.runtime import Runtime
    from edge.contract.bundle import read_trusted

    if args.capacitance_f <= 0 or args.v_cut_v < 0:
        raise ConfigError("--capacitance-f/--v-cut-v", (args.capacitance_f, args.v_cut_v), "must be > 0 and >= 0")
    bundle = read_trusted(args.bundle, args.trust)
    if args.early:
        return _infer_early(bundle, args.inputs, args.json)
    rt = Runtime(bundle, backend=args.backend)
    manifest = bundle.manifest
    if args.self_test:
        return _self_test(rt, args.json)
    if not args.inputs:
        raise ConfigError("INPUT", None, "give input files to classify, or --self-test")
    variant = rt.variant(args.variant) if args.variant else rt.choose(args.voltage_v, args.capacitance_f, args.v_cut_v, args.mcu)
    rt.load(variant)
    if not args.json:
        print(f"{manifest.model} v{manifest.bundle_version}, variant {variant.name} ({rt.format_of(variant)} on "
              f"{args.backend}), {'signed by a trusted key' if bundle.signed_by else 'signature not checked'}")
    for path in args.inputs:
        raw = read_input(path, manifest.preprocessing)
        x = raw if args.features else rt.preprocess(raw)
        start = time.perf_counter()
        logits = rt.infer_features(x, variant=variant.name)[0]
        elapsed = time.perf_counter() - start
        p = np.exp(logits - logits.max())
        p /= p.sum()
        top = int(np.argmax(p))
        if args.json:
            print(json.dumps({"input": str(path), "label": manifest.labels[top], "probability": round(float(p[top]), 6),
                              "variant": variant.name, "backend": args.backend, "latency_s": elapsed,
                              "logits": [float(v) for v in logits]}))
        else:
            print(f"  {path}: {manifest.labels[top]} (p={p[top]:.3f}, {elapsed * 1e3:.2f} ms)")
    return 0


def _infer_early(bundle: Bundle, inputs: list[Path], as_json: bool) -> int:
    import numpy as np

    from edge.classify.early import early_decider

    if not inputs:
        raise ConfigError("INPUT", None, "give series files to decide on")
    decider = early_decider(bundle)
    labels = bundle.manifest.labels
    for path in inputs:
        suffix = path.suffix.lower()
        try:
            series = (np.load(path, allow_pickle=False) if suffix == ".npy"
                      else np.loadtxt(path, delimiter="," if suffix == ".csv" else None, ndmin=1))
        except (OSError, ValueError) as e:
            raise DataError(f"{path}: not a readable series ({e})") from None
        series = np.atleast_2d(np.asarray(series, dtype=np.float32))
        if series.ndim != 2 or series.shape[0] != decider.channels or not np.all(np.isfinite(series)):
            raise DataError(f"{path}: a series of shape {series.shape}; the bundle takes ({decider.channels}, T) "
                            "finite values (one row per channel)")
        d = decider.run(series)
        if as_json:
            print(json.dumps({"input": str(path), "label": labels[d.label], "samples": d.t, "horizon": decider.horizon,
                              "decided": d.stop, "stopped_early": d.stop and d.t < decider.horizon,
                              "posterior": [float(p) for p in d.posterior]}))
        elif d.stop:
            print(f"  {path}: {labels[d.label]} after {d.t} of {decider.horizon} samples (p={d.posterior.max():.3f})")
        else:
            print(f"  {path}: undecided after all {d.t} samples (leading: {labels[d.label]}, p={d.posterior.max():.3f})")
    return 0


def _self_test(rt: Runtime, as_json: bool) -> int:
    report = rt.self_test()
    if report is None:
        raise ConfigError("--self-test", str(rt.bundle.manifest.model), "the bundle carries no test vectors "
                          "(it predates them): export it again")
    if as_json:
        print(json.dumps({"passed": report.passed, "agreement": report.agreement, "max_abs_diff": report.max_abs_diff,
                          "failures": report.failures, "backend": rt.backend}))
    else:
        for name, agreement in report.agreement.items():
            print(f"  {name}: top-1 agreement {agreement:.0%}, max |diff| {report.max_abs_diff[name]:.2e}")
        print("  self-test " + ("passed" if report.passed else "FAILED: " + "; ".join(report.failures)))
    return 0 if report.passed else 1


def add_keygen_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", type=Path, help="where to write signing.key and signing.pub")
    p.add_argument("--force", action="store_true", help="overwrite an existing key pair")
    p.add_argument("--json", action="store_true", help="print the written paths as one JSON object")


def run_keygen(args: argparse.Namespace) -> int:
    """Make an Ed25519 key pair for signing bundles (trickle's key file format, see edge/contract/bundle.py).

        trickle keygen keys/            # writes keys/signing.key (mode 0600) and keys/signing.pub

    Sign bundles with `trickle export --key keys/signing.key`; give devices and the server the
    public key (`--trust keys/signing.pub`).
    """
    private, public = args.folder / "signing.key", args.folder / "signing.pub"
    if private.exists() and not args.force:
        raise ConfigError("folder", str(args.folder), f"{private} exists; pass --force to replace it "
                          "(bundles it signed will no longer verify)")
    from edge.contract.bundle import generate_keypair

    generate_keypair(private, public)
    if args.json:
        print(json.dumps({"private": str(private), "public": str(public)}))
    else:
        print(f"wrote {private} (keep it secret) and {public} (give it to devices)")
    return 0
