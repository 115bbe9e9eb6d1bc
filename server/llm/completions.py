"""A language model served over HTTP: OpenAI-compatible ``POST /v1/completions``, speculative
decoding inside when a draft model is loaded.

    trickle serve --llm runs/lm/base --draft runs/lm/draft-moa --tree 5x2x3 --llm-concurrency 1 --llm-queue 16
    curl -s localhost:8080/v1/completions -d '{"prompt": "ROMEO:", "max_tokens": 32, "temperature": 0}'

The target is a Hugging Face causal LM in a local folder (``save_pretrained``); the draft is a
folder of ``trickle train draft`` (MoA, EAGLE-style or independent) or any causal LM sharing the
target's vocabulary. Decoding is ``auto`` by default: each round drafts the chain length (0, plain
decoding, included) that the costs measured at load and kept current from timings say is fastest
(``edge.llm.cost``), so a draft that does not pay on this machine is left idle, and sampling is
coupled, so a seed gives the same text with any draft or none. Otherwise a chain of K tokens, of
adaptive length, or a tree (``models.lm.speculative``). Without a draft every token is one target
call (the same verify loop with a drafter that proposes nothing). At most ``concurrency``
generations run at once; up to ``queue`` more wait; beyond that a request gets 503 at once, so
memory stays bounded. A prompt that leaves no room for ``max_tokens`` in the model's context gets
400 naming the limit.

Torch and transformers are imported only when a model is loaded (``trickle --help`` stays fast).
"""

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edge.core.errors import ConfigError, TrickleError


class PromptError(TrickleError):
    """A prompt the model cannot take (too long for its context, or no tokens)."""


class QueueFullError(TrickleError):
    """Every generation slot is busy and the waiting queue is full."""


@dataclass
class Completion:
    """One generated choice: its text and tokens, the token counts and what it cost."""

    text: str
    tokens: list[int]
    prompt_tokens: int
    finish_reason: Literal["length", "stop"]
    tokens_per_second: float
    accept_length: float
    target_calls: int
    speculative: bool

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class TokenScore:
    """A token, its log-probability under the target, and the target's most likely tokens there."""

    token: int
    text: str
    logprob: float | None  # None: the first prompt token (nothing before it)
    top: list[tuple[str, float]]


def _held_back(text: str, stops: list[str]) -> int:
    """Characters at the end of ``text`` that may begin a stop text (not sent until known)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


def _load_lm(path: Path, field: str) -> Any:
    if not (path / "config.json").is_file():
        raise ConfigError(field, str(path), "needs a folder with a causal LM saved by save_pretrained (config.json, weights)")
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    except (OSError, ValueError, KeyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(field, str(path), f"not a loadable causal LM ({first})") from None


def _draft_kind(folder: Path) -> str:
    """The kind a draft folder written by ``trickle train draft`` records; any other LM folder is independent."""
    manifest = folder / "draft.json"
    try:
        return str(json.loads(manifest.read_text())["kind"]) if manifest.is_file() else "independent"
    except (ValueError, KeyError) as err:
        raise ConfigError("llm_draft", str(folder), f"draft.json is unreadable ({err})") from None


class LlmService:
    """A target model, an optional draft, their tokenizer, and the admission limits."""

    def __init__(self, target: Any, tokenizer: Any, draft: Any | None = None, name: str = "trickle-lm",
                 concurrency: int = 1, queue: int = 16, drafter: Callable[[], Any] | None = None, k: int = 4,
                 adaptive: bool = False, tree: str | None = None, auto: bool = True) -> None:
        from models.lm.speculative import Tree

        self.target, self.tokenizer, self.draft, self.name = target, tokenizer, draft, name
        self.k, self.adaptive = k, adaptive
        self.auto = auto and not adaptive and not tree  # auto decoding, unless another mode is asked for
        self.cost: Any = None  # auto's DecodeCost: measured at load (or at the first generation), kept current
        self.draft_vocab: list[int] | None = None  # an independent draft's draft vocabulary (models.lm.speculative.DraftHead)
        self.tree = Tree(*(int(n) for n in tree.split("x"))) if tree else None  # DEPTHxBRANCHxWIDTH
        # a fresh Drafter per request (drafters keep per-sequence state); by default around the draft LM
        self.make_drafter = drafter
        self.concurrency, self.queue = concurrency, queue
        limits = [getattr(m.config, "max_position_embeddings", None) for m in (target, draft) if m is not None]
        self.context = min((int(n) for n in limits if n), default=None)
        self.admitted = 0  # running + waiting; touched only on the event loop
        self._slots: asyncio.Semaphore | None = None
        self._sessions: Any = None
        self._sessions_lock = threading.Lock()
        self.moa: Any = None  # the MoA draft's module, when the draft is one (its states go to devices)
        self.loaded = int(time.time())  # when the model was loaded (its card at /v1/models)

    @classmethod
    def load(cls, target_dir: Path, draft_dir: Path | None = None, concurrency: int = 1, queue: int = 16, k: int = 4,
             adaptive: bool = False, tree: str | None = None, auto: bool = True) -> "LlmService":
        import torch

        torch.set_num_threads(1)  # batch 1 on CPU: one thread per generation is faster under contention
        from transformers import AutoTokenizer

        target = _load_lm(target_dir, "llm")
        try:
            tokenizer = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
        except (OSError, ValueError, KeyError) as err:
            raise ConfigError("llm", str(target_dir), f"has no loadable tokenizer ({type(err).__name__})") from None
        decoding: dict[str, Any] = {"k": k, "adaptive": adaptive, "tree": tree, "auto": auto}
        if draft_dir is not None and _draft_kind(draft_dir) in ("moa", "eagle"):  # trickle train draft --kind moa|eagle
            from models.lm.draft import load_drafter

            reader: Any = load_drafter(draft_dir, target)
            # a fresh drafter per request around the same weights (drafters keep per-sequence caches)
            service = cls(target, tokenizer, None, target_dir.name, concurrency, queue,
                          drafter=lambda: type(reader)(reader.draft, reader.vocab), **decoding)
            if _draft_kind(draft_dir) == "moa":
                service.moa = reader.draft
            service.auto_session()  # auto decoding's costs, measured now rather than in the first request
            return service
        draft = _load_lm(draft_dir, "llm_draft") if draft_dir is not None else None
        if draft is not None and draft.config.vocab_size != target.config.vocab_size:
            raise ConfigError("llm_draft", str(draft_dir), f"vocabulary of {draft.config.vocab_size} tokens; the target's "
                              f"has {target.config.vocab_size} (a draft must share the target's tokenizer)")
        service = cls(target, tokenizer, draft, target_dir.name, concurrency, queue, **decoding)
        if draft_dir is not None and (draft_dir / "draft.json").is_file():  # trickle train draft --kind independent
            service.draft_vocab = json.loads((draft_dir / "draft.json").read_text()).get("draft_vocab")
        service.auto_session()
        return service

    def encode(self, prompt: str | list[int], max_tokens: int, special: bool = False) -> list[int]:
        """A prompt's token ids, checked against the context. Text that spells a special token
        (``</s>``) is plain text unless ``special`` (a chat template's own markers)."""
        if isinstance(prompt, str):
            ids: list[int] = self.tokenizer(prompt, split_special_tokens=not special)["input_ids"]
        else:
            ids = list(prompt)
            bad = [t for t in ids if not 0 <= t < self.vocab]
            if bad:
                raise PromptError(f"token id {bad[0]} is outside the model's vocabulary of {self.vocab}")
        if not ids:
            raise PromptError("the prompt has no tokens")
        if self.context is not None:
            if max_tokens >= self.context:
                raise PromptError(f"max_tokens {max_tokens} leaves no room for a prompt in the model's context of "
                                  f"{self.context} tokens (at most {self.context - 1})")
            if len(ids) + max_tokens > self.context:
                raise PromptError(f"prompt of {len(ids)} tokens + max_tokens {max_tokens} is over the model's context "
                                  f"of {self.context} tokens (at most {self.context - max_tokens} prompt tokens with "
                                  f"this max_tokens)")
        return ids

    @property
    def vocab(self) -> int:
        return int(self.target.config.vocab_size)

    def decode(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The messages as the model's chat template writes them, ready for the assistant's turn."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise PromptError(f"model {self.name!r} has no chat template: use /v1/completions, or add one to its "
                              "tokenizer_config.json ('chat_template'; trickle train lm writes one)")
        return str(self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    def complete(self, prompt: str | list[int], max_tokens: int = 16, temperature: float = 1.0, top_p: float = 1.0,
                 seed: int = 0, on_text: Callable[[str], None] | None = None, stop: list[str] | None = None) -> Completion:
        """Generate one choice (blocking): speculative decoding when a draft is loaded, else plain.
        The choice ends at the end-of-text token, at ``max_tokens`` or before the first ``stop``
        text; ``on_text`` gets the text as it is verified, never text a stop may still cut."""
        from models.lm.speculative import DecodeStats, speculative_generate

        ids = self.encode(prompt, max_tokens) if isinstance(prompt, str) else prompt
        eos = self.tokenizer.eos_token_id
        stops = stop or []
        tokens: list[int] = []
        text, sent, stopped = "", 0, False

        def on_tokens(block: list[int]) -> bool:
            nonlocal text, sent, stopped
            tokens.extend(block)
            text = self.decode(tokens)
            hits = [i for i in (text.find(s) for s in stops) if i >= 0]
            if hits:
                text, stopped = text[: min(hits)], True
            safe = len(text) if stopped else len(text) - _held_back(text, stops)
            if text[:safe].endswith("\ufffd"):  # a character split across tokens: wait for the rest of it
                safe = len(text[:safe].rstrip("\ufffd"))
            if on_text is not None and safe > sent:
                on_text(text[sent:safe])
                sent = safe
            return stopped

        if max_tokens > 0:
            _, stats = speculative_generate(self.target, self.drafter(), ids, max_tokens, k=self.k,
                                            temperature=temperature, top_p=top_p, seed=seed, eos_token_id=eos,
                                            on_tokens=on_tokens, tree=self.tree if self.speculative else None,
                                            adaptive=self.adaptive, auto=self.auto_session())
        else:
            stats = DecodeStats()
        if on_text is not None and len(text) > sent:
            on_text(text[sent:])
        stopped = stopped or (eos is not None and bool(tokens) and tokens[-1] == eos)
        return Completion(text, tokens, len(ids), "stop" if stopped else "length", stats.tokens_per_second,
                          stats.accept_length, stats.target_calls, self.speculative)

    def score(self, tokens: list[int], start: int, top: int) -> list[TokenScore]:
        """Each of ``tokens[start:]``: its log-probability under the target given the tokens before it
        and the ``top`` likeliest tokens there (one target forward)."""
        import torch

        with torch.no_grad():
            logits = self.target(torch.tensor([tokens])).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        out = []
        for i in range(start, len(tokens)):
            if i == 0:
                out.append(TokenScore(tokens[0], self.token_text(tokens[0]), None, []))
                continue
            row = logp[i - 1]
            best = torch.topk(row, top) if top else None
            pairs = [(self.token_text(int(t)), float(v)) for v, t in zip(best.values, best.indices)] if best else []
            out.append(TokenScore(tokens[i], self.token_text(tokens[i]), float(row[tokens[i]]), pairs))
        return out

    def token_text(self, token: int) -> str:
        return str(self.tokenizer.decode([token], skip_special_tokens=False))

    def drafter(self) -> Any:
        """A fresh Drafter for one generation (drafters keep per-sequence state)."""
        from models.lm.speculative import IndependentDrafter, NoDrafter

        if self.make_drafter is not None:
            return self.make_drafter()
        return IndependentDrafter(self.draft, self.draft_vocab) if self.draft is not None else NoDrafter()

    def auto_session(self) -> Any:
        """Auto decoding's per-generation choices (None in another mode). Without a draft every round
        decodes plainly, and sampling is coupled all the same: a seed gives the same text with a draft
        or without."""
        if not self.auto:
            return None
        from edge.llm.cost import DecodeCost
        from models.lm.speculative import calibrate

        if not self.speculative:
            return DecodeCost.prior(verify_s=1.0, draft_token_s=1.0).session(0)
        with self._sessions_lock:
            if self.cost is None:  # measured once, on this machine, then kept current by every generation
                self.cost = calibrate(self.target, self.drafter(), self.k)
        return self.cost.session(self.k)

    def sessions(self) -> Any:
        """The target's client–server verification sessions (``server.llm.verify``), made once."""
        with self._sessions_lock:  # requests run on a thread pool
            if self._sessions is None:
                from server.llm.verify import VerifySessions

                self._sessions = VerifySessions(self.target, moa=self.moa)
            return self._sessions

    @property
    def speculative(self) -> bool:
        return self.draft is not None or self.make_drafter is not None

    # admission: at most `concurrency` running, `queue` waiting, the rest refused (event loop only)
    def admit(self) -> None:
        if self.admitted >= self.concurrency + self.queue:
            raise QueueFullError(f"{self.concurrency} generations running and {self.queue} waiting: try again later")
        self.admitted += 1

    def leave(self) -> None:
        self.admitted -= 1

    @property
    def slots(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.concurrency)
        return self._slots
