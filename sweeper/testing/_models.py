"""Models for tests, built in-process (no hub, a few seconds): a tiny Llama (2 layers, hidden 64) with a tiny BPE
tokenizer, and the same model with an added ``<pad>`` token whose input-embedding row is bad (NaN, or a value beyond
float16's range: the pad-token case of unsloth#4104). torch and transformers are imported inside the functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Vocabulary of the tiny tokenizer; the model's embedding has exactly this many rows.
TINY_VOCAB = 512


def build_tiny_model(target: Path, *, vocab_size: int = TINY_VOCAB, added_tokens: tuple[str, ...] = ()) -> Path:
    """Save a 2-layer Llama (hidden 64, 4 heads, 2 KV heads) and a BPE tokenizer trained on pydoc's topics.

    ``added_tokens`` are added to the tokenizer after the model was built, without resizing its embedding: the
    tokenizer then makes ids the model has no row for (a real way data goes bad).
    """
    from pydoc_data.topics import topics

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    target.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(list(topics.values()), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        bos_token="<|im_start|>",
    )
    tokenizer.save_pretrained(target)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(target)
    if added_tokens:
        tokenizer.add_special_tokens({"additional_special_tokens": list(added_tokens)})
        tokenizer.save_pretrained(target)
    return target


#: Steps that outlast any trial_timeout a test sets, on any machine: a step of the tiny model costs at least a
#: millisecond of Python (the Trainer's loop, the optimizer, the probe), so this is over a quarter of an hour. A test of
#: a timeout makes its trial this long by construction, never by the machine being slow (issue 68: a 3-step trial
#: finished inside 1.5 s on a quiet machine, and CI went red).
OUTLASTS_ANY_TIMEOUT = 10**6


def tiny_trial_config(model: Path, **overrides):
    """A short trial of the tiny Llama as the tests run it (3 steps of 2 x 64 tokens, r=4, adamw_torch, a 4 GiB cap,
    32 samples), with ``overrides`` (``TrialConfig`` field names) on top."""
    from sweeper.space import DatasetSpec, ModelSpec, TrialConfig

    base = dict(
        max_steps=3,
        max_seq_length=64,
        per_device_train_batch_size=2,
        r=4,
        optim="adamw_torch",
        memory_limit_gib=4.0,
        trial_timeout_s=180.0,
        model=ModelSpec(name_or_path=str(model)),
        dataset=DatasetSpec(max_samples=32),
    )
    return TrialConfig(**{**base, **overrides})


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
    embeddings: Any = model.get_input_embeddings()
    with torch.no_grad():
        embeddings.weight[tokenizer.pad_token_id] = value
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
