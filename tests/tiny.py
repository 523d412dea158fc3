"""A tiny Llama (2 layers, hidden 64) and a tiny BPE tokenizer, built in-process: no hub, a few seconds."""

from __future__ import annotations

from pathlib import Path

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
