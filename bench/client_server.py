"""Client–server speculative decoding benchmark: the draft on the device, the target on the server,
through an emulated link (``bench.netem``), all methods in the same run, same target and prompts.

    trickle bench client-server [--quick]

The server is ``trickle serve --llm runs/lm/base --draft runs/lm/draft-moa`` in its own process
(with its embedded MQTT broker); the device side runs here, one thread. Methods:

- **MoA client–server**: the MoA draft's bundle (``export.lm_draft``, onnxruntime) with
  ``edge.llm.generate`` (adaptive K), states from the server, over HTTP and over MQTT (through the
  server's embedded broker); and its int8 form (``--draft-precision int8``) over HTTP;
- **EAGLE-style client–server**: the EAGLE-style draft's bundle (``runs/lm/draft-eagle``), fed the
  target's last hidden states of the verified tokens by the server, over HTTP;
- **independent client–server**: the independent draft (``runs/lm/draft-independent``, run by
  transformers here, as no ONNX form of it exists yet) with the same loop over HTTP;
- **API only**: the server generates everything (``/v1/completions``, its own MoA drafting inside);
- **auto (moa)**: the MoA client in auto mode (``edge.llm.generate``: each round drafting or asking
  the server for the rest as one block, from what it measured of the link; its estimates are
  kept across the prompts of one link, as a device keeps them);
- **draft only**: the MoA draft alone, no server.

Links: round trips 0, 20, 100 and 300 ms at 50 Mbit/s, and 100 ms at 1 Mbit/s. Quality after a
disconnection: the link drops after the first round and each draft writes 64 tokens alone; the
target's mean negative log-likelihood of them (lower: closer to what the target would write).
Throughput with 1, 2, 4 and 8 clients at once (MoA over HTTP, no emulated delay), and how many
rounds each batched target forward verified (the server's /metrics). Fleet capacity with 1..32
devices, speculative against API only with continuous batching: a co-simulation on measured
costs (``bench.llm_fleet``, which says what is measured and what modelled).
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from bench.netem import NetemProxy
from edge.core.errors import ConfigError
from edge.core.files import data_root, write_atomic
from edge.core.tables import markdown_table
from edge.llm.generate import Draft

RESULTS = Path(__file__).parent / "results"
DOCS = Path(__file__).parent.parent / "docs" / "results"
RUNS = Path("runs") / "lm"
LINKS = [(0.0, 50e6), (0.02, 50e6), (0.1, 50e6), (0.3, 50e6), (0.1, 1e6)]
CLIENTS = (1, 2, 4, 8)
K_MAX = 12
OFFLINE_TOKENS = 64
FLEET = (1, 2, 4, 8, 16, 32)  # devices at once in the fleet-capacity co-simulation (bench.llm_fleet)
FLEET_RTT_S = 0.02
SLO_S = 0.1  # p95 time per output token a device is served within (10 tokens/s, set before measuring)
GOALS = {
    "auto_tokens_per_s_ratio_vs_best_fixed_min": (">=", 0.95),
    "fleet_devices_at_slo_ratio_sd_vs_api_only": (">=", 2.0),
    "server_forwards_per_token_sd": ("<=", 0.3),
    "moa_cs_speedup_vs_independent_cs_rtt100": (">=", 1.3),
    "moa_cs_server_calls_per_token_rtt100": ("<=", 0.3),
    "moa_cs_bytes_per_token": ("<=", 2048.0),
    "disconnected_target_nll_gain_vs_independent": (">", 0.0),
    "server_throughput_ratio_8_clients_vs_1": (">=", 3.0),
}


class IndependentDraft(Draft):
    """The independent draft as an ``edge.llm.generate.Draft`` (transformers, incremental cache)."""

    def __init__(self, folder: Path, target: Any) -> None:
        from models.lm.draft import load_drafter

        self.drafter: Any = load_drafter(folder, target)

    def reset(self) -> None:
        self.drafter.reset([])

    def next_logits(self, tokens: list[int]) -> np.ndarray:
        return np.asarray(self.drafter.path_logits(tokens, [[]])[0])


def _serve(state: Path, target: Path, draft: Path) -> tuple[subprocess.Popen[bytes], str, str, int]:
    from server.ports import free_port

    port, mqtt = free_port(), free_port()
    log = (state / "serve.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "trickle.cli", "serve", "--state-dir", str(state), "--port", str(port),
                             "--mqtt-port", str(mqtt), "--llm", str(target), "--draft", str(draft), "--llm-open"], stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ConfigError("server", url, f"exited: {(state / 'serve.log').read_text()[-500:]}")
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    admin = {"Authorization": f"Bearer {(state / 'admin.token').read_text().strip()}"}
    token = httpx.post(url + "/v1/devices", json={"device": "bench"}, headers=admin).json()["token"]
    return proc, url, token, mqtt


def _cs(draft: Any, port: int, token: str, prompts: list[list[int]], new: int, rtt: float, bps: float,
        mqtt: bool = False, auto: bool = False) -> dict[str, Any]:
    from edge.llm.generate import HttpVerifyLink, LinkEstimates, MqttVerifyLink, VerifyLink, generate

    tokens = calls = 0
    seconds = 0.0
    with NetemProxy("127.0.0.1", port, rtt_s=rtt, bandwidth_bps=bps) as proxy:
        address = f"mqtt://127.0.0.1:{proxy.port}"
        link: VerifyLink = MqttVerifyLink.connect(address, "default", "bench", token, timeout_s=30) if mqtt \
            else HttpVerifyLink(proxy.url, token, timeout_s=30)
        estimates = LinkEstimates()  # auto: what the device learns of this link, kept across its generations
        for i, prompt in enumerate(prompts):
            result = generate(draft, link, prompt, new, k=K_MAX, adaptive=True, session=f"b{time.monotonic_ns()}-{i}",
                              auto=auto, estimates=estimates)
            tokens, calls, seconds = tokens + len(result.tokens), calls + result.server_calls, seconds + result.seconds
        link.close()
        down = proxy.bytes_down
    return {"tokens_per_second": tokens / seconds, "server_calls_per_token": calls / tokens, "bytes_per_token": down / tokens}


def _api(url: str, tok: Any, prompts: list[list[int]], new: int, rtt: float, bps: float) -> dict[str, Any]:
    port = int(url.rsplit(":", 1)[1])
    tokens, seconds = 0, 0.0
    with NetemProxy("127.0.0.1", port, rtt_s=rtt, bandwidth_bps=bps) as proxy, httpx.Client(timeout=60) as client:
        for prompt in prompts:
            t0 = time.perf_counter()
            r = client.post(proxy.url + "/v1/completions",
                            json={"prompt": tok.decode(prompt), "max_tokens": new, "temperature": 0})
            seconds += time.perf_counter() - t0
            tokens += r.json()["usage"]["completion_tokens"]
        down = proxy.bytes_down
    return {"tokens_per_second": tokens / seconds, "server_calls_per_token": 1 / new, "bytes_per_token": down / tokens}


def _offline_nll(target: Any, draft: Any, url: str, token: str, prompts: list[list[int]]) -> float:
    """Mean target NLL per token of OFFLINE_TOKENS drafted alone after one verified round."""
    from edge.llm.generate import HttpVerifyLink, generate

    port = int(url.rsplit(":", 1)[1])
    nll, count = 0.0, 0
    for i, prompt in enumerate(prompts):
        with NetemProxy("127.0.0.1", port) as proxy:
            def cut(block: list[int], verified: bool, proxy: NetemProxy = proxy) -> None:
                proxy.down = True
                proxy.drop()

            result = generate(draft, HttpVerifyLink(proxy.url, token, timeout_s=2), prompt, OFFLINE_TOKENS + 8, k=4,
                              retry_s=3600, session=f"n{time.monotonic_ns()}-{i}", on_tokens=cut)
        ids = torch.tensor([prompt + result.tokens])
        with torch.inference_mode():
            logp = target(input_ids=ids).logits[0, :-1].double().log_softmax(-1)
        start = len(prompt) + result.verified  # the offline tokens
        picked = logp[torch.arange(start - 1, ids.shape[1] - 1), ids[0, start:]]
        nll, count = nll - float(picked.sum()), count + len(picked)
    return nll / count


def _verify_counts(url: str) -> tuple[float, float]:
    """(rounds verified, target forwards) so far, from the server's /metrics."""
    text = httpx.get(url + "/metrics", timeout=10).text
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line.startswith(("trickle_llm_verify_rounds ", "trickle_llm_verify_forwards "))}
    return values.get("trickle_llm_verify_rounds", 0.0), values.get("trickle_llm_verify_forwards", 0.0)


def _throughput(draft_dir: Path, url: str, token: str, prompts: list[list[int]], new: int, clients: int) -> float:
    """Tokens/s of ``clients`` devices generating at once (threads here; each its own draft)."""
    from edge.llm.draft import OnnxMoADraft
    from edge.llm.generate import HttpVerifyLink, generate

    drafts = [OnnxMoADraft(draft_dir) for _ in range(clients)]
    done: list[int] = []

    def client(d: Any, i: int) -> None:
        link = HttpVerifyLink(url, token, timeout_s=60)
        done.append(len(generate(d, link, prompts[i % len(prompts)], new, k=K_MAX, adaptive=True,
                                 session=f"t{clients}-{i}").tokens))

    threads = [threading.Thread(target=client, args=(d, i)) for i, d in enumerate(drafts)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def _fleet(target: Any, moa_dir: Path, onnx_moa: Any, prompts: list[list[int]], new: int, quick: bool) -> dict[str, Any]:
    """The fleet-capacity co-simulation (``bench.llm_fleet``): which parts are measured here and
    which are modelled is said there. Two cost tables for the server's forwards: as built
    (``batched_logits``, copying each session's cache into the batch every round) and the forward
    alone (a persistent batched cache)."""
    from bench import llm_fleet
    from models.lm.draft import load_drafter

    context = len(prompts[0]) + new // 2
    rows = (1, 2, 4) if quick else llm_fleet.ROWS
    tables = {"as built": llm_fleet.measure_forward_costs(target, context, rows=rows, prompt_tokens=len(prompts[0])),
              "forward only": llm_fleet.measure_forward_only(target, context, rows=rows, prompt_tokens=len(prompts[0]))}
    traces = llm_fleet.record_traces(target, load_drafter(moa_dir, target), prompts, new, K_MAX)
    onnx_moa.reset()  # a drafted token's time on the device: the MoA bundle under onnxruntime
    history = prompts[0][:]
    t0 = time.perf_counter()
    for _ in range(32):
        history.append(int(np.argmax(onnx_moa.next_logits(history))))
    draft_token_s = (time.perf_counter() - t0) / 32
    fleet = (1, 2, 4) if quick else FLEET
    out: dict[str, Any] = {"draft_token_s": draft_token_s, "rtt_ms": FLEET_RTT_S * 1e3, "slo_s": SLO_S,
                           "costs": {name: c.as_dict() for name, c in tables.items()}, "rows": {},
                           "mean_run_length": float(np.mean([np.mean(t) for t in traces]))}
    for name, costs in tables.items():
        got = [llm_fleet.simulate(policy, n, traces, costs, FLEET_RTT_S, draft_token_s, new=new, k_max=K_MAX)
               for policy in ("api", "sd") for n in fleet]
        for r in got:
            print(f"fleet ({name}) {r['policy']:3s} {r['devices']:2d} devices: {r['tokens_per_second']:7.1f} tok/s, "
                  f"p95 {1e3 * r['p95_time_per_token_s']:6.1f} ms/token, {r['server_rows_per_token']:.2f} rows/token",
                  flush=True)
        at_slo = {p: llm_fleet.devices_at_slo(got, p, SLO_S) for p in ("api", "sd")}
        out["rows"][name] = got
        out[name] = {"devices_at_slo": at_slo, "ratio": llm_fleet.ratio(at_slo["sd"], at_slo["api"])}
    return out


def main(quick: bool = False, results_dir: Path = RESULTS, docs_dir: Path = DOCS, corpus: Path | None = None) -> dict[str, Any]:
    from bench.speculative import _prompts
    from edge.llm.draft import OnnxEagleDraft, OnnxMoADraft
    from export.lm_draft import export_eagle_draft, export_moa_draft
    from models.lm.draft import load_target

    torch.set_num_threads(1)
    corpus = corpus or data_root() / "shakespeare" / "plays"
    target_dir, moa_dir, indep_dir = RUNS / "base", RUNS / "draft-moa", RUNS / "draft-independent"
    eagle_dir = RUNS / "draft-eagle"
    for folder in (target_dir, moa_dir, eagle_dir, indep_dir):
        if not folder.is_dir():
            raise ConfigError("model", str(folder), "train it first (trickle train lm / trickle train draft; see the README)")
    n_prompts, new = (2, 24) if quick else (4, 64)
    links = LINKS[2:3] if quick else LINKS
    target, tok = load_target(target_dir)
    prompts = _prompts(tok, corpus, n_prompts, 64)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        export_moa_draft(moa_dir, target_dir, Path(tmp) / "moa")
        int8 = export_moa_draft(moa_dir, target_dir, Path(tmp) / "moa-int8", precision="int8")
        export_eagle_draft(eagle_dir, target_dir, Path(tmp) / "eagle")
        moa, eagle = OnnxMoADraft(Path(tmp) / "moa"), OnnxEagleDraft(Path(tmp) / "eagle")
        moa8 = OnnxMoADraft(Path(tmp) / "moa-int8")
        indep = IndependentDraft(indep_dir, target)
        (Path(tmp) / "state").mkdir()
        proc, url, token, mqtt_port = _serve(Path(tmp) / "state", target_dir, moa_dir)
        port = int(url.rsplit(":", 1)[1])
        try:
            for rtt, bps in links:
                for method, draft in (("moa client-server", moa), ("moa client-server (int8)", moa8),
                                      ("moa client-server (mqtt)", moa),
                                      ("eagle client-server", eagle), ("independent client-server", indep),
                                      ("api only", None), ("auto (moa)", moa)):
                    figures = _api(url, tok, prompts, new, rtt, bps) if draft is None else \
                        _cs(draft, mqtt_port if "mqtt" in method else port, token, prompts, new, rtt, bps,
                            mqtt="mqtt" in method, auto=method.startswith("auto"))
                    rows.append({"method": method, "rtt_ms": rtt * 1e3, "mbit_s": bps / 1e6, **figures})
                    print(f"{method:28s} rtt {rtt * 1e3:5.0f} ms {bps / 1e6:4.0f} Mbit/s  "
                          f"{rows[-1]['tokens_per_second']:6.1f} tok/s", flush=True)
            from edge.llm.generate import generate

            t0 = time.perf_counter()
            alone = sum(len(generate(moa, None, p, new).tokens) for p in prompts)
            rows.append({"method": "draft only (moa)", "rtt_ms": None, "mbit_s": None,
                         "tokens_per_second": alone / (time.perf_counter() - t0), "server_calls_per_token": 0.0,
                         "bytes_per_token": 0.0})
            nll = {"moa": _offline_nll(target, moa, url, token, prompts),
                   "eagle": _offline_nll(target, eagle, url, token, prompts),
                   "independent": _offline_nll(target, indep, url, token, prompts)}
            fleet = _fleet(target, moa_dir, moa, prompts, new, quick)
            throughput, per_forward = {}, {}
            for clients in CLIENTS:
                before = _verify_counts(url)
                throughput[clients] = _throughput(Path(tmp) / "moa", url, token, prompts, new, clients)
                after = _verify_counts(url)
                per_forward[clients] = (after[0] - before[0]) / max(after[1] - before[1], 1.0)
                print(f"{clients} clients: {throughput[clients]:6.1f} tok/s, {per_forward[clients]:.2f} rounds per target "
                      "forward", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    at = {(r["method"], r["rtt_ms"], r["mbit_s"]): r for r in rows}
    moa100, ind100 = at[("moa client-server", 100.0, 50.0)], at[("independent client-server", 100.0, 50.0)]
    one = next(r for r in fleet["rows"]["as built"] if r["policy"] == "sd" and r["devices"] == 1)
    auto_ratio = {f"{rtt * 1e3:g} ms {bps / 1e6:g} Mbit/s": at[("auto (moa)", rtt * 1e3, bps / 1e6)]["tokens_per_second"]
                  / max(at[(m, rtt * 1e3, bps / 1e6)]["tokens_per_second"] for m in ("api only", "moa client-server"))
                  for rtt, bps in links}
    out: dict[str, Any] = {
        "auto_tokens_per_s_ratio_vs_best_fixed_min": min(auto_ratio.values()),
        # int8 draft on the device: tokens/s against the float32 draft, same link (verification keeps the text exact)
        "moa_int8_tokens_per_s_ratio_vs_fp32": {
            f"{rtt * 1e3:g} ms {bps / 1e6:g} Mbit/s": at[("moa client-server (int8)", rtt * 1e3, bps / 1e6)]["tokens_per_second"]
            / at[("moa client-server", rtt * 1e3, bps / 1e6)]["tokens_per_second"] for rtt, bps in links},
        "moa_int8_top1_agreement": int8.top1_agreement,
        "auto_tokens_per_s_ratio_vs_best_fixed": auto_ratio,
        "fleet_devices_at_slo_ratio_sd_vs_api_only": fleet["as built"]["ratio"],
        "fleet_devices_at_slo_ratio_sd_vs_api_only_forward_only": fleet["forward only"]["ratio"],
        "server_forwards_per_token_sd": one["server_rows_per_token"],
        "fleet": fleet,
        "moa_cs_speedup_vs_independent_cs_rtt100": moa100["tokens_per_second"] / ind100["tokens_per_second"],
        "moa_cs_server_calls_per_token_rtt100": moa100["server_calls_per_token"],
        "moa_cs_bytes_per_token": moa100["bytes_per_token"],
        "disconnected_target_nll_gain_vs_independent": nll["independent"] - nll["moa"],
        "server_throughput_ratio_8_clients_vs_1": throughput[8] / throughput[1],
        "disconnected_target_nll": nll, "throughput_tokens_per_second": throughput,
        "rounds_per_target_forward": per_forward, "rows": rows,
        "settings": {"prompts": n_prompts, "new_tokens": new, "k_max_adaptive": K_MAX, "offline_tokens": OFFLINE_TOKENS},
        "missing": [],
        "goals": {k: f"{op} {g:g}" for k, (op, g) in GOALS.items()}, "quick": quick,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
    table = markdown_table(["method", "RTT ms", "Mbit/s", "tokens/s", "server calls / token", "bytes / token (down)"],
                           [(r["method"], "—" if r["rtt_ms"] is None else f"{r['rtt_ms']:.0f}",
                             "—" if r["mbit_s"] is None else f"{r['mbit_s']:g}", f"{r['tokens_per_second']:.1f}",
                             f"{r['server_calls_per_token']:.2f}", f"{r['bytes_per_token']:.0f}") for r in rows],
                           align="lrrrrr")
    print(table)
    verdicts = []
    for key, (op, goal) in GOALS.items():
        ok = {">=": out[key] >= goal, "<=": out[key] <= goal, ">": out[key] > goal}[op]
        verdicts.append(f"| `{key}` | {out[key]:.3f} | {op} {goal:g} | {'met' if ok else 'not met'} |")
        print(f"{key:45s} {out[key]:10.3f}  {'✔' if ok else '✘'} (goal {op} {goal:g})")
    suffix = "-quick" if quick else ""
    write_atomic(results_dir / f"client_server{suffix}.json", json.dumps(out, indent=1, sort_keys=True) + "\n")
    plot = _plot(rows, throughput, per_forward, docs_dir / f"client_server{suffix}.png")
    scaling = ", ".join(f"{c} → {throughput[c]:.1f} tok/s ({per_forward[c]:.2f} rounds per forward)" for c in throughput)
    title = "# Client–server speculative decoding (`trickle bench client-server`)\n\n"
    write_atomic(docs_dir / f"client_server{suffix}.md", title +
                 f"{n_prompts} held-out prompts, {new} new tokens each, greedy; the device side in one thread, the server "
                 "in its own process; links emulated by `bench/netem.py` (for MQTT, between the device and the server's "
                 "embedded broker). Offline quality: mean target NLL per token of "
                 f"{OFFLINE_TOKENS} tokens drafted alone after a disconnection: MoA {nll['moa']:.3f}, EAGLE-style "
                 f"{nll['eagle']:.3f}, independent {nll['independent']:.3f}. Throughput with clients at once "
                 "(verification batched across sessions): "
                 f"{scaling}.\n\n![tokens/s against round-trip time, and throughput against clients]({plot.name})\n\n"
                 + table + "\n\n| key | measured | goal | |\n| --- | ---: | --- | --- |\n" + "\n".join(verdicts) + "\n\n"
                 + _fleet_section(fleet, _plot_fleet(fleet, docs_dir / f"client_server-fleet{suffix}.png")))
    print(f"wrote {results_dir / f'client_server{suffix}.json'}")
    return out


def _fleet_section(fleet: dict[str, Any], plot: Path) -> str:
    rows = [(name, r["policy"], r["devices"], f"{r['tokens_per_second']:.1f}", f"{1e3 * r['p95_time_per_token_s']:.1f}",
             f"{r['server_rows_per_token']:.2f}", f"{r['server_forwards_per_token']:.3f}", f"{r['server_busy_share']:.2f}")
            for name, got in fleet["rows"].items() for r in got]
    served = "; ".join(f"{name}: API only {fleet[name]['devices_at_slo']['api']}, speculative "
                       f"{fleet[name]['devices_at_slo']['sd']}" for name in fleet["rows"])
    return ("## Fleet capacity (co-simulation, `bench/llm_fleet.py`)\n\n"
            f"N devices against one server at {fleet['rtt_ms']:.0f} ms RTT, each making two requests back to back; "
            "speculative: the MoA draft on the device (a drafted token "
            f"{1e3 * fleet['draft_token_s']:.2f} ms, measured with onnxruntime), the server verifying every waiting round "
            "in one forward; API only: the server decoding every running request in one forward per step (continuous "
            "batching). Measured: the server's forwards (two cost tables: as built, `batched_logits` copying each "
            "session's cache into the batch every round, and the target's forward alone on a persistent batched "
            "cache), the draft's agreement with the target at every position (mean run "
            f"{fleet['mean_run_length']:.2f} tokens), the drafted token's time. Modelled: the link, queueing, the "
            f"device's choice of K. Devices served within p95 {1e3 * fleet['slo_s']:.0f} ms per token: {served}.\n\n"
            f"![p95 time per token against devices]({plot.name})\n\n"
            + markdown_table(["server forwards", "policy", "devices", "tokens/s", "p95 ms / token", "rows / token",
                              "forwards / token", "server busy"], rows, align="llrrrrrr") + "\n")


def _plot_fleet(fleet: dict[str, Any], path: Path) -> Path:
    """p95 time per token and aggregate tokens/s against devices, per policy and cost table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, got in fleet["rows"].items():
        for policy, label in (("api", "API only"), ("sd", "speculative")):
            mine = sorted((r for r in got if r["policy"] == policy), key=lambda r: r["devices"])
            style = "-" if name == "as built" else "--"
            n = [r["devices"] for r in mine]
            a.plot(n, [1e3 * r["p95_time_per_token_s"] for r in mine], style, marker="o", label=f"{label} ({name})")
            b.plot(n, [r["tokens_per_second"] for r in mine], style, marker="o", label=f"{label} ({name})")
    a.axhline(1e3 * fleet["slo_s"], color="grey", linestyle=":", label="SLO")
    a.set(xscale="log", yscale="log", xlabel="devices", ylabel="p95 ms per token", title="Latency")
    b.set(xscale="log", xlabel="devices", ylabel="tokens / s (all devices)", title="Throughput")
    a.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot(rows: list[dict[str, Any]], throughput: dict[int, float], per_forward: dict[int, float], path: Path) -> Path:
    """Tokens/s against round-trip time per method (50 Mbit/s), server calls per token at 100 ms,
    and throughput against clients."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.2))
    methods = list(dict.fromkeys(r["method"] for r in rows if r["rtt_ms"] is not None))
    for method in methods:
        points = sorted((r["rtt_ms"], r["tokens_per_second"]) for r in rows if r["method"] == method and r["mbit_s"] == 50.0)
        a.plot(*zip(*points), marker="o", label=method)
    for r in rows:
        if r["rtt_ms"] is None:
            a.axhline(r["tokens_per_second"], color="grey", linestyle="--", label=r["method"])
    a.set(xlabel="round-trip time, ms (50 Mbit/s)", ylabel="tokens / s", title="Speed over the link")
    a.legend(fontsize=8)
    at100 = [r for r in rows if r["rtt_ms"] == 100.0 and r["mbit_s"] == 50.0]
    b.barh([r["method"] for r in at100], [r["server_calls_per_token"] for r in at100], color="tab:orange")
    b.set(xlabel="server calls per token (100 ms, 50 Mbit/s)", title="Round trips")
    clients = sorted(throughput)
    c.plot(clients, [throughput[n] for n in clients], marker="o", label="tokens / s (all clients)")
    c.set(xlabel="clients at once", ylabel="tokens / s", title="Batched verification", xticks=clients)
    twin = c.twinx()
    twin.plot(clients, [per_forward[n] for n in clients], marker="s", color="tab:green", label="rounds per target forward")
    twin.set_ylabel("rounds per target forward")
    c.legend(loc="upper left", fontsize=8)
    twin.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
