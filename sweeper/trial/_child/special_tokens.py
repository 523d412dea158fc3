"""Special tokens whose embedding rows cannot train (non-finite, or far beyond the others: a chat template's tokens
added without training them), named by their role for the NaN diagnosis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

#: Special-token roles read from a tokenizer (or the model's config), to name a token in a reason.
SPECIAL_ROLES = ("pad", "eos", "bos", "unk")


def bad_embedding_rows(model: Any, ids: Sequence[int], compute_dtype: str) -> dict[int, str]:
    """The ids among ``ids`` whose input-embedding row cannot be computed with: NaN, infinite, or beyond the compute
    dtype's largest finite value (the input of the first 4-bit layer is cast to it).

    Returns:
        ``{id: what}``, ``what`` one of ``nan``, ``inf`` or ``beyond float16's range (largest |value| 7.0e+04)``.
    """
    import torch

    weight = model.get_input_embeddings().weight
    wanted = sorted({i for i in ids if 0 <= i < weight.shape[0]})
    if not wanted:
        return {}
    with torch.no_grad():
        rows = weight[torch.tensor(wanted, device=weight.device)].float()
    limit = torch.finfo(getattr(torch, compute_dtype)).max if compute_dtype != "float32" else math.inf
    out = {}
    for token, row in zip(wanted, rows):
        if bool(torch.isnan(row).any()):
            out[token] = "nan"
        elif bool(torch.isinf(row).any()):
            out[token] = "inf"
        elif float(row.abs().max()) > limit:
            out[token] = f"beyond {compute_dtype}'s range (largest |value| {float(row.abs().max()):.1e})"
    return out


def token_name(token: int, tokenizer: Any = None, model: Any = None) -> str:
    """``the pad token '<pad>' (id 512)``: the token's special roles and text from the tokenizer, or its roles from
    the model's config without one, or ``token '<x>' (id 7)``."""
    roles: list[str] = []
    text = None
    for role in SPECIAL_ROLES:
        owner = tokenizer if tokenizer is not None else getattr(model, "config", None)
        if owner is not None and getattr(owner, f"{role}_token_id", None) == token and role not in roles:
            roles.append(role)
    if tokenizer is not None:
        try:
            text = tokenizer.convert_ids_to_tokens(token)
        except Exception:
            text = None
    what = f"the {'/'.join(roles)} token" if roles else "token"
    return f"{what} '{text}' (id {token})" if text else f"{what} (id {token})"
