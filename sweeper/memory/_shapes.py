"""Model shapes: what the memory model needs to know of a model's architecture (:class:`ModelShape`, read from its
config), and the shapes of the common 7-8B models by name (:data:`KNOWN_SHAPES`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeper.checkpoint import read_config


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """What memory depends on in a Llama-style decoder's config.

    Attributes:
        hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
        vocab_size: As in ``config.json`` (``head_dim`` defaults to hidden_size / num_attention_heads).
        tie_word_embeddings: lm_head shares the embedding matrix.
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """From a ``config.json`` mapping (a multimodal config's ``text_config`` is used when present).

        Raises:
            ValueError: Not a mapping, a required field missing or not a positive integer, or a mixture-of-experts
                model (the dense formulas would under-count its experts).
        """
        if not isinstance(config, Mapping):
            raise ValueError("config.json is not a JSON object")
        c = config.get("text_config") or config
        for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
            value = c.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"config.json: {key} is {value!r}; it must be a positive integer")
        for key in ("num_local_experts", "num_experts", "n_routed_experts"):
            if isinstance(c.get(key), int) and c[key] > 1:
                raise ValueError(
                    f"config.json: {key}={c[key]}: a mixture-of-experts model, which the memory model "
                    "(dense Llama-style layers) does not cover"
                )
        heads = int(c["num_attention_heads"])
        return cls(
            hidden_size=int(c["hidden_size"]),
            intermediate_size=int(c["intermediate_size"]),
            num_hidden_layers=int(c["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or int(c["hidden_size"]) // heads),
            vocab_size=int(c["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", c.get("tie_word_embeddings", False))),
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelShape:
        """From ``PATH/config.json`` (weights are not needed; :func:`sweeper.checkpoint.read_config`)."""
        return cls.from_config(read_config(path))

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """``(in_features, out_features)`` of each projection of one decoder layer."""
        h, q, kv, i = (
            self.hidden_size,
            self.num_attention_heads * self.head_dim,
            self.num_key_value_heads * self.head_dim,
            self.intermediate_size,
        )
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }


#: Llama-3 and 3.1 8B (``meta-llama/Llama-3.1-8B``'s ``config.json``; ``benchmarks/gpu/llama-3.1-8b-config.json``).
_LLAMA3_8B: dict[str, Any] = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}
#: Mistral-7B v0.3: Llama-3-8B's layers with a 32,768-token vocabulary (its ``config.json``).
_MISTRAL_7B = {**_LLAMA3_8B, "vocab_size": 32768}


#: Qwen2.5-7B (its ``config.json``).
_QWEN25_7B = {
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}


#: Shapes of popular base models from their public ``config.json``, so that ``sweep estimate`` plans a sweep of them
#: offline, before their weights are downloaded.
KNOWN_SHAPES: dict[str, dict[str, Any]] = {
    **dict.fromkeys(
        (
            "meta-llama/Meta-Llama-3-8B",
            "meta-llama/Meta-Llama-3-8B-Instruct",
            "meta-llama/Llama-3.1-8B",
            "meta-llama/Llama-3.1-8B-Instruct",
        ),
        _LLAMA3_8B,
    ),
    **dict.fromkeys(("mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3"), _MISTRAL_7B),
    **dict.fromkeys(("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"), _QWEN25_7B),
}


def known_shape(name: str) -> dict[str, Any] | None:
    """The shape of a model in :data:`KNOWN_SHAPES`, its hub id matched without regard to case."""
    lowered = {k.lower(): v for k, v in KNOWN_SHAPES.items()}
    return lowered.get(name.lower())
