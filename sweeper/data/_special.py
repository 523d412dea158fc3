"""The special tokens of a tokenizer whose input-embedding rows are bad in the checkpoint (NaN, or beyond float16's
range): read with safetensors, no model loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sweeper.checkpoint import checkpoint_file, read_weight_map

#: Names of the input-embedding tensor in a checkpoint, by architecture family (Llama/Mistral/Qwen/Gemma; GPT-2;
#: BLOOM; InternLM; GPT-NeoX).
_EMBEDDING_SUFFIXES = (
    "embed_tokens.weight",
    "wte.weight",
    "word_embeddings.weight",
    "tok_embeddings.weight",
    "embed_in.weight",
)


@dataclass(frozen=True, kw_only=True)
class SpecialTokenRow:
    """The checkpoint's input-embedding row of a special token the trials use.

    Attributes:
        roles: ``pad``, ``eos``, ``bos`` (one token may have several, e.g. the end-of-sequence token as padding).
        token: Its text.
        id: Its id.
        max_abs: The row's largest absolute value (NaN when the row holds NaN, inf when it holds inf).
    """

    roles: tuple[str, ...]
    token: str
    id: int
    max_abs: float


def special_token_rows(model_path: str, tokenizer: Any) -> list[SpecialTokenRow] | None:
    """The input-embedding rows of the special tokens the trials use (``pad``, ``eos``, ``bos`` of the tokenizer that
    :func:`load_tokenizer` gives), read from the checkpoint's safetensors files without loading the model.

    Returns:
        One entry per token id, or None when the checkpoint has no safetensors weights with a known embedding name.
    """
    import math

    index = checkpoint_file(model_path, "model.safetensors.index.json")
    if index is not None:
        try:
            weight_map = read_weight_map(index)
        except (OSError, ValueError, KeyError):
            return None
    else:
        single = checkpoint_file(model_path, "model.safetensors")
        if single is None:
            return None
        weight_map = None
    roles: dict[int, list[str]] = {}
    for role in ("pad", "eos", "bos"):
        token_id = getattr(tokenizer, f"{role}_token_id", None)
        if isinstance(token_id, int) and token_id >= 0:
            roles.setdefault(token_id, []).append(role)
    if not roles:
        return []
    try:
        from safetensors import safe_open

        if weight_map is not None:
            name = next((k for s in _EMBEDDING_SUFFIXES for k in weight_map if k.endswith(s)), None)
            if name is None:
                return None
            file = checkpoint_file(model_path, weight_map[name])
        else:
            file, name = single, None
        if file is None:
            return None
        out = []
        with safe_open(str(file), framework="pt") as f:
            if name is None:
                name = next((k for s in _EMBEDDING_SUFFIXES for k in f.keys() if k.endswith(s)), None)  # noqa: SIM118
                if name is None:
                    return None
            table = f.get_slice(name)
            rows = table.get_shape()[0]
            for token_id, names in sorted(roles.items()):
                if token_id >= rows:
                    continue  # an id without a row: the audit's invalid_token_id
                row = table[token_id : token_id + 1].float()
                if bool(row.isnan().any()):
                    peak = math.nan
                elif bool(row.isinf().any()):
                    peak = math.inf
                else:
                    peak = float(row.abs().max())
                text = tokenizer.convert_ids_to_tokens(token_id)
                out.append(SpecialTokenRow(roles=tuple(names), token=str(text), id=token_id, max_abs=peak))
    except Exception:  # an unreadable or unusual checkpoint: the check is skipped, the trials will say more
        return None
    return out
