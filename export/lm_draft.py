"""A MoA draft for a device: a signed lm-draft bundle of three ONNX graphs and the tokenizer, parity-checked.

    manifest = export_moa_draft(Path("runs/lm/draft-moa"), Path("runs/lm/base"), Path("drafts/moa"),
                                key=Path("keys/signing.key"))

Graphs (float32, dynamic lengths; ``edge.llm.draft.OnnxMoADraft`` runs them):

- ``moa_self_kv``: tokens (1, m), start → the Self-Attention's keys and values (1, h, m, d) of
  those tokens at positions start..;
- ``moa_cross_kv``: target states (1, m, hidden), start → the Cross-Attention's keys and values;
- ``moa_step``: tokens (1, t) at positions start.. (the last verified token, then a drafted path),
  the cached keys and values → logits (1, V') of the next token over the draft vocabulary.

The token embedding and the draft vocabulary's rows of the LM head are constants in the graphs.
Parity: the drafted logits of ``models.lm.moa.MoADrafter`` (torch) and of the ONNX graphs after a
held-out sequence, at every path length up to 6, must agree to ``PARITY_ATOL``, else ExportError
and nothing is written. The bundle (``edge.contract.manifest.LmDraftManifest``) is a folder, or a
deterministic tar when ``out`` ends in .tar; a folder replaces an earlier bundle there at once.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from edge.contract.bundle import MANIFEST, LmDraftBundle, LmDraftManifest, load_private_key, pack, write_bundle
from edge.core.errors import ExportError
from edge.llm.draft import TOKENIZER, OnnxMoADraft

PARITY_ATOL = 1e-3
OPSET = 18
Precision = Literal["fp32", "int8"]


class _RMSNorm(nn.Module):
    """nn.RMSNorm written out (the TorchScript exporter has no aten::rms_norm)."""

    def __init__(self, norm: nn.RMSNorm) -> None:
        super().__init__()
        self.weight = norm.weight
        self.eps = norm.eps if norm.eps is not None else torch.finfo(norm.weight.dtype).eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class _SelfKV(nn.Module):
    embed: torch.Tensor

    def __init__(self, moa: Any, embed: torch.Tensor) -> None:
        super().__init__()
        self.block = moa.self_attention
        self.register_buffer("embed", embed)

    def forward(self, tokens: torch.Tensor, start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = nn.functional.embedding(tokens, self.embed)
        k, v = self.block.memory(x, start + torch.arange(tokens.shape[1]))
        return k, v


class _CrossKV(nn.Module):
    def __init__(self, moa: Any) -> None:
        super().__init__()
        self.block = moa.cross_attention

    def forward(self, states: torch.Tensor, start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.block.memory(states, start + torch.arange(states.shape[1]))
        return k, v


class _Vocab(nn.Module):
    """A graph with the token embedding and the draft vocabulary's LM-head rows as constants."""

    embed: torch.Tensor
    head: torch.Tensor

    def __init__(self, embed: torch.Tensor, head: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("embed", embed)
        self.register_buffer("head", head)


class _Step(_Vocab):
    def __init__(self, moa: Any, embed: torch.Tensor, head: torch.Tensor) -> None:
        super().__init__(embed, head)
        self.self_attention, self.cross_attention = moa.self_attention, moa.cross_attention

    def forward(self, tokens: torch.Tensor, start: torch.Tensor, self_k: torch.Tensor, self_v: torch.Tensor,
                cross_k: torch.Tensor, cross_v: torch.Tensor) -> torch.Tensor:
        x = nn.functional.embedding(tokens, self.embed)
        positions = start + torch.arange(tokens.shape[1])
        k, v = self.self_attention.memory(x, positions)
        end = positions[-1:]
        h = self.self_attention.attend(x[:, -1:], torch.cat([self_k, k], 2), torch.cat([self_v, v], 2), positions=end)
        out = self.cross_attention.attend(h, cross_k, cross_v, positions=end)
        return nn.functional.linear(out[:, 0], self.head)


def _exportable(moa: Any) -> Any:
    """A float32 copy of the draft with its RMSNorms written out."""
    moa = copy.deepcopy(moa).float().eval()
    for module in list(moa.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.RMSNorm):
                setattr(module, name, _RMSNorm(child))
    return moa


def _onnx(module: nn.Module, args: tuple[torch.Tensor, ...], inputs: list[str], outputs: list[str],
          dynamic: dict[str, dict[int, str]]) -> bytes:
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        path = Path(tmp) / "graph.onnx"
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs, dynamic_axes=dynamic,
                          opset_version=OPSET, dynamo=False)
        return path.read_bytes()


def _prepare(draft_dir: Path, target_dir: Path, kind: type, what: str) -> tuple[Any, Any, Any, torch.Tensor, torch.Tensor,
                                                                            np.ndarray]:
    """(target, drafter, its float32 exportable draft, the embedding, the draft vocabulary's head
    rows, those rows' token ids) of the draft in ``draft_dir``, which must be a ``kind``."""
    from models.lm.draft import load_drafter, load_target

    torch.set_num_threads(1)
    target, _ = load_target(target_dir)
    loaded = load_drafter(draft_dir, target)
    if not isinstance(loaded, kind):
        raise ExportError(f"{draft_dir}: not {what}")
    drafter: Any = loaded
    draft = drafter.draft
    assert draft.embed is not None and draft.head is not None
    rows = drafter.head.rows if drafter.head.rows is not None else np.arange(drafter.head.size)
    with torch.no_grad():  # the embedding module's output, not its weight: some scale it (Gemma, by sqrt(hidden))
        embed = draft.embed(torch.arange(draft.embed.weight.shape[0])).float().clone()
    head = draft.head.weight.detach().float()[torch.from_numpy(rows)].clone()
    return target, drafter, _exportable(draft), embed, head, rows


def _manifest(model: str, hidden: int, heads: int, drafter: Any, rows: np.ndarray, target: Any, target_dir: Path,
              bundle_version: int) -> dict[str, Any]:
    from edge import __version__

    return {"schema_version": 1, "kind": "lm-draft", "model": model, "creator": f"trickle {__version__}",
            "bundle_version": bundle_version, "hidden": hidden, "heads": heads, "vocab_size": int(drafter.head.size),
            "vocab_rows": [int(r) for r in rows], "context": int(target.config.max_position_embeddings),
            "target": target_dir.name, "parity_max_abs_logit": 0.0}


def _verified(target: Any, drafter: Any, ids: list[int], keep_hidden: bool) -> Any:
    """The target's cache after ``ids`` (all but the last fed), the drafter prepared on it."""
    from models.lm.cache import CachedLM

    lm = CachedLM(target, keep_hidden=keep_hidden)
    lm.reset()
    lm.logits(ids, upto=len(ids) - 1)
    drafter.reset(ids)
    drafter.attach_target(lm)
    drafter.prepare(ids)
    return lm


def export_moa_draft(draft_dir: Path, target_dir: Path, out: Path, key: Path | None = None, bundle_version: int = 1,
                     parity_ids: list[int] | None = None, precision: Precision = "fp32") -> LmDraftManifest:
    """Write the device form of the MoA draft in ``draft_dir`` (for the target in ``target_dir``)
    to the bundle ``out`` (signed with ``key``); return its manifest (with the parity measured).
    ``precision`` int8: the weights quantized after the float32 parity check (``_int8``)."""
    from models.lm.moa import MoADrafter

    signer = load_private_key(key) if key is not None else None
    target, drafter, moa, embed, head, rows = _prepare(draft_dir, target_dir, MoADrafter,
                                                       "a MoA draft (trickle train draft --kind moa)")
    draft = drafter.draft
    heads, dim = moa.self_attention.heads, moa.project.out_features // moa.self_attention.heads
    graphs = {
        "self_kv": _onnx(_SelfKV(moa, embed), (torch.tensor([[1, 2, 3]]), torch.tensor(4)), ["tokens", "start"], ["k", "v"],
                         {"tokens": {1: "m"}, "k": {2: "m"}, "v": {2: "m"}}),
        "cross_kv": _onnx(_CrossKV(moa), (torch.zeros(1, 3, moa.project.out_features), torch.tensor(4)), ["states", "start"],
                          ["k", "v"], {"states": {1: "m"}, "k": {2: "m"}, "v": {2: "m"}}),
        "step": _onnx(_Step(moa, embed, head), (torch.tensor([[1, 2]]), torch.tensor(5), *(torch.zeros(1, heads, 5, dim),) * 2,
                                                *(torch.zeros(1, heads, 4, dim),) * 2),
                      ["tokens", "start", "self_k", "self_v", "cross_k", "cross_v"], ["logits"],
                      {"tokens": {1: "t"}, "self_k": {2: "n"}, "self_v": {2: "n"}, "cross_k": {2: "s"}, "cross_v": {2: "s"}}),
    }
    files = {f"moa_{name}.onnx": data for name, data in graphs.items()}
    files[TOKENIZER] = (target_dir / "tokenizer.json").read_bytes()
    doc = _manifest("moa", moa.project.out_features, heads, drafter, rows, target, target_dir, bundle_version)

    # parity: the same drafted logits from torch and from the graphs, after a verified sequence
    ids = parity_ids or list(range(1, 25))
    lm = _verified(target, drafter, ids, keep_hidden=False)
    unsigned = pack(doc, files)
    device = OnnxMoADraft(LmDraftBundle(LmDraftManifest.from_json(unsigned[MANIFEST]), files, None))
    states = draft.target_states(lm.cache, len(ids) - 1).detach().float()[0].numpy()
    device.add_states(0, states)
    doc["parity_max_abs_logit"] = _parity(drafter, device, ids)
    if precision == "int8":
        files, doc["top1_agreement"] = _int8(doc, files, device, ids, lambda d: d.add_states(0, states))
        doc["precision"] = "int8"
    return _write(doc, files, signer, out)


def _parity(drafter: Any, device: Any, ids: list[int]) -> float:
    """The largest logit difference between the torch drafter and the device's graphs, after
    ``ids`` (verified) along the torch draft's own greedy path of 6 tokens; ExportError past PARITY_ATOL."""
    worst = 0.0
    path: list[int] = []
    for _ in range(6):
        want = drafter.path_logits(ids, [path])[0]
        got = device.next_logits(ids + path)
        finite = np.isfinite(want)
        if not np.array_equal(finite, np.isfinite(got)):
            raise ExportError("the ONNX draft's vocabulary differs from the torch draft's")
        worst = max(worst, float(np.abs(want[finite] - got[finite]).max()))
        path.append(int(np.argmax(want)))
    if worst > PARITY_ATOL:
        raise ExportError(f"the ONNX draft misses parity with torch: logits differ by {worst:.2e} > {PARITY_ATOL:g}")
    return worst


def _int8(doc: dict[str, Any], files: dict[str, bytes], fp32: Any, ids: list[int], states: Any,
          steps: int = 32) -> tuple[dict[str, bytes], float]:
    """The graphs with int8 weights (onnxruntime's dynamic quantization: MatMul and Gather weights
    per tensor, activations quantized at run time), and how often their greedy token is the float32
    graphs' along ``steps`` tokens after ``ids`` (the float32 path)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized = dict(files)
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            if name.endswith(".onnx"):
                (Path(tmp) / name).write_bytes(data)
                quantize_dynamic(Path(tmp) / name, Path(tmp) / f"q-{name}", weight_type=QuantType.QInt8)
                quantized[name] = (Path(tmp) / f"q-{name}").read_bytes()
    device = type(fp32)(LmDraftBundle(LmDraftManifest.from_json(pack({**doc, "precision": "int8"}, quantized)[MANIFEST]),
                                      quantized, None))
    states(device)
    agree, path = 0, list(ids)
    for _ in range(steps):
        want = int(np.argmax(fp32.next_logits(path)))
        agree += int(np.argmax(device.next_logits(path))) == want
        path.append(want)
    return quantized, agree / steps


def _write(doc: dict[str, Any], files: dict[str, bytes], signer: Any, out: Path) -> LmDraftManifest:
    members = pack(doc, files, signer)
    if out.suffix == ".tar":
        write_bundle(members, out)
    else:  # a fresh folder beside, then swapped in: no mix of an old bundle's files and the new
        if out.exists() and not (out / MANIFEST).is_file() and any(out.iterdir()):
            raise ExportError(f"{out}: a folder that is not a bundle; choose another --out")
        fresh = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}")
        write_bundle(members, fresh)
        if out.exists():
            shutil.rmtree(out)
        fresh.rename(out)
    return LmDraftManifest.from_json(members[MANIFEST])


class _EagleBlock(_Vocab):
    def __init__(self, eagle: Any, embed: torch.Tensor, head: torch.Tensor) -> None:
        super().__init__(embed, head)
        self.fuse, self.layer = eagle.fuse, eagle.layer

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, start: torch.Tensor, past_k: torch.Tensor,
                past_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.fuse(torch.cat([features, nn.functional.embedding(tokens, self.embed)], -1))
        m = tokens.shape[1]
        positions = start + torch.arange(m)
        k, v = self.layer.memory(x, positions)
        seen = torch.cat([torch.ones(m, past_k.shape[2], dtype=torch.bool), torch.ones(m, m, dtype=torch.bool).tril()], 1)
        out = self.layer.attend(x, torch.cat([past_k, k], 2), torch.cat([past_v, v], 2), mask=seen, positions=positions)
        return k, v, out, nn.functional.linear(out[:, -1], self.head)


def export_eagle_draft(draft_dir: Path, target_dir: Path, out: Path, key: Path | None = None, bundle_version: int = 1,
                       parity_ids: list[int] | None = None, precision: Precision = "fp32") -> LmDraftManifest:
    """The EAGLE-style draft in ``draft_dir`` as an lm-draft bundle: one graph, ``eagle_block``
    (features (1, m, H) and the tokens after them (1, m) at positions start.., the cached keys
    and values → their keys and values, the predicted next features (1, m, H) and the last
    position's logits over the draft vocabulary); the device feeds the target's features of the
    verified tokens, then its own predicted features along a drafted path."""
    from edge.llm.draft import OnnxEagleDraft
    from models.lm.eagle import EagleDrafter

    signer = load_private_key(key) if key is not None else None
    target, drafter, eagle, embed, head, rows = _prepare(draft_dir, target_dir, EagleDrafter,
                                                         "an EAGLE-style draft (trickle train draft --kind eagle)")
    hidden, heads = eagle.fuse.out_features, eagle.layer.heads
    block = _onnx(_EagleBlock(eagle, embed, head),
                  (torch.zeros(1, 3, hidden), torch.tensor([[1, 2, 3]]), torch.tensor(4),
                   *(torch.zeros(1, heads, 4, hidden // heads),) * 2),
                  ["features", "tokens", "start", "past_k", "past_v"], ["k", "v", "predicted", "logits"],
                  {"features": {1: "m"}, "tokens": {1: "m"}, "past_k": {2: "n"}, "past_v": {2: "n"}, "k": {2: "m"},
                   "v": {2: "m"}, "predicted": {1: "m"}})
    files = {"eagle_block.onnx": block, TOKENIZER: (target_dir / "tokenizer.json").read_bytes()}
    doc = _manifest("eagle", hidden, heads, drafter, rows, target, target_dir, bundle_version)
    ids = parity_ids or list(range(1, 25))
    lm = _verified(target, drafter, ids, keep_hidden=True)
    unsigned = pack(doc, files)
    device = OnnxEagleDraft(LmDraftBundle(LmDraftManifest.from_json(unsigned[MANIFEST]), files, None))
    assert lm.hidden is not None
    features = lm.hidden.detach().float().numpy()
    device.add_states(0, features)
    doc["parity_max_abs_logit"] = _parity(drafter, device, ids)
    if precision == "int8":
        files, doc["top1_agreement"] = _int8(doc, files, device, ids, lambda d: d.add_states(0, features))
        doc["precision"] = "int8"
    return _write(doc, files, signer, out)


def export_lm_draft(draft_dir: Path, target_dir: Path, out: Path, key: Path | None = None,
                    bundle_version: int = 1, precision: Precision = "fp32") -> LmDraftManifest:
    """A MoA or EAGLE-style draft folder (``trickle train draft``), whichever it is, as a bundle."""
    import json

    kind = json.loads((draft_dir / "draft.json").read_text()).get("kind") if (draft_dir / "draft.json").is_file() else None
    if kind == "eagle":
        return export_eagle_draft(draft_dir, target_dir, out, key, bundle_version, precision=precision)
    if kind == "moa":
        return export_moa_draft(draft_dir, target_dir, out, key, bundle_version, precision=precision)
    raise ExportError(f"{draft_dir}: a {kind or 'independent'} draft; devices take MoA and EAGLE-style drafts "
                      "(trickle train draft --kind moa|eagle)")
