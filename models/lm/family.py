"""What the drafts read of a target's config, whatever its family calls it.

    shape = attention_shape(target.config)    # hidden, layers, heads, kv_heads, head_dim
    shape.kv_dim                               # a token's keys and values in one layer

Families name the same numbers differently: Llama, Qwen2, Mistral, Phi-3 and Gemma say
``hidden_size``, ``num_attention_heads`` and ``num_key_value_heads`` (grouped-query attention);
GPT-2 says ``n_embd`` and ``n_head`` and has as many key/value heads as query heads; Gemma's
``head_dim`` is its own number, not ``hidden_size / num_attention_heads``. A config without a
number the drafts need (an encoder-decoder, a state-space model with no attention heads) is one
``ConfigError`` naming what it lacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edge.core.errors import ConfigError

# each number's names, the most common first
HIDDEN = ("hidden_size", "n_embd", "d_model")
LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
HEADS = ("num_attention_heads", "n_head", "num_heads")
KV_HEADS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads")  # absent: one per query head
HEAD_DIM = ("head_dim", "kv_channels")  # absent: hidden / heads
FIELD = "target model_type"  # what a ConfigError here names (the flag differs: --target, --llm)


@dataclass(frozen=True)
class AttentionShape:
    """The numbers of a decoder's self-attention that the drafts are built from."""

    model_type: str
    hidden: int  # the residual stream's width (what the last hidden state and the LM head's input have)
    layers: int
    heads: int  # query heads
    kv_heads: int  # key/value heads (fewer than heads with grouped-query attention)
    head_dim: int

    @property
    def kv_dim(self) -> int:
        """A token's keys and values in one layer, concatenated."""
        return 2 * self.kv_heads * self.head_dim


def model_type(config: Any) -> str:
    """The config's family name (``llama``, ``gpt2``, ...), for messages."""
    return str(getattr(config, "model_type", "") or type(config).__name__)


def _first(config: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _needed(config: Any, names: tuple[str, ...], why: str) -> int:
    value = _first(config, names)
    if value is None:
        raise ConfigError(FIELD, model_type(config), f"its config has no {' / '.join(names)}: {why}")
    return value


def decoder_config(config: Any) -> Any:
    """The decoder's config of a causal LM's (a multimodal model's text config); an encoder-decoder
    is a ConfigError (drafts and speculative decoding here are for decoder-only models)."""
    if getattr(config, "is_encoder_decoder", False):
        raise ConfigError(FIELD, model_type(config), "an encoder-decoder model; the target must be a decoder-only causal LM "
                          "(AutoModelForCausalLM: Llama, Qwen2, Mistral, Phi-3, Gemma, GPT-2, ...)")
    get_text = getattr(config, "get_text_config", None)
    return get_text(decoder=True) if get_text is not None else config


def attention_shape(config: Any) -> AttentionShape:
    """The attention numbers of a causal LM's config, under whichever names its family uses."""
    cfg = decoder_config(config)
    why = "the MoA draft reads the target's per-layer attention keys and values"
    hidden = _needed(cfg, HIDDEN, "the drafts read the target's hidden states")
    layers = _needed(cfg, LAYERS, why)
    heads = _needed(cfg, HEADS, why)
    kv_heads = _first(cfg, KV_HEADS) or heads
    head_dim = _first(cfg, HEAD_DIM)
    if head_dim is None:
        if hidden % heads:
            raise ConfigError(FIELD, model_type(cfg), f"no head_dim, and hidden size {hidden} is not a multiple of "
                              f"{heads} attention heads")
        head_dim = hidden // heads
    if heads % kv_heads:
        raise ConfigError(FIELD, model_type(cfg), f"{heads} attention heads are not a multiple of {kv_heads} key/value heads")
    return AttentionShape(model_type(cfg), hidden, layers, heads, kv_heads, head_dim)


def hidden_size(config: Any) -> int:
    """The width of a causal LM's last hidden state (what an EAGLE-style draft reads)."""
    return _needed(decoder_config(config), HIDDEN, "the drafts read the target's hidden states")
