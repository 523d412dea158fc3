"""The tiny Llama with an added ``<pad>`` token whose input-embedding row is bad (NaN, or a value beyond float16's
range): the pad-token case of unsloth#4104, built in-process."""

from __future__ import annotations

from pathlib import Path

from tiny import TINY_VOCAB, build_tiny_model

#: The id of the added ``<pad>`` token: one past the tiny tokenizer's vocabulary.
PAD_ID = TINY_VOCAB


def build_pad_token_model(target: Path, value: float = float("nan")) -> Path:
    """The tiny Llama whose tokenizer pads with an added ``<pad>`` (id :data:`PAD_ID`), the model resized for it, and
    that token's embedding row set to ``value``."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    build_tiny_model(target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    tokenizer.add_special_tokens({"pad_token": "<pad>"})
    model = LlamaForCausalLM.from_pretrained(target)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    with torch.no_grad():
        model.get_input_embeddings().weight[tokenizer.pad_token_id] = value
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    assert tokenizer.pad_token_id == PAD_ID
    return target


def long_reply_rows(n: int, short: int) -> list[dict]:
    """``n`` prompt/completion rows whose replies fill a 32-token row (no padding at ``max_seq_length`` 32), except
    row ``short``, a short exchange that the collator pads."""
    long = "Explain every detail of the import system and the data model of Python objects. " * 3
    rows = [{"prompt": f"Explain {k}.", "completion": long} for k in range(n)]
    rows[short] = {"prompt": "Hi", "completion": "Hello."}
    return rows
