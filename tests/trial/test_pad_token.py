"""A pad token whose embedding row is bad is a data fault, not precision: the diagnosis on the step as it was trained
(padding and attention mask included), on a plain tiny Llama (no trial process: a second or two)."""

from __future__ import annotations

import math

import pytest

from sweeper.data import Sample, TokenizedSample, load_tokenizer, tokenize_samples
from sweeper.testing import PAD_ID, build_pad_token_model


@pytest.fixture(scope="module")
def pad_model(tmp_path_factory):
    return build_pad_token_model(tmp_path_factory.mktemp("pad-nan"))


def _step(tokenizer, texts: list[str], max_seq_length: int) -> list[dict]:
    """One micro-batch of chat rows, collated as a trial collates them (each row padded to the longest)."""
    from sweeper.trial._child.collate import make_collator

    samples = [
        Sample(index=10 + k, messages=({"role": "user", "content": "Say it."}, {"role": "assistant", "content": t}))
        for k, t in enumerate(texts)
    ]
    tokenized: list[TokenizedSample] = tokenize_samples(samples, tokenizer, max_seq_length)
    collate = make_collator(tokenizer.pad_token_id)
    batch = collate([{"input_ids": t.input_ids, "labels": t.labels, "index": t.index} for t in tokenized])
    return [batch]


def _diagnose(model, tokenizer, batches, compute_dtype="float32"):
    from sweeper.testing import tiny_trial_config
    from sweeper.trial._child.diagnosis import diagnose_nan
    from sweeper.trial._child.record import TrainingRecord

    config = tiny_trial_config(
        "unused", bnb_4bit_compute_dtype=compute_dtype, learning_rate=2e-4, lora_alpha_ratio=2.0, max_seq_length=32
    )
    record = TrainingRecord()
    record.step_batches = batches
    return diagnose_nan(model, config, record, failed_in="loss", tokenizer=tokenizer)


def test_nan_pad_row_is_data_naming_the_token_its_id_and_the_padded_rows(pad_model):
    import torch
    from transformers import LlamaForCausalLM

    tokenizer = load_tokenizer(str(pad_model))
    model = LlamaForCausalLM.from_pretrained(pad_model, dtype=torch.float32)
    long = "Explain every detail of the import system and the data model of Python objects. " * 3
    batches = _step(tokenizer, [long, "Hello."], 32)  # row 10 fills the 32 tokens, row 11 is padded
    with torch.no_grad():
        assert not torch.isfinite(model(**{k: batches[0][k] for k in ("input_ids", "attention_mask")}).logits).all()
    found = _diagnose(model, tokenizer, batches)
    assert found.cause == "data" and found.samples == [11], found.reason
    assert f"the pad token '<pad>' (id {PAD_ID})" in found.reason and "pads sample 11" in found.reason
    assert [r.at_fault for r in found.rows] == [False, True]
    # The row as trained: the padded row's padding is kept for the replay and left out of nan_batch.jsonl.
    padded = found.rows[1]
    assert padded.padding > 0 and len(padded.padded_ids) == 32 and PAD_ID in padded.padded_ids
    assert PAD_ID not in padded.input_ids and set(padded.to_dict()) >= {"index", "tokens_trained", "at_fault"}
    assert not {"padded_ids", "attention_mask", "padded_labels"} & set(padded.to_dict())


def test_a_row_that_fails_only_with_its_padding_is_data(pad_model, monkeypatch):
    import torch
    from transformers import LlamaForCausalLM

    from sweeper.trial._child import diagnosis

    tokenizer = load_tokenizer(str(pad_model))
    model = LlamaForCausalLM.from_pretrained(pad_model, dtype=torch.float32)
    batches = _step(tokenizer, ["Hello.", "Fine, thanks.", "Fine, thanks, and you? It was a long day here."], 32)
    # Without the static check of the embedding rows, the replay as trained still finds it: each padded row is
    # non-finite with its padding and finite without it (replayed alone and unpadded, as before, both were finite);
    # the longest row of the micro-batch has no padding and is finite.
    monkeypatch.setattr(diagnosis, "bad_embedding_rows", lambda *a, **k: {})
    rows = diagnosis.step_rows(batches, model.get_input_embeddings().num_embeddings)
    assert [row.padding > 0 for row in rows] == [True, True, False]
    for row in rows:
        assert diagnosis.replay_row(model, row, with_gradient=False)[1] is (row.padding == 0)
        assert diagnosis.replay_row(model, row, with_gradient=False, padded=False)[1] is True
    found = _diagnose(model, tokenizer, batches)
    assert found.cause == "data" and found.samples == [10, 11], found.reason
    assert "with their padding" in found.reason and f"'<pad>' (id {PAD_ID})" in found.reason


def test_embedding_rows_beyond_the_compute_dtype(pad_model):
    import torch
    from transformers import LlamaForCausalLM

    from sweeper.trial._child.special_tokens import bad_embedding_rows, token_name

    model = LlamaForCausalLM.from_pretrained(pad_model, dtype=torch.float32)
    with torch.no_grad():
        model.get_input_embeddings().weight[PAD_ID] = 1e5
        model.get_input_embeddings().weight[5] = math.inf
    assert bad_embedding_rows(model, [1, 5, PAD_ID], "float32") == {5: "inf"}
    found = bad_embedding_rows(model, [1, 5, PAD_ID], "float16")
    assert found[5] == "inf" and found[PAD_ID].startswith("beyond float16's range")
    assert bad_embedding_rows(model, [1, PAD_ID], "bfloat16") == {}
    # Without a tokenizer the model's config names the role.
    assert token_name(PAD_ID, model=model) == f"the pad token (id {PAD_ID})"
