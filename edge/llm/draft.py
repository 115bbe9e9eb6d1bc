"""The MoA draft on a device: a signed lm-draft bundle run on onnxruntime, no torch (``export.lm_draft`` writes it).

    draft = OnnxMoADraft(Path("drafts/moa"), trust=["keys/signing.pub"])  # a folder or .tar bundle
    draft.add_states(0, states)                          # (m, hidden) target states from the server
    logits = draft.next_logits(tokens)                   # (V,) for edge.llm.generate
    draft.tokenizer().encode("ROMEO.").ids               # the tokenizer travels in the bundle

The bundle (``edge.contract.bundle.read_lm_draft``: manifest ``kind`` "lm-draft", every file hashed, the
manifest signed) holds three ONNX graphs (``moa_self_kv``, ``moa_cross_kv``, ``moa_step``) and
``tokenizer.json``. The Mixture-of-Attentions draft splits across the link: the Layer
Self-Attention over the target's per-layer keys/values runs on the server, which holds them, and
the server sends each verified token's projected state (``hidden`` int8 numbers and a float16
scale on the wire); the device keeps the Cross-Attention's keys/values of those states and the
Self-Attention's keys/values of the tokens, and drafts with one step graph per token. Tokens past
the last state (the target's last verified token, then the drafted ones) see every state, as in
training (T-step bounded masking); when the link is down the draft goes on from the states it has.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from edge.contract.bundle import LmDraftBundle, read_lm_draft
from edge.core.errors import BundleError
from edge.llm.generate import Draft

GRAPHS = ("self_kv", "cross_kv", "step")
TOKENIZER = "tokenizer.json"


def _session(model: bytes, name: str) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1  # batch 1, one token at a time: one thread is fastest under contention
    try:
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own exception types for a bad model
        raise BundleError(f"onnxruntime cannot load {name}: {err}") from None


class _OnnxDraft(Draft):
    """An lm-draft bundle's graphs on onnxruntime (a path, checked against ``trust`` when keys are
    given, or a loaded bundle); an ``edge.llm.generate.Draft`` that reads target states
    (``wants_states``; ``state_kind`` says which the server sends)."""

    wants_states = True
    model = ""
    files: tuple[str, ...] = ()

    def __init__(self, bundle: str | os.PathLike[str] | LmDraftBundle,
                 trust: Sequence[str | os.PathLike[str]] = ()) -> None:
        self.bundle = bundle if isinstance(bundle, LmDraftBundle) else read_lm_draft(bundle, trust)
        doc = self.manifest = self.bundle.manifest
        if doc.model != self.model:
            raise BundleError(f"a {doc.model} draft bundle, not a {self.model} one (edge.llm.draft.load_lm_draft picks)")
        self.hidden, self.heads, self.vocab_size = doc.hidden, doc.heads, doc.vocab_size
        self.rows = np.array(doc.vocab_rows, dtype=np.int64)
        missing = [name for name in (*self.files, TOKENIZER) if name not in self.bundle.files]
        if missing:
            raise BundleError(f"lm-draft bundle without {', '.join(missing)}")
        self.graphs = {name.removesuffix(".onnx").removeprefix(f"{self.model}_"): _session(self.bundle.files[name], name)
                       for name in self.files}
        self.reset()

    @abstractmethod
    def reset(self) -> None:
        """Forget the sequence and the states held (a new generation)."""

    def tokenizer(self, special_tokens: bool = False) -> Any:
        """The target's tokenizer (``tokenizers.Tokenizer``, no torch), from the bundle. Text that
        spells a special token (``</s>``) is encoded as the plain text it is, unless
        ``special_tokens``: then it is that token (a prompt cannot end the text by accident)."""
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_str(self.bundle.files[TOKENIZER].decode())
        tokenizer.encode_special_tokens = not special_tokens
        return tokenizer

    def _full(self, z: np.ndarray) -> np.ndarray:
        """(V,) logits over the target's vocabulary from the draft vocabulary's: -inf elsewhere."""
        out = np.full(self.vocab_size, -np.inf)
        out[self.rows] = z
        return out


def load_lm_draft(path: str | os.PathLike[str], trust: Sequence[str | os.PathLike[str]] = ()) -> OnnxMoADraft | OnnxEagleDraft:
    """The device draft an lm-draft bundle holds, MoA or EAGLE-style."""
    bundle = read_lm_draft(path, trust)
    return OnnxEagleDraft(bundle) if bundle.manifest.model == "eagle" else OnnxMoADraft(bundle)


class OnnxMoADraft(_OnnxDraft):
    """The MoA draft: the server sends each verified token's projected Layer Self-Attention state."""

    model = "moa"
    files = tuple(f"moa_{g}.onnx" for g in GRAPHS)

    def reset(self) -> None:
        dim = self.hidden // self.heads
        self.held = 0
        self.cross = (np.zeros((1, self.heads, 0, dim), np.float32), np.zeros((1, self.heads, 0, dim), np.float32))
        self.fed: list[int] = []
        self.self_kv = (np.zeros((1, self.heads, 0, dim), np.float32), np.zeros((1, self.heads, 0, dim), np.float32))

    @property
    def states_held(self) -> int:
        return self.held

    def add_states(self, start: int, states: np.ndarray) -> None:
        """Target states of tokens start.. (m, hidden); those already held are skipped."""
        if start > self.held:
            raise BundleError(f"target states from token {start}, but only {self.held} are held")
        new = states[self.held - start :]
        if not len(new):
            return
        k, v = self.graphs["cross_kv"].run(None, {"states": new[None].astype(np.float32),
                                                   "start": np.array(self.held, dtype=np.int64)})
        self.cross = (np.concatenate([self.cross[0], k], 2), np.concatenate([self.cross[1], v], 2))
        self.held += len(new)

    def next_logits(self, tokens: list[int]) -> np.ndarray:
        """(V,) logits after ``tokens``: -inf outside the draft vocabulary."""
        base = max(min(self.held, len(tokens) - 1), 0)  # tokens[:base] have target states
        common = 0
        for a, b in zip(self.fed, tokens[:base]):
            if a != b:
                break
            common += 1
        self.self_kv = (self.self_kv[0][:, :, :common], self.self_kv[1][:, :, :common])
        if base > common:  # the Self-Attention's keys/values of tokens[common:base]
            k, v = self.graphs["self_kv"].run(None, {"tokens": np.array([tokens[common:base]], dtype=np.int64),
                                                     "start": np.array(common, dtype=np.int64)})
            self.self_kv = (np.concatenate([self.self_kv[0], k], 2), np.concatenate([self.self_kv[1], v], 2))
        self.fed = tokens[:base]
        cross = self.cross
        if cross[0].shape[2] == 0:  # no state yet (a one-token prompt): the zero state stands in
            k, v = self.graphs["cross_kv"].run(None, {"states": np.zeros((1, 1, self.hidden), np.float32),
                                                      "start": np.array(0, dtype=np.int64)})
            cross = (k, v)
        (z,) = self.graphs["step"].run(None, {"tokens": np.array([tokens[base:]], dtype=np.int64),
                                              "start": np.array(base, dtype=np.int64), "self_k": self.self_kv[0],
                                              "self_v": self.self_kv[1], "cross_k": cross[0], "cross_v": cross[1]})
        return self._full(z[0])


class OnnxEagleDraft(_OnnxDraft):
    """The EAGLE-style draft (one layer on [feature ; next token's embedding]): the server sends
    the target's last hidden state ("feature") of each verified token (``state_kind``
    "features"). Position j takes [f_j ; e(x_{j+1})] and predicts f_{j+1}, whose logits give
    x_{j+2}: positions with a target feature are cached once; past them the draft feeds its own
    predicted features, one step per drafted token (the steps of the path drafted last are kept,
    so drafting K tokens costs K steps)."""

    model = "eagle"
    state_kind = "features"
    files = ("eagle_block.onnx",)

    def reset(self) -> None:
        dim = self.hidden // self.heads
        self.features = np.zeros((0, self.hidden), np.float32)
        self.kv = (np.zeros((1, self.heads, 0, dim), np.float32), np.zeros((1, self.heads, 0, dim), np.float32))
        self.fed: list[int] = []  # tokens x_1..x_E after the cached positions 0..E-1
        self.root: tuple[np.ndarray, np.ndarray] | None = None  # (predicted feature, logits) after position E-1
        self.path: list[int] = []  # the last path drafted past the cached positions, and each step's outputs
        self.steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # (k, v, predicted, logits)

    @property
    def states_held(self) -> int:
        return len(self.features)

    def add_states(self, start: int, states: np.ndarray) -> None:
        """Target features of tokens start.. (m, hidden); those already held are skipped."""
        if start > len(self.features):
            raise BundleError(f"target features from token {start}, but only {len(self.features)} are held")
        new = np.asarray(states, np.float32)[len(self.features) - start :]
        if len(new):
            self.features = np.concatenate([self.features, new])

    def _block(self, features: np.ndarray, tokens: list[int], start: int, k: np.ndarray, v: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        out = self.graphs["block"].run(None, {"features": features[None].astype(np.float32),
                                              "tokens": np.array([tokens], dtype=np.int64),
                                              "start": np.array(start, dtype=np.int64), "past_k": k, "past_v": v})
        return out[0], out[1], out[2][0], out[3][0]

    def next_logits(self, tokens: list[int]) -> np.ndarray:
        """(V,) logits after ``tokens``: -inf outside the draft vocabulary (all -inf for one token:
        nothing to stand on)."""
        if len(tokens) < 2:
            return np.full(self.vocab_size, -np.inf)
        base = min(len(self.features), len(tokens) - 1)  # positions 0..base-1 take the target's features
        common = 0
        for a, b in zip(self.fed, tokens[1 : base + 1]):
            if a != b:
                break
            common += 1
        if common < len(self.fed) or base > len(self.fed):  # the cached positions change: crop, then extend
            start = max(min(common, base - 1), 0)  # at least the last position again: its output is the root
            self.kv = (self.kv[0][:, :, :start], self.kv[1][:, :, :start])
            self.fed, self.path, self.steps, self.root = self.fed[:start], [], [], None
            if base > start:
                k, v, predicted, logits = self._block(self.features[start:base], tokens[start + 1 : base + 1], start,
                                                      *self.kv)
                self.kv = (np.concatenate([self.kv[0], k], 2), np.concatenate([self.kv[1], v], 2))
                self.fed = tokens[1 : base + 1]
                self.root = (predicted[-1], logits)
        if base == 0:  # no feature yet: position 0 stands on a zero feature
            root_feature, root_logits = np.zeros(self.hidden, np.float32), None
        else:
            assert self.root is not None
            root_feature, root_logits = self.root
        path = tokens[base + 1 :]  # drafted past the cached positions, at positions base..
        keep = 0
        for a, b in zip(self.path, path):
            if a != b:
                break
            keep += 1
        self.path, self.steps = path[:keep], self.steps[:keep]
        for i in range(keep, len(path)):
            feature = root_feature if i == 0 else self.steps[i - 1][2]
            k = np.concatenate([self.kv[0], *(s[0] for s in self.steps)], 2)
            v = np.concatenate([self.kv[1], *(s[1] for s in self.steps)], 2)
            sk, sv, predicted, logits = self._block(feature[None], [path[i]], base + i, k, v)
            self.steps.append((sk, sv, predicted[-1], logits))
            self.path.append(path[i])
        z = self.steps[-1][3] if path else root_logits
        assert z is not None
        return self._full(z)
